"""nvdash inside a real JupyterLab, driven in chromium as a person would use it.

The tests of the first part share one JupyterLab and one page and run in order, like a session: open the
sidebar, dock two dashboards beside a notebook (the README's screenshot), open the rest, reload, switch to
the dark theme, kill the nvdash process. Screenshots land in ``test-artifacts/jupyterlab-*.png``.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections.abc import Iterator

import pytest
from PIL import Image, ImageStat
from playwright.sync_api import Browser, Frame, Locator, Page, expect

from tests.browser.chromium import artifact, changes, chromium, wait_until_drawn
from tests.jupyter.jupyter import JupyterLab, jupyter_lab
from tests.server.test_server import JUPYTER_ROUTES as ROUTES
from tests.server.test_server import STATIC_ROUTES

pytestmark = pytest.mark.browser

SIMULATED = {"NVDASH_SIMULATE": "dgx-h100"}
EXPOSE_APP = ("--LabApp.expose_app_in_browser=True",)
VIEWPORT = {"width": 1600, "height": 900}
CANVAS_TIMEOUT_MS = 30_000
QUIET_ROUTES = STATIC_ROUTES | {"/GPU-Memory-by-Notebook"}
"""Panes with nothing moving here: no notebook of this lab holds GPU memory, so its page has no line to draw."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@pytest.fixture(scope="module")
def lab() -> Iterator[JupyterLab]:
    with jupyter_lab(env=SIMULATED, extra_args=EXPOSE_APP) as running:
        yield running


@pytest.fixture(scope="module")
def page(browser: Browser, lab: JupyterLab) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    open_lab(page, lab)
    yield page
    context.close()
    assert [error for error in errors if "nvdash" in error.lower()] == []


def open_lab(page: Page, lab: JupyterLab, path: str = "lab") -> None:
    """Load JupyterLab (logging in with the token) and wait until it has restored its layout."""
    separator = "&" if "?" in path else "?"
    page.goto(f"{lab.url}{path}{separator}token={lab.token}", wait_until="domcontentloaded", timeout=60_000)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")


def open_sidebar(page: Page) -> Locator:
    """Show the GPU Dashboards sidebar: a click on its tab, unless Lumino shows it already (a click would then
    collapse it; its class says so even while a theme's stylesheet is being swapped and nothing has a size)."""
    sidebar = page.locator("#nvdash-sidebar")
    expect(sidebar).to_have_count(1)
    if "lm-mod-hidden" in (sidebar.get_attribute("class") or "").split():
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="nvdash-sidebar"]').click()
    expect(sidebar).to_be_visible()
    return sidebar


def pane_id(route: str) -> str:
    """The pane's element id, as the extension derives it: ``nvdash-GPU-Utilization``."""
    return "nvdash" + route.replace("/", "-")


def pane(page: Page, route: str) -> Locator:
    return page.locator(f"#{pane_id(route)}")


def wait_for_canvas(page: Page, route: str) -> None:
    frame = page.frame_locator(f"#{pane_id(route)} iframe")
    frame.locator("canvas").first.wait_for(state="attached", timeout=CANVAS_TIMEOUT_MS)


def snap(target: Locator, path: str | None = None) -> bytes:
    """What ``target`` shows: the page's pixels in its box. An element screenshot would first wait for the element
    to hold still over two animation frames, which a page busy redrawing live panes may not give in time."""
    box = target.bounding_box()
    assert box is not None, "the pane is not shown"
    return target.page.screenshot(clip=box, path=path, timeout=60_000)


def pane_frame(target: Locator) -> Frame:
    """The document inside a pane's iframe."""
    handle = target.locator("iframe").element_handle(timeout=CANVAS_TIMEOUT_MS)
    frame = handle.content_frame()
    assert frame is not None, "the pane's iframe has no document"
    return frame


def keeps_changing(target: Locator) -> bool:
    """Whether what the pane ``target`` shows changes, once its dashboard has drawn (a live dashboard redraws;
    on a loaded machine a freshly loaded one may take a few seconds to draw at all)."""
    wait_until_drawn(pane_frame(target), CANVAS_TIMEOUT_MS)
    return changes(lambda: snap(target))


def brightness(target: Locator) -> float:
    """Mean grey level (0-255) of the page behind the plots: a strip along the pane's left edge."""
    image = Image.open(io.BytesIO(snap(target))).convert("L")
    strip = image.crop((0, 0, 6, image.height))
    return float(ImageStat.Stat(strip).mean[0])


def open_dashboard(page: Page, title: str) -> None:
    exact = re.compile(rf"^\s*{re.escape(title)}\s*$")  # "GPU Memory", not "GPU Memory by Notebook"
    open_sidebar(page).locator(".jp-nvdash-Sidebar-dashboard", has_text=exact).click()


def test_sidebar_lists_the_dashboards_and_gpus(page: Page) -> None:
    sidebar = open_sidebar(page)
    buttons = sidebar.locator(".jp-nvdash-Sidebar-dashboard")
    expect(buttons).to_have_count(len(ROUTES), timeout=60_000)
    assert buttons.all_inner_texts() == list(ROUTES.values())
    gpus = sidebar.locator(".jp-nvdash-Sidebar-gpus li").all_inner_texts()
    assert gpus == ["GPUs 0\u20137: NVIDIA H100 80GB HBM3"]
    expect(sidebar).to_contain_text("Simulated GPUs (profile dgx-h100)")
    sidebar.screenshot(path=str(artifact("jupyterlab-sidebar.png")))

    page.keyboard.press("Control+Shift+C")
    palette = page.locator(".lm-CommandPalette")
    palette.locator(".lm-CommandPalette-input").fill("Open GPU Utilization")
    item = palette.locator(".lm-CommandPalette-item", has_text="Open GPU Utilization")
    expect(item).to_have_count(1)
    expect(palette.locator(".lm-CommandPalette-header", has_text="GPU Dashboards")).to_have_count(1)
    page.keyboard.press("Escape")
    open_sidebar(page)


def test_two_panes_dock_beside_a_notebook(page: Page) -> None:
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: 'training.ipynb'})")
    expect(page.locator(".jp-Notebook").first).to_be_visible(timeout=30_000)
    open_dashboard(page, "GPU Utilization")
    open_dashboard(page, "GPU Resources")
    for route in ("/GPU-Utilization", "/GPU-Resources"):
        wait_for_canvas(page, route)
        expect(pane(page, route)).to_be_visible()
    notebook = page.locator(".jp-NotebookPanel").first.bounding_box()
    utilization = pane(page, "/GPU-Utilization").bounding_box()
    resources = pane(page, "/GPU-Resources").bounding_box()
    assert notebook is not None
    assert utilization is not None
    assert resources is not None
    assert utilization["x"] >= notebook["x"] + notebook["width"] - 1, "the dashboards sit right of the notebook"
    assert resources["y"] >= utilization["y"] + utilization["height"] - 1, "the second one below the first"
    assert keeps_changing(pane(page, "/GPU-Resources"))
    wait_until_drawn(pane_frame(pane(page, "/GPU-Utilization")), CANVAS_TIMEOUT_MS)
    page.screenshot(path=str(artifact("jupyterlab.png")))


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_dashboard_opens_as_a_pane_that_updates(page: Page, route: str) -> None:
    open_dashboard(page, ROUTES[route])
    target = pane(page, route)
    expect(target).to_be_visible()
    wait_for_canvas(page, route)
    frame = target.locator("iframe")
    assert frame.get_attribute("sandbox") == "allow-scripts allow-same-origin"
    assert (frame.get_attribute("src") or "").endswith(f"/nvdash{route}?theme=light")
    if route not in QUIET_ROUTES:
        assert keeps_changing(target), f"{route} did not change on screen"
    snap(target, str(artifact(f"jupyterlab-pane{route.replace('/', '-')}.png")))


def test_opening_an_open_dashboard_focuses_it(page: Page) -> None:
    panes = page.locator(".jp-nvdash-Pane")
    expect(panes).to_have_count(len(ROUTES))
    open_dashboard(page, "PCIe Throughput")
    expect(pane(page, "/PCIe-Throughput")).to_be_visible()
    open_dashboard(page, "Machine Resources")
    expect(pane(page, "/Machine-Resources")).to_be_visible()
    expect(pane(page, "/PCIe-Throughput")).to_be_hidden()
    expect(panes).to_have_count(len(ROUTES))


def test_panes_are_restored_after_a_reload(page: Page, lab: JupyterLab) -> None:
    deadline = time.monotonic() + 20
    while True:  # the layout restorer saves the workspace shortly after each change
        workspace = page.request.get(f"{lab.url}lab/api/workspaces/default").json()
        saved = [key for key in workspace["data"] if key.startswith("nvdash:")]
        if len(saved) == len(ROUTES) or time.monotonic() > deadline:
            break
        page.wait_for_timeout(250)
    assert sorted(saved) == sorted(f"nvdash:{route}" for route in ROUTES)
    page.reload(wait_until="domcontentloaded")
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")
    expect(page.locator(".jp-nvdash-Pane")).to_have_count(len(ROUTES), timeout=30_000)
    # Panes restored behind another tab open no session until they are shown.
    hidden = page.locator(".jp-nvdash-Pane.lm-mod-hidden iframe").evaluate_all(
        "(frames) => frames.map(f => f.getAttribute('src') || '')")
    assert hidden
    assert all(src == "" for src in hidden), hidden
    for route in ("/GPU-Utilization", "/Machine-Resources"):
        # Restored panes keep their tabs; bring each to the front as a user would (it is focused, not reopened).
        open_dashboard(page, ROUTES[route])
        expect(pane(page, route)).to_be_visible()
        wait_for_canvas(page, route)
    expect(page.locator(".jp-nvdash-Pane")).to_have_count(len(ROUTES))
    assert keeps_changing(pane(page, "/Machine-Resources"))
    expect(page.locator(".jp-NotebookPanel")).to_have_count(1)
    page.screenshot(path=str(artifact("jupyterlab-restored.png")))


def test_panes_follow_the_dark_theme(page: Page) -> None:
    route = "/GPU-Utilization"
    open_dashboard(page, ROUTES[route])
    light = brightness(pane(page, route))
    hidden_ids = page.locator(".jp-nvdash-Pane.lm-mod-hidden").evaluate_all("(panes) => panes.map(p => p.id)")
    hidden = next(r for r in ROUTES if pane_id(r) in hidden_ids)
    hidden_src = pane(page, hidden).locator("iframe").get_attribute("src") or ""
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    try:
        expect(page.locator("body")).to_have_attribute("data-jp-theme-light", "false", timeout=20_000)
        dark_src = re.compile(f"/nvdash{route}[?]theme=dark$")
        expect(pane(page, route).locator("iframe")).to_have_attribute("src", dark_src)
        wait_for_canvas(page, route)
        wait_until_drawn(pane_frame(pane(page, route)), CANVAS_TIMEOUT_MS)
        dark = brightness(pane(page, route))
        page.screenshot(path=str(artifact("jupyterlab-dark.png")))
        snap(pane(page, route), str(artifact("jupyterlab-dark-pane.png")))
        # A pane hidden behind another tab keeps its page until it is shown, then loads the dark one.
        assert (pane(page, hidden).locator("iframe").get_attribute("src") or "") == hidden_src
        open_dashboard(page, ROUTES[hidden])
        expect(pane(page, hidden).locator("iframe")).to_have_attribute(
            "src", re.compile(f"/nvdash{hidden}[?]theme=dark$"))
    finally:
        page.evaluate(
            "() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})"
        )
    assert light > 200, f"the light pane is not light: mean grey {light:.0f}"
    assert dark < 60, f"the dark pane is not dark: mean grey {dark:.0f}"
    open_dashboard(page, ROUTES[route])
    expect(pane(page, route).locator("iframe")).to_have_attribute("src", re.compile(f"/nvdash{route}[?]theme=light$"))


def test_a_killed_server_is_restarted_and_the_panes_reload(page: Page, lab: JupyterLab) -> None:
    route = "/Machine-Resources"
    # Status is polled (and so the proxy asked to restart nvdash) while a pane is shown: show this one.
    open_dashboard(page, "Machine Resources")
    wait_for_canvas(page, route)
    frame = f"#{pane_id(route)} iframe"
    loaded_at = page.evaluate("(frame) => document.querySelector(frame).contentWindow.performance.timeOrigin", frame)
    before = lab.nvdash_pids()
    assert len(before) == 1, before
    os.kill(before[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (pids := lab.nvdash_pids()) in ([], before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids not in ([], before), (
        f"jupyter-server-proxy did not restart nvdash (nvdash processes: {pids}); Jupyter's log ends:\n"
        + "\n".join(lab.output().splitlines()[-40:]))
    # The panes notice within a poll interval and load a session from the new process.
    page.wait_for_function(
        """([frame, loadedAt, route]) => {
            const view = document.querySelector(frame).contentWindow;
            return view.performance.timeOrigin > loadedAt && view.location.pathname.endsWith(route)
                && view.document.readyState === 'complete';
        }""",
        arg=[frame, loaded_at, route],
        timeout=60_000,
    )
    wait_for_canvas(page, route)
    assert keeps_changing(pane(page, route))


def test_under_a_non_root_base_url(browser: Browser) -> None:
    with jupyter_lab(env=SIMULATED, base_url="/lab-here/", extra_args=EXPOSE_APP) as lab:
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        try:
            open_lab(page, lab)
            open_dashboard(page, "GPU Memory")
            wait_for_canvas(page, "/GPU-Memory")
            target = pane(page, "/GPU-Memory")
            src = target.locator("iframe").get_attribute("src")
            assert src == f"http://127.0.0.1:{lab.port}/lab-here/nvdash/GPU-Memory?theme=light"
            assert keeps_changing(target)
            page.screenshot(path=str(artifact("jupyterlab-base-url.png")))
        finally:
            context.close()
    base = f"http://127.0.0.1:{lab.port}/lab-here/"
    assert [url for url in requests if not url.startswith(base) and not url.startswith("data:")] == []
    nvdash = [url for url in requests if url.startswith(base + "nvdash/")]
    assert any(url.startswith(base + "nvdash/static/js/bokeh.min.js") for url in nvdash), nvdash
    assert any(url.startswith(base + "nvdash/index.json") for url in nvdash), nvdash


def test_a_server_that_cannot_start_is_reported_with_a_retry(browser: Browser) -> None:
    broken = {"NVDASH_SIMULATE": "no-such-profile", "NVDASH_START_TIMEOUT": "3"}
    with jupyter_lab(env=broken, extra_args=EXPOSE_APP) as lab:
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        try:
            open_lab(page, lab)
            sidebar = open_sidebar(page)
            error = sidebar.locator(".jp-nvdash-Sidebar-error")
            expect(error).to_contain_text("could not start", timeout=30_000)
            expect(error).to_contain_text("HTTP 500")
            retry = sidebar.locator("button.jp-nvdash-retry")
            expect(retry).to_be_enabled()
            page.evaluate(
                "() => window.jupyterapp.commands.execute('nvdash:open', "
                "{route: '/GPU-Utilization', title: 'GPU Utilization'})"
            )
            message = pane(page, "/GPU-Utilization").locator(".jp-nvdash-Pane-message")
            expect(message).to_contain_text("GPU Utilization is not available", timeout=30_000)
            expect(message.locator("button.jp-nvdash-retry")).to_be_visible()
            page.screenshot(path=str(artifact("jupyterlab-cannot-start.png")))
            # Retry asks the server again; the answer (nvdash's message) comes too fast to see "Starting..." reliably.
            with page.expect_request(lambda request: "/nvdash/" in request.url, timeout=30_000):
                message.locator("button.jp-nvdash-retry").click()
            expect(message).to_contain_text("could not start", timeout=30_000)
            expect(message).to_contain_text("unknown profile 'no-such-profile'")
            expect(message.locator("button.jp-nvdash-retry")).to_be_enabled()
            assert pane(page, "/GPU-Utilization").locator("iframe").get_attribute("src") in (None, "")
        finally:
            context.close()
        assert "unknown profile 'no-such-profile'" in lab.output()
