"""Hovering over a gap in a timeline shows no "NaN": the gap's line is left out of the tooltip, a gap in every line
shows none. The plots are nvdash's own figures, drawn by BokehJS in a real chromium from a standalone page."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from bokeh.embed import file_html
from bokeh.models import ColumnDataSource, Range1d
from bokeh.plotting import figure
from bokeh.resources import INLINE
from playwright.sync_api import Browser, Page, expect

from nvdash.apps.figures import Unit, add_timeline_hover, timeline_figure
from nvdash.apps.gpu_health import _history_figure
from nvdash.sampling.records import GpuInfo, HostInfo, Inventory
from tests.browser.chromium import artifact, chromium, wait_until_drawn

pytestmark = pytest.mark.browser

POINTS = 30
STEP_MS = 1000.0
A_GAP = range(10, 20)
"""Rows where line ``a`` has no value."""
B_GAP = range(10, 15)
"""Rows where line ``b`` has none either: from 10 to 14 both lines are in a gap."""

SCREEN_XY_JS = """
([x, y]) => {
  const plot = Bokeh.documents[0].roots()[0];
  const view = Bokeh.index.find_one(plot);
  const box = view.canvas_view.el.getBoundingClientRect();
  return [box.left + view.frame.x_scale.compute(x), box.top + view.frame.y_scale.compute(y)];
}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def _values(value: float, gap: range) -> list[float]:
    return [math.nan if i in gap else value for i in range(POINTS)]


def _open(browser: Browser, fig: figure, path: Path) -> Page:
    fig.sizing_mode = "fixed"
    fig.width, fig.height = 800, 360
    path.write_text(file_html(fig, INLINE, "hover"), encoding="utf-8")
    page = browser.new_page(viewport={"width": 900, "height": 420})
    page.goto(path.as_uri(), wait_until="load")
    wait_until_drawn(page)
    return page


def _hover(page: Page, x_ms: float, y: float) -> None:
    x, y = page.evaluate(SCREEN_XY_JS, [x_ms, y])
    page.mouse.move(x, y)


def test_a_line_in_a_gap_is_left_out_of_the_tooltip(browser: Browser, tmp_path: Path) -> None:
    source = ColumnDataSource({"time": [i * STEP_MS for i in range(POINTS)], "a": _values(50.0, A_GAP),
                               "b": _values(20.0, B_GAP)})
    fig = timeline_figure("Utilization", "utilization", Unit.PCT, Range1d(0, (POINTS - 1) * STEP_MS), 100.0)
    lines = [fig.line("time", key, source=source, name=key) for key in ("a", "b")]
    add_timeline_hover(fig, lines, {"a": "GPU A", "b": "GPU B"}, what="GPU", value="utilization", unit=Unit.PCT)
    page = _open(browser, fig, tmp_path / "timeline.html")
    tooltips = page.locator(".bk-tooltip-content")
    try:
        _hover(page, 5 * STEP_MS, 35.0)
        expect(tooltips).to_have_count(2)
        assert sorted(tooltips.all_inner_texts()) == [
            "GPU:\tGPU A\nutilization:\t50.0 %\ntime:\t00:00:05", "GPU:\tGPU B\nutilization:\t20.0 %\ntime:\t00:00:05"]
        _hover(page, 17 * STEP_MS, 35.0)
        expect(tooltips).to_have_count(1)
        assert tooltips.all_inner_texts() == ["GPU:\tGPU B\nutilization:\t20.0 %\ntime:\t00:00:17"]
        page.screenshot(path=str(artifact("hover-partial-gap.png")))
        _hover(page, 12 * STEP_MS, 35.0)
        expect(tooltips).to_have_count(0)
    finally:
        page.close()


def test_a_status_strip_shows_no_tooltip_where_it_has_no_reading(browser: Browser, tmp_path: Path) -> None:
    gpus = tuple(GpuInfo(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", 1, 5, 16, 1.0, 0, None) for i in range(2))
    inventory = Inventory(host=HostInfo("node", 1, 1), gpus=gpus)
    source = ColumnDataSource({"time": [i * STEP_MS for i in range(POINTS)], "status/0": _values(0.0, A_GAP),
                               "status/1": _values(2.0, ())})
    page = _open(browser, _history_figure(inventory, source, STEP_MS / 1000.0), tmp_path / "status.html")
    tooltips = page.locator(".bk-tooltip-content")
    try:
        row_of_gpu_0 = 1.0  # the first GPU on top
        _hover(page, 5 * STEP_MS, row_of_gpu_0)
        expect(tooltips).to_have_count(1)
        assert tooltips.all_inner_texts() == ["GPU:\tGPU 0\nstatus:\tOK"]
        _hover(page, 15 * STEP_MS, row_of_gpu_0)
        expect(tooltips).to_have_count(0)
        _hover(page, 15 * STEP_MS, 0.0)
        expect(tooltips).to_have_count(1)
        assert tooltips.all_inner_texts() == ["GPU:\tGPU 1\nstatus:\tCritical"]
    finally:
        page.close()
