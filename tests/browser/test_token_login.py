"""A server beyond loopback in a real chromium: the printed ``?token=`` URL, then a bookmark without the token,
renders and streams (the cookie works for the page and its websocket); a browser without it gets the form."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from tests.browser.chromium import artifact, changes, chromium, wait_until_drawn
from tests.conftest import NvdashServer, nvdash_server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25", "--host", "0.0.0.0"]) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def printed_url(server: NvdashServer) -> str:
    match = re.search(r"^nvdash: open (\S+\?token=\S+)$", server.output(), re.MULTILINE)
    assert match, server.output()
    return match.group(1)


def watch_errors(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    return errors


def assert_streams(page: Page, name: str) -> None:
    """The page draws a canvas that changes: its websocket delivers the live data."""
    page.wait_for_selector("canvas", state="attached", timeout=20_000)
    wait_until_drawn(page)
    assert changes(page.screenshot), f"{page.url} did not change on screen"
    page.screenshot(path=str(artifact(name)))


def test_the_printed_url_then_a_bookmark_without_the_token(server: NvdashServer, browser: Browser) -> None:
    url = printed_url(server)
    origin = url.split("/?token=")[0]
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        index = context.new_page()
        response = index.goto(url, wait_until="load")
        assert response is not None
        assert response.request.redirected_from is not None  # the token left the address bar at once
        assert index.url == origin + "/"
        assert index.locator("ul.apps a").count() >= 10
        assert response.headers["referrer-policy"] == "no-referrer"
        bookmark = context.new_page()
        errors = watch_errors(bookmark)
        bookmark.goto(origin + "/GPU-Utilization", wait_until="load")
        assert "token" not in bookmark.url
        assert_streams(bookmark, "token-bookmark-GPU-Utilization.png")
        assert errors == []
    finally:
        context.close()


def test_a_browser_without_the_token_pastes_it_into_the_form(server: NvdashServer, browser: Browser) -> None:
    token = printed_url(server).split("?token=")[1]
    origin = printed_url(server).split("/?token=")[0]
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        response = page.goto(origin + "/GPU-Memory", wait_until="load")
        assert response is not None
        assert response.status == 403
        assert page.locator("canvas").count() == 0
        page.screenshot(path=str(artifact("token-login-form.png")))
        page.fill("input[name=token]", "not the token")
        page.click("button[type=submit]")
        page.wait_for_load_state("load")
        assert "not the token this server was started with" in page.content()
        page.fill("input[name=token]", token)
        page.click("button[type=submit]")
        page.wait_for_url(origin + "/GPU-Memory")
        assert_streams(page, "token-login-GPU-Memory.png")
    finally:
        context.close()
