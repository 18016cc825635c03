"""Every dashboard, opened in a real chromium, draws a Bokeh canvas that keeps changing, offline."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.browser.chromium import artifact, changes, chromium, wait_until_drawn
from tests.conftest import NvdashServer, nvdash_server
from tests.server.test_server import ROUTES, STATIC_ROUTES

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25"]) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@pytest.mark.parametrize("route", list(ROUTES))
def test_dashboard_renders_and_updates_in_chromium(server: NvdashServer, browser: Browser, route: str) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    try:
        page.goto(server.url + route, wait_until="load")
        page.wait_for_selector("canvas", state="attached", timeout=20_000)
        wait_until_drawn(page)
        if route not in STATIC_ROUTES:
            assert changes(page.screenshot), f"{route} did not change on screen"
        page.screenshot(path=str(artifact(f"standalone{route.replace('/', '-')}.png")))
        canvases = page.locator("canvas").count()
    finally:
        page.close()
    assert canvases >= 1
    assert errors == []
    foreign = [url for url in requests if not url.startswith(f"http://127.0.0.1:{server.port}/")]
    assert foreign == [], f"the page fetched from elsewhere: {foreign}"


def test_index_page_links_open_the_dashboards(server: NvdashServer, browser: Browser) -> None:
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    try:
        page.goto(server.url + "/", wait_until="load")
        page.screenshot(path=str(artifact("standalone-index.png")), full_page=True)
        assert page.locator("ul.apps a").count() == len(ROUTES)
        # By its link: the health column may mention "GPU memory" too (e.g. XID 48 on a simulated GPU).
        page.get_by_role("link", name="GPU Memory", exact=True).click()
        page.wait_for_url(server.url + "/GPU-Memory")
        page.wait_for_selector("canvas", state="attached", timeout=20_000)
    finally:
        page.close()
