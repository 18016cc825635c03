"""A 7-day range of 8 GPUs, opened from a bookmark-style URL, renders in a real chromium."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from nvdash.apps.timelines import BANDS_NAME
from tests.browser.chromium import artifact, chromium, open_page
from tests.conftest import NvdashServer, nvdash_server
from tests.history_week import GAP, WEEK_S, write_week

pytestmark = pytest.mark.browser

SOURCES_JS = """
() => {
  const doc = Bokeh.documents[0];
  const sizes = [];
  for (const model of doc._all_models.values()) {
    if (model.type === "ColumnDataSource") {
      const columns = Object.keys(model.data);
      const first = columns.length ? model.data[columns[0]] : [];
      sizes.push({name: model.name, points: first.length, columns: columns.filter((name) => name !== "time"),
                  times: model.data.time ? Array.from(model.data.time) : [],
                  util0: model.data["util/0"] ? Array.from(model.data["util/0"]) : null});
    }
  }
  return sizes;
}
"""


@pytest.fixture(scope="module")
def week_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NvdashServer, float]]:
    path = tmp_path_factory.mktemp("week") / "history.sqlite"
    end = time.time()
    write_week(path, end)
    with nvdash_server(["--simulate", "dgx-h100", "--history", str(path)]) as server:
        yield server, end


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def test_seven_days_of_eight_gpus_render_with_bands_and_the_gap(week_server: tuple[NvdashServer, float],
                                                                browser: Browser) -> None:
    server, end = week_server
    page, errors = open_page(browser, server.url + "/GPU-Resources?range=7d")
    try:
        page.get_by_text("last 7 d · 10 min buckets").wait_for(timeout=30_000)
        page.wait_for_selector("canvas", state="attached", timeout=20_000)
        page.screenshot(path=str(artifact("history-GPU-Resources-7d.png")))
        sources = page.evaluate(SOURCES_JS)
        url = page.url
    finally:
        page.close()
    assert errors == []
    assert url.endswith("/GPU-Resources?range=7d")
    lines = [source for source in sources if source["util0"] is not None]
    assert len(lines) == 1
    line = lines[0]
    # A week of 10-minute buckets is 1,008; the 6-hour gap holds none (36 fewer) and gets one NaN marker;
    # the range's two ends may cut a bucket each.
    assert 1008 - 36 + 1 - 2 <= line["points"] <= 1008 - 36 + 1 + 1
    assert {f"util/{gpu}" for gpu in range(8)} <= set(line["columns"])
    first, last = line["times"][0] / 1000.0, line["times"][-1] / 1000.0
    # The range starts 7 d before the page opened (a little after ``end``); the first point is the centre of the
    # first whole 10-minute bucket in it: at most 15 min after its start, plus the minute or so it took to open.
    assert end - WEEK_S - 600 <= first <= end - WEEK_S + 900 + 120
    assert end - 1200 <= last <= end + 600
    # The six hours nvdash "was not running" are a gap: no bucket in it has a value.
    start = end - WEEK_S
    def unknown(value: float | None) -> bool:
        return value is None or math.isnan(value)

    around = [(t / 1000.0, value) for t, value in zip(line["times"], line["util0"], strict=True)
              if start + GAP[0] - 1200 <= t / 1000.0 < start + GAP[1] + 1200]
    inside = [value for t, value in around if start + GAP[0] + 600 <= t < start + GAP[1] - 600]
    assert all(unknown(value) for value in inside)
    assert sum(unknown(value) for _, value in around) == 1  # the one marker that breaks the line
    bands = [source for source in sources if source["name"] == BANDS_NAME]
    assert len(bands) == 1
    # One polygon per run of buckets: there and back along the line's points, two runs around the gap.
    assert {"util/0:band x", "util/0:band y"} <= set(bands[0]["columns"])
    assert bands[0]["points"] >= 2 * (line["points"] - 1)


def test_a_custom_range_from_the_url_renders_on_gpu_details(week_server: tuple[NvdashServer, float],
                                                            browser: Browser) -> None:
    server, end = week_server
    start_s, end_s = int(end - 2 * 86_400), int(end - 86_400)
    page, errors = open_page(browser, f"{server.url}/GPU-Details?gpu=3&from={start_s}&to={end_s}")
    try:
        page.get_by_text("buckets · band: min").wait_for(timeout=30_000)
        page.wait_for_selector("canvas", state="attached", timeout=20_000)
        page.screenshot(path=str(artifact("history-GPU-Details-custom.png")))
        sources = page.evaluate(SOURCES_JS)
    finally:
        page.close()
    assert errors == []
    timed = [source for source in sources if "temp" in source["columns"]]
    assert len(timed) == 1
    times = [t / 1000.0 for t in timed[0]["times"]]
    assert min(times) >= start_s - 600
    assert max(times) <= end_s + 600
    assert len(times) > 500
