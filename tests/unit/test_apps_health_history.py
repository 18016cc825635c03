"""GPU Health over a past range: each bucket's worst status from the history, and the range's events."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from bokeh.document import Document
from bokeh.models import ColumnDataSource, Rect
from bokeh.models.renderers import GlyphRenderer
from bokeh.models.widgets import DataTable, Dropdown

from nvdash.apps import AppContext, gpu_health
from nvdash.apps.time_range import TimeRangeControl
from nvdash.health.clock_events import GPU_IDLE
from nvdash.history.query import SqliteHistory
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, Snapshot
from nvdash.store import Store
from tests.unit.test_apps import models
from tests.unit.test_apps_health import EVENTS, INVENTORY, ROWS
from tests.unit.test_apps_history import settle

NOW = 1_700_006_400.0
EVERY_S = 10.0
START = NOW - 6 * 3600.0
HOT = (START + 3600.0, START + 5400.0)
"""GPU 0 (slowdown at 87 °C) reads 86 °C for this half hour: within 3 °C of its slowdown threshold, a Warning."""
REMAP = (START + 7200.0, START + 7800.0)
"""GPU 1 has a row remap pending for these ten minutes: Critical."""
XID = GpuEvent(START + 7300.0, 1, "xid", "Xid 63: row remapping pending", "critical", 63)


def reading(time_s: float) -> Snapshot:
    hot = HOT[0] <= time_s < HOT[1]
    remap = REMAP[0] <= time_s < REMAP[1]
    gpus = (GpuSample(0, utilization_pct=50.0, temperature_c=86.0 if hot else 60.0, clock_event_reasons=GPU_IDLE,
                      ecc_uncorrected_volatile=0, remap_pending=False, pcie_generation_current=5,
                      pcie_width_current=16),
            GpuSample(1, utilization_pct=50.0, temperature_c=50.0, clock_event_reasons=GPU_IDLE,
                      ecc_uncorrected_volatile=0, remap_pending=remap),
            GpuSample(2, utilization_pct=5.0, temperature_c=40.0))
    return Snapshot(time_s, gpus, HostSample(cpu_pct=10.0))


@pytest.fixture(scope="module")
def history_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("health") / "history.sqlite"
    writer = HistoryWriter(path, INVENTORY, "test", EVERY_S, clock=lambda: NOW)
    writer.open()
    for k in range(int(6 * 3600 / EVERY_S)):
        writer.submit(reading(START + k * EVERY_S))
    writer.submit_events([XID])
    writer.flush()
    writer.stop()
    return path


def health_page(history_file: Path, executor: ThreadPoolExecutor
                ) -> tuple[Document, TimeRangeControl, ColumnDataSource]:
    store = Store(INVENTORY, capacity=100)
    for row in ROWS:
        store.append(row)
    store.add_events(EVENTS)
    ctx = AppContext(store=store, interval_s=1.0, history=SqliteHistory(history_file), history_executor=executor,
                     clock=lambda: NOW)
    doc = Document()
    gpu_health.build(doc, ctx)
    (menu,) = models(doc, Dropdown)
    (handler,) = menu._event_callbacks["menu_item_click"]
    control = handler.__self__  # type: ignore[union-attr]
    assert isinstance(control, TimeRangeControl)
    (strip,) = {renderer.data_source for renderer in models(doc, GlyphRenderer) if isinstance(renderer.glyph, Rect)}
    assert isinstance(strip, ColumnDataSource)
    return doc, control, strip


def event_messages(doc: Document) -> list[str]:
    (table,) = models(doc, DataTable)
    assert isinstance(table.source, ColumnDataSource)
    return list(table.source.data["message"])


def test_a_past_range_shows_each_buckets_worst_status_and_its_events(history_file: Path,
                                                                     executor: ThreadPoolExecutor) -> None:
    doc, control, strip = health_page(history_file, executor)
    live_messages = event_messages(doc)
    assert any(message.startswith("XID 48") for message in live_messages)

    control.choose("6h")
    assert settle(doc) == 1

    step = 20.0  # 6 h / 1000 points = 21.6 s, down to whole 10 s buckets
    times = [t / 1000.0 - step / 2 for t in strip.data["time"]]
    assert {glyph.width for glyph in models(doc, Rect)} == {step * 1000.0 * gpu_health.BLOCK_WIDTH}

    def expected(gpu: int, start: float) -> float:
        if gpu == 0 and HOT[0] <= start < HOT[1]:
            return 1.0  # Warning
        if gpu == 1 and REMAP[0] <= start < REMAP[1]:
            return 2.0  # Critical
        return 0.0

    written = [t for t in times if START <= t < NOW]
    assert len(written) == 6 * 3600 / step
    for gpu in (0, 1):
        ranks = dict(zip(times, strip.data[f"status/{gpu}"], strict=True))
        assert [ranks[t] for t in written] == [expected(gpu, t) for t in written], gpu
    # GPU 2 has no reading a status rule could fault: OK throughout.
    assert {rank for rank in strip.data["status/2"] if not math.isnan(rank)} == {0.0}

    messages = event_messages(doc)
    assert len(messages) == 1
    assert messages[0].startswith("XID 63")
    assert not any(message.startswith("XID 48") for message in messages)

    control.choose("live")
    assert list(strip.data["time"]) == [row.time_s * 1000.0 for row in ROWS]
    assert any(message.startswith("XID 48") for message in event_messages(doc))
