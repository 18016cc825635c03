"""The time range control: timeline pages over a real history file, asserting on the values they show."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.events import MenuItemClick
from bokeh.models import ColumnDataSource, CustomJS, Patch, Plot, Rect
from bokeh.models.renderers import GlyphRenderer
from bokeh.models.widgets import Dropdown, Toggle
from bokeh.server.callbacks import NextTickCallback

from nvdash.apps import AppContext, gpu_details, gpu_resources, machine_resources, nvlink_timeline
from nvdash.apps.time_range import HISTORY_OFF, TimeRangeControl
from nvdash.apps.timelines import BANDS_NAME, ENDS_NAME, timeline_data
from nvdash.health.clock_events import GPU_IDLE, HW_SLOWDOWN, SW_POWER_CAP
from nvdash.history.query import HistoryResult, SqliteHistory
from nvdash.history.ranges import TimeRange
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from nvdash.store import Store
from tests.unit.test_apps import assert_floats, models, tick
from tests.unit.test_apps_health import INVENTORY, ROWS

NOW = 1_700_006_400.0
"""The pages' "now" (a multiple of 60 s, so the written minutes are whole)."""
EVERY_S = 10.0
HOUR = 3600.0
NAN = math.nan
Build = Callable[[Document, AppContext], None]


def utilization(time_s: float, gpu: int) -> float:
    """A pattern with different values within each minute, so min, mean and max differ."""
    return float((time_s // EVERY_S) % 7 * 10 + gpu)


def reasons(time_s: float) -> int:
    """SW power cap in the first 10 s of every 5th minute, idle otherwise."""
    return SW_POWER_CAP if (time_s // 60) % 5 == 0 and time_s % 60 == 0 else GPU_IDLE


def snapshot(time_s: float) -> Snapshot:
    gpus = tuple(GpuSample(i, utilization_pct=utilization(time_s, i), temperature_c=40.0 + utilization(time_s, i),
                           clock_event_reasons=reasons(time_s) | (HW_SLOWDOWN if i == 1 else 0))
                 for i in range(3))
    return Snapshot(time_s, gpus, HostSample(cpu_pct=utilization(time_s, 5)))


WRITTEN = [NOW - 3 * HOUR + k * EVERY_S for k in range(360)] + [NOW - HOUR + k * EVERY_S for k in range(360)]
"""Two hours of readings with an hour's silence between them (nvdash was not running)."""


@pytest.fixture(scope="module")
def history_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    writer = HistoryWriter(path, INVENTORY, "test", EVERY_S, clock=lambda: NOW)
    writer.open()
    for time_s in WRITTEN:
        writer.submit(snapshot(time_s))
    writer.flush()
    writer.stop()
    return path


def context(history_file: Path | None, executor: ThreadPoolExecutor | None = None, *, replay: bool = False
            ) -> AppContext:
    store = Store(INVENTORY, capacity=100)
    for row in ROWS:
        store.append(row)
    history = SqliteHistory(history_file) if history_file is not None else None
    return AppContext(store=store, interval_s=1.0, history=history, history_executor=executor,
                      clock=lambda: NOW, replay=replay)


def open_page(build: Build, ctx: AppContext) -> tuple[Document, TimeRangeControl, ColumnDataSource]:
    """Build a page and return it with its range control and its line source."""
    doc = Document()
    build(doc, ctx)
    (menu,) = models(doc, Dropdown)
    (handler,) = menu._event_callbacks["menu_item_click"]
    control = handler.__self__  # type: ignore[union-attr]
    assert isinstance(control, TimeRangeControl)
    lines = [source for source in models(doc, ColumnDataSource) if source.name is None]
    assert len(lines) == 1
    return doc, control, lines[0]


def named_source(doc: Document, name: str) -> ColumnDataSource:
    (source,) = [source for source in models(doc, ColumnDataSource) if source.name == name]
    return source


def settle(doc: Document) -> int:
    """Run the pending next-tick callbacks (the history loads) as the server's event loop would."""
    pending = [callback for callback in doc.session_callbacks if isinstance(callback, NextTickCallback)]
    for callback in pending:
        asyncio.run(callback.callback())  # type: ignore[arg-type]
    return len(pending)


def band(bands: ColumnDataSource, key: str) -> tuple[list[float], list[float]]:
    """A band's polygon columns without the NaN padding after its last polygon."""
    xs, ys = list(bands.data[key + ":band x"]), list(bands.data[key + ":band y"])
    while xs and math.isnan(xs[-1]) and (len(xs) < 2 or math.isnan(xs[-2])):
        xs.pop()
        ys.pop()
    return xs, ys


def expected_band(times: list[float], low: list[float], high: list[float]) -> tuple[list[float], list[float]]:
    """For each run of buckets with a value: the maxima left to right, the minima right to left, then NaN."""
    xs: list[float] = []
    ys: list[float] = []
    run: list[int] = []
    for k in [*range(len(times)), None]:
        if k is not None and not math.isnan(low[k]):
            run.append(k)
            continue
        if run:
            xs += [times[i] for i in run] + [times[i] for i in reversed(run)] + [NAN]
            ys += [high[i] for i in run] + [low[i] for i in reversed(run)] + [NAN]
            run = []
    return xs, ys


def with_arguments(monkeypatch: pytest.MonkeyPatch, **arguments: str) -> None:
    request = SimpleNamespace(arguments={name: [value.encode()] for name, value in arguments.items()})
    monkeypatch.setattr(Document, "session_context", property(lambda _: SimpleNamespace(request=request)))


def expected_buckets(read: Callable[[float], float], start_s: float, step_s: float
                     ) -> dict[float, tuple[float, float, float]]:
    """Bucket centre -> (mean, min, max) computed from the written readings as the 1 min tier and the query do:
    each minute's min, mean and max, then per bucket the mean of the minutes' means, min of minima, max of maxima."""
    minutes: dict[float, list[float]] = defaultdict(list)
    for time_s in WRITTEN:
        minutes[time_s // 60 * 60].append(read(time_s))
    origin = math.floor(start_s / step_s) * step_s
    buckets: dict[float, list[list[float]]] = defaultdict(list)
    for minute, values in minutes.items():
        centre = origin + ((minute - origin) // step_s + 0.5) * step_s
        buckets[centre].append([sum(values) / len(values), min(values), max(values)])
    return {centre: (sum(m[0] for m in rows) / len(rows), min(m[1] for m in rows), max(m[2] for m in rows))
            for centre, rows in sorted(buckets.items())}


def with_gap(expected: dict[float, tuple[float, float, float]], step_s: float
             ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Times (ms) and mean, min, max columns, with the NaN point the query puts one step after a silence."""
    times: list[float] = []
    columns: list[list[float]] = [[], [], []]
    previous = None
    for centre, values in expected.items():
        if previous is not None and centre - previous > 3 * step_s:
            times.append((previous + step_s) * 1000.0)
            for column in columns:
                column.append(NAN)
        times.append(centre * 1000.0)
        for column, value in zip(columns, values, strict=True):
            column.append(value)
        previous = centre
    mean, minimum, maximum = columns
    return times, mean, minimum, maximum


# --- choosing a past range ------------------------------------------------------------------------------


def test_seven_days_shows_bucket_means_with_min_max_bands_and_a_gap(
        history_file: Path, executor: ThreadPoolExecutor) -> None:
    doc, control, source = open_page(gpu_resources.build, context(history_file, executor))
    assert control.live
    assert control.menu.label == "Live"
    assert control.status.text == "live"
    bands = named_source(doc, BANDS_NAME)  # made with the page, empty and hidden in Live
    assert all(len(column) == 0 for column in bands.data.values())
    band_renderers = [r for r in models(doc, GlyphRenderer) if (r.name or "").endswith(" band")]
    assert len(band_renderers) == 3 * 3 + 2  # utilization, memory, PCIe for 3 GPUs; NVLink for the 2 that have it
    assert not any(r.visible for r in band_renderers)  # the browser skips them while streaming

    control.menu._trigger_event(MenuItemClick(control.menu, item="7d"))
    assert not control.live
    assert control.time_range == TimeRange(NOW - 7 * 86_400, NOW, "7d")
    assert control.status.text.startswith("loading last 7 d")
    assert settle(doc) == 1

    step = 600.0  # 7 d / 1000 points = 604.8 s, down to whole buckets of the 10 min tier
    times, mean, minimum, maximum = with_gap(expected_buckets(lambda t: utilization(t, 1), NOW - 7 * 86_400, step),
                                             step)
    assert_floats(source.data["time"], times)
    assert_floats(source.data["util/1"], mean)
    assert sum(math.isnan(value) for value in source.data["util/1"]) == 1  # the silent hour
    xs, ys = band(bands, "util/1")
    expected_xs, expected_ys = expected_band(times, minimum, maximum)
    assert_floats(xs, expected_xs)
    assert_floats(ys, expected_ys)
    assert sum(math.isnan(x) for x in xs) == 2  # two polygons: before and after the silent hour
    assert all(r.visible for r in band_renderers)
    assert all(low < high for low, high in zip(minimum, maximum, strict=True) if not math.isnan(low))
    assert all(glyph.fill_alpha == pytest.approx(0.2) for glyph in models(doc, Patch))
    assert_floats(named_source(doc, ENDS_NAME).data["time"], [(NOW - 7 * 86_400) * 1000.0, NOW * 1000.0])
    utilization_plot = next(plot for plot in models(doc, Plot) if getattr(plot.title, "text", "") == "Utilization")
    names = [renderer.name for renderer in utilization_plot.renderers]
    assert names[:4] == ["util/0 band", "util/1 band", "util/2 band", "util/0"]  # the bands lie under the lines
    line = next(renderer for renderer in utilization_plot.renderers if renderer.name == "util/1")
    assert line.js_property_callbacks["change:visible"]  # a legend click hides the band with its line
    # The NVLink panel reads its own metric, never written here: NaN throughout.
    assert all(math.isnan(value) for value in source.data["nvlink/0"])
    assert control.status.text == "last 7 d · 10 min buckets · band: min\u2013max"


def test_fetch_and_apply_are_the_two_halves_of_a_load(history_file: Path) -> None:
    doc, control, source = open_page(machine_resources.build, context(history_file))
    time_range = TimeRange(NOW - 7 * 86_400, NOW, "7d")
    control.time_range = time_range
    result = control.fetch(time_range)
    assert isinstance(result, HistoryResult)
    assert set(result.series) == {"host_cpu_pct", "host_memory_used_bytes", "host_disk_read_bytes_per_s",
                                  "host_disk_write_bytes_per_s", "host_net_recv_bytes_per_s",
                                  "host_net_sent_bytes_per_s"}
    control.apply(result)
    _times, mean, _minimum, maximum = with_gap(
        expected_buckets(lambda t: utilization(t, 5), NOW - 7 * 86_400, 600.0), 600.0)
    assert_floats(source.data["cpu"], mean)
    times, _mean, minimum, _maximum = with_gap(
        expected_buckets(lambda t: utilization(t, 5), NOW - 7 * 86_400, 600.0), 600.0)
    xs, ys = band(named_source(doc, BANDS_NAME), "cpu")
    expected_xs, expected_ys = expected_band(times, minimum, maximum)
    assert_floats(xs, expected_xs)
    assert_floats(ys, expected_ys)
    assert all(math.isnan(value) for value in source.data["disk_read"])  # never written


def test_a_past_range_is_not_streamed_into_and_live_restores_the_store(history_file: Path) -> None:
    ctx = context(history_file)
    doc, control, source = open_page(gpu_resources.build, ctx)
    live = timeline_data(ctx.store.since(0)[0], [])
    (pause,) = models(doc, Toggle)
    control.choose("24h")
    settle(doc)
    assert not pause.visible
    shown = list(source.data["util/0"])
    ctx.store.append(replace(ROWS[-1], time_s=1003.0))
    assert not [event for event in tick(doc) if isinstance(event, ColumnsStreamedEvent)]
    assert_floats(source.data["util/0"], shown)

    control.choose("live")
    assert control.live
    assert pause.visible
    assert control.menu.tags == []
    assert_floats(source.data["time"], [*live["time"], 1_003_000.0])
    assert_floats(source.data["util/0"], [90.0] * 4)
    bands = named_source(doc, BANDS_NAME)
    assert all(len(column) == 0 for column in bands.data.values())
    assert len(named_source(doc, ENDS_NAME).data["time"]) == 0
    ctx.store.append(replace(ROWS[-1], time_s=1004.0))
    (event,) = [event for event in tick(doc) if isinstance(event, ColumnsStreamedEvent)]
    assert_floats(event.data["time"], [1_004_000.0])


def test_a_query_still_running_when_the_range_changes_is_dropped(history_file: Path) -> None:
    ctx = context(history_file)
    doc, control, source = open_page(nvlink_timeline.build, ctx)
    control.choose("7d")
    control.choose("live")
    settle(doc)
    assert control.live
    assert_floats(source.data["time"], [1_000_000.0, 1_001_000.0, 1_002_000.0])
    assert all(len(column) == 0 for column in named_source(doc, BANDS_NAME).data.values())


# --- the URL --------------------------------------------------------------------------------------------


def test_the_url_opens_a_preset(history_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_arguments(monkeypatch, range="6h", gpu="1")
    doc, control, source = open_page(gpu_resources.build, context(history_file))
    assert control.time_range == TimeRange(NOW - 6 * HOUR, NOW, "6h")
    assert control.menu.label == "Last 6 h"
    assert control.menu.tags == [["range", "6h"]]
    assert settle(doc) == 1
    assert control.status.text == "last 6 h · 20 s buckets · band: min\u2013max"
    assert len(source.data["time"]) > 100
    assert_floats(named_source(doc, ENDS_NAME).data["time"], [(NOW - 6 * HOUR) * 1000.0, NOW * 1000.0])


def test_the_url_opens_a_custom_range(history_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_arguments(monkeypatch, **{"from": "2023-11-14T20:00:00Z", "to": str(int(NOW - HOUR / 2))})
    doc, control, source = open_page(machine_resources.build, context(history_file))
    start = 1_699_992_000.0  # 2023-11-14T20:00:00Z
    assert control.time_range == TimeRange(start, NOW - HOUR / 2, "custom")
    assert control.menu.label == "Custom"
    settle(doc)
    assert control.status.text.startswith("custom range (3.5 h) · ")
    known = [t for t, v in zip(source.data["time"], source.data["cpu"], strict=True) if not math.isnan(v)]
    assert known
    half_step_ms = 5_000.0  # the points are 10 s buckets' centres
    assert start * 1000 <= min(known)
    assert max(known) <= (NOW - HOUR / 2) * 1000 + half_step_ms


def test_a_bad_url_range_says_why_and_stays_live(history_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_arguments(monkeypatch, range="banana")
    doc, control, source = open_page(gpu_resources.build, context(history_file))
    assert control.live
    assert "&#x27;banana&#x27; is not a duration" in control.status.text
    assert "(showing live)" in control.status.text
    assert settle(doc) == 0
    assert_floats(source.data["util/0"], [90.0] * 3)


def test_choosing_a_range_rewrites_the_pages_url(history_file: Path) -> None:
    doc, control, _ = open_page(gpu_resources.build, context(history_file))
    (callback,) = control.menu.js_property_callbacks["change:tags"]
    assert isinstance(callback, CustomJS)
    assert "history.replaceState" in callback.code
    assert callback.args["names"] == ["range", "from", "to"]

    control.choose("12h")
    assert control.menu.tags == [["range", "12h"]]
    control.choose("custom")
    assert control.start.visible
    assert control.end.visible
    assert control.apply_button.visible
    assert control.time_range == TimeRange(NOW - 12 * HOUR, NOW, "12h")  # nothing changes before Apply
    # The browser sends the picked local times as epoch milliseconds through the Apply button's tags.
    control.apply_button.tags = [(NOW - 2 * HOUR) * 1000.0, (NOW - HOUR) * 1000.0, 1]
    assert control.time_range == TimeRange(NOW - 2 * HOUR, NOW - HOUR, "custom")
    assert control.menu.tags == [["from", "2023-11-14T22:00:00Z"], ["to", "2023-11-14T23:00:00Z"]]
    assert not control.start.visible
    control.apply_button.tags = [NOW * 1000.0, (NOW - HOUR) * 1000.0, 2]
    assert control.status.text == "from must be before to"
    settle(doc)


# --- without history, and replaying ---------------------------------------------------------------------


def test_without_history_only_live_is_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    with_arguments(monkeypatch, range="6h")
    doc, control, _ = open_page(machine_resources.build, context(None))
    assert control.menu.menu == [("Live", "live")]
    assert control.menu.disabled
    assert control.status.text == HISTORY_OFF
    control.choose("7d")
    assert control.live
    assert settle(doc) == 0


def test_replay_opens_on_the_last_hour_and_offers_no_live(history_file: Path) -> None:
    ctx = context(history_file, replay=True)
    doc, control, source = open_page(gpu_resources.build, ctx)
    assert control.time_range == TimeRange(NOW - HOUR, NOW, "1h")
    assert "live" not in [item[1] for item in control.menu.menu if isinstance(item, tuple)]
    (pause,) = models(doc, Toggle)
    assert not pause.visible
    assert not control.live
    settle(doc)
    assert control.status.text.startswith("last 1 h · ")
    known = [v for v in source.data["util/2"] if not math.isnan(v)]
    assert len(known) > 100
    control.choose("live")
    assert control.time_range == TimeRange(NOW - HOUR, NOW, "1h")


# --- GPU Details ----------------------------------------------------------------------------------------


def test_details_shows_a_past_range_with_limits_and_reason_blocks(history_file: Path) -> None:
    doc, control, source = open_page(gpu_details.build, context(history_file))
    assert len(models(doc, Dropdown)) == 1
    control.choose("7d")
    settle(doc)
    step = 600.0
    times, mean, minimum, maximum = with_gap(
        expected_buckets(lambda t: 40.0 + utilization(t, 0), NOW - 7 * 86_400, step), step)
    # The axis starts and ends at the range's ends so the limits are drawn across it.
    assert_floats(source.data["time"], [(NOW - 7 * 86_400) * 1000.0, *times, NOW * 1000.0])
    assert_floats(source.data["temp"], [NAN, *mean, NAN])
    xs, ys = band(named_source(doc, BANDS_NAME), "temp")
    expected_xs, expected_ys = expected_band(times, minimum, maximum)
    assert_floats(xs, expected_xs)
    assert_floats(ys, expected_ys)
    assert_floats(source.data["slowdown"], [87.0] * (len(times) + 2))
    assert_floats(source.data["sm_max"], [1980.0] * (len(times) + 2))
    assert all(math.isnan(value) for value in source.data["power"])  # not written

    power_cap = f"reason/{SW_POWER_CAP:#x}"
    idle = f"reason/{GPU_IDLE:#x}"
    row = {key: float(next(v for v in source.data[key] if not math.isnan(v))) for key in (power_cap, idle)}
    origin = math.floor((NOW - 7 * 86_400) / step) * step
    cap_buckets = {origin + ((t - origin) // step + 0.5) * step for t in WRITTEN if reasons(t) == SW_POWER_CAP}
    shown = {t / 1000 for t, v in zip(source.data["time"], source.data[power_cap], strict=True) if v == row[power_cap]}
    assert shown == cap_buckets
    assert all(v == row[idle] for v, m in zip(source.data[idle], [NAN, *mean, NAN], strict=True) if not math.isnan(m))
    assert all(math.isnan(v) for v in source.data[f"reason/{HW_SLOWDOWN:#x}"])  # GPU 1's, not GPU 0's
    assert {glyph.width for glyph in models(doc, Rect)} == {step * 1000.0}

    control.choose("live")
    assert {glyph.width for glyph in models(doc, Rect)} == {1000.0 * 1.05}
    assert_floats(source.data["temp"], [60.0, 61.0, 62.0])


def test_details_switching_gpu_in_a_past_range_queries_that_gpu(history_file: Path) -> None:
    doc, control, source = open_page(gpu_details.build, context(history_file))
    control.choose("7d")
    settle(doc)
    from bokeh.models.widgets import Select

    (select,) = models(doc, Select)
    select.value = "1"
    assert settle(doc) == 1
    step = 600.0
    _, mean, _, _ = with_gap(expected_buckets(lambda t: 40.0 + utilization(t, 1), NOW - 7 * 86_400, step), step)
    assert_floats(source.data["temp"], [NAN, *mean, NAN])
    assert_floats(source.data["slowdown"], [90.0] * (len(mean) + 2))
    slowdown = f"reason/{HW_SLOWDOWN:#x}"
    assert not np.isnan(np.asarray(source.data[slowdown], dtype=float)[1:-1]).all()
