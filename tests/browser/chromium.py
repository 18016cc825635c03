"""Debian's chromium driven by Playwright (no browser download), with the flags a closed network needs."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Frame, Page, sync_playwright

from tests.conftest import wait_for

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def chromium_path() -> str:
    """The system chromium; the test command installs it, so its absence is a failure, not a skip."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    return path


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless chromium for one test module."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def artifact(name: str) -> Path:
    """Where a test saves a screenshot for people to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


def open_page(browser: Browser, url: str, width: int = 1280, height: int = 900) -> tuple[Page, list[str]]:
    """A new page on ``url``, loaded, and the list its script errors and console errors are collected in."""
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(url, wait_until="load")
    return page, errors


BOKEH_IDLE = "() => window.Bokeh !== undefined && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle"
"""True once Bokeh has drawn every root of the page's document."""


def wait_until_drawn(frame: Page | Frame, timeout_ms: int = 60_000) -> None:
    """Wait until the Bokeh document in ``frame`` (a page, or a pane's iframe) has drawn all its plots."""
    frame.wait_for_function(BOKEH_IDLE, timeout=timeout_ms)


def changes(shot: Callable[[], bytes], timeout_s: float = 30.0) -> bool:
    """Whether what ``shot`` returns (a screenshot) changes before ``timeout_s`` have passed; polled until then.

    A live dashboard redraws with each sweep, but the simulated job has data-loader stalls of a few seconds with no
    traffic, and a loaded machine may draw late: only the deadline bounds the wait.
    """
    before = shot()
    try:
        wait_for(shot, lambda now: now != before, timeout_s=timeout_s)
    except AssertionError:
        return False
    return True
