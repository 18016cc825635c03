"""GPU Health, GPU Details and GPU Processes under many viewers: redrawn about once a second like the classic pages,
each tick's values computed once for every page of the route, and no page's data shared with another's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnDataChangedEvent, ColumnsPatchedEvent, ColumnsStreamedEvent
from bokeh.models import ColumnDataSource
from bokeh.models.widgets import Div

from nvdash.apps import AppContext, gpu_details, gpu_health, gpu_processes
from nvdash.apps.gpu_health import hints_html
from nvdash.live.visibility import hidden_flag
from nvdash.sampling.records import GpuEvent, HostSample, Snapshot
from nvdash.store import Store
from tests.unit import test_apps_health as health_data
from tests.unit import test_apps_processes as process_data
from tests.unit.test_apps import tick

Build = Callable[[Document, AppContext], None]
DATA_EVENTS = (ColumnsStreamedEvent, ColumnsPatchedEvent, ColumnDataChangedEvent)


def health_row(time_s: float) -> Snapshot:
    return Snapshot(time_s, (health_data.h100(time_s), health_data.a100(), health_data.a100(index=2)),
                    HostSample(cpu_pct=20.0))


def process_row(time_s: float, gib: float = 30.0, usage: Any = process_data.USAGE) -> Snapshot:
    return process_data.snapshot(time_s, usage, gpu0_gib=gib)


def context(rows: list[Snapshot], inventory: Any, interval_s: float = 0.5) -> AppContext:
    store = Store(inventory, capacity=100)
    for row in rows:
        store.append(row)
    return AppContext(store=store, interval_s=interval_s)


PAGES: dict[str, tuple[Build, Callable[[float], Snapshot], Any]] = {
    "health": (gpu_health.build, health_row, health_data.INVENTORY),
    "details": (gpu_details.build, health_row, health_data.INVENTORY),
    "processes": (gpu_processes.build, lambda t: process_row(t, gib=t - 970.0), process_data.INVENTORY),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_pages_are_redrawn_once_a_second_and_lose_no_row(page: str) -> None:
    build, row, inventory = PAGES[page]
    ctx = context([row(1000.0 + n) for n in range(3)], inventory)
    doc = Document()
    build(doc, ctx)
    tick(doc)
    redraws = 0
    for n in range(5):  # rows 4 to 8 at 0.5 s: a redraw when rows 4, 6 and 8 are in
        ctx.store.append(row(1003.0 + n))
        if any(isinstance(event, DATA_EVENTS) for event in tick(doc)):
            redraws += 1
    assert redraws == 3
    if page != "processes":  # the timelines hold every row, none left behind by the batches
        (times,) = {tuple(source.data["time"]) for source in doc.select({"type": ColumnDataSource})
                    if "time" in source.data and len(source.data["time"]) > 3}
        assert [t / 1000.0 for t in times] == [1000.0 + n for n in range(8)]


def test_one_second_interval_still_redraws_every_row() -> None:
    ctx = context([health_row(1000.0)], health_data.INVENTORY, interval_s=1.0)
    doc = Document()
    gpu_health.build(doc, ctx)
    tick(doc)
    for n in range(3):
        ctx.store.append(health_row(1001.0 + n))
        assert any(isinstance(event, ColumnsStreamedEvent) for event in tick(doc))


def counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    calls = [0]
    original = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_process_bars_and_table_are_computed_once_for_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context([process_row(1000.0, usage=None)], process_data.INVENTORY, interval_s=1.0)
    pages = [Document() for _ in range(3)]
    for doc in pages:
        gpu_processes.build(doc, ctx)
    bars = counting(monkeypatch, gpu_processes, "memory_columns")
    table = counting(monkeypatch, gpu_processes, "columns")
    ctx.store.append(process_row(1001.0))  # a usage reading arrives: the table is rebuilt
    for doc in pages:
        tick(doc)
    assert (bars[0], table[0]) == (1, 1)
    pids = [list(doc.select_one({"name": "processes"}).data["pid"]) for doc in pages]
    assert pids[0] == pids[1] == pids[2] != []


def test_a_page_patches_its_own_bars_after_a_shared_replacement() -> None:
    ctx = context([process_row(1000.0, usage=None)], process_data.INVENTORY, interval_s=1.0)
    pages = [Document() for _ in range(2)]
    for doc in pages:
        gpu_processes.build(doc, ctx)
    ctx.store.append(process_row(1001.0, gib=30.0))  # new rows (the processes): each page's data replaced
    for doc in pages:
        tick(doc)
    ctx.store.append(process_row(1002.0, gib=50.0))  # the same rows, more memory used: a patch for each page
    for doc in pages:
        events = tick(doc)
        assert any(isinstance(event, ColumnsPatchedEvent) for event in events)
    rights = [list(doc.select_one({"name": "memory-segments"}).data["right"]) for doc in pages]
    assert rights[0] == rights[1]


def test_details_header_is_computed_once_for_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context([health_row(1000.0)], health_data.INVENTORY, interval_s=1.0)
    pages = [Document() for _ in range(3)]
    for doc in pages:
        gpu_details.build(doc, ctx)
    shares = counting(monkeypatch, gpu_details, "held_back_shares")
    ctx.store.append(health_row(1001.0))
    for doc in pages:
        tick(doc)
    assert shares[0] == 1


def test_health_event_log_is_computed_once_for_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context([health_row(1000.0)], health_data.INVENTORY, interval_s=1.0)
    pages = [Document() for _ in range(3)]
    for doc in pages:
        gpu_health.build(doc, ctx)
        tick(doc)
    logs = counting(monkeypatch, gpu_health, "event_columns")
    ctx.store.add_events([GpuEvent(1000.5, 0, "xid", "Xid 48", "critical", 48)])
    for doc in pages:
        tick(doc)
    assert logs[0] == 1
    logs_shown = [next(list(source.data["message"]) for source in doc.select({"type": ColumnDataSource})
                       if "message" in source.data) for doc in pages]
    assert logs_shown[0] == logs_shown[1] == logs_shown[2]
    assert len(logs_shown[0]) == 1
    assert logs_shown[0][0].startswith("XID 48:")


def test_health_takes_no_update_while_hidden_and_catches_up_when_seen() -> None:
    ctx = context([health_row(1000.0)], health_data.INVENTORY, interval_s=1.0)
    doc = Document()
    gpu_health.build(doc, ctx)
    tick(doc)
    hidden_flag(doc).disabled = True
    for n in range(3):
        ctx.store.append(health_row(1001.0 + n))
        assert tick(doc) == []
    events: list[Any] = []
    doc.on_change(events.append)
    hidden_flag(doc).disabled = False  # seen again: the three rows at once
    (streamed,) = [event for event in events if isinstance(event, ColumnsStreamedEvent)]
    assert [t / 1000.0 for t in streamed.data["time"]] == [1001.0, 1002.0, 1003.0]


def test_health_hints_are_computed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    original = gpu_health.bottleneck_hints

    def hints(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return original(*args)

    monkeypatch.setattr(gpu_health, "bottleneck_hints", hints)
    with ThreadPoolExecutor(1) as pool:
        store = Store(health_data.INVENTORY, capacity=100)
        for row in health_data.ROWS:
            store.append(row)
        expected = hints_html(original(store.inventory, store.since(0)[0]))
        ctx = AppContext(store=store, interval_s=1.0, history_executor=pool)
        doc = Document()
        gpu_health.build(doc, ctx)
        shown = doc.select_one({"name": "hints"})
        assert isinstance(shown, Div)
        assert shown.text == gpu_health.HINTS_PENDING  # the page opens without waiting for them
        deadline = time.monotonic() + 30
        while shown.text == gpu_health.HINTS_PENDING:
            assert time.monotonic() < deadline, "the hints never came"
            store.append(health_row(store.latest().time_s + 1))  # type: ignore[union-attr]
            tick(doc)
            time.sleep(0.01)
    assert shown.text == expected
    assert threads
    assert threading.main_thread() not in threads
