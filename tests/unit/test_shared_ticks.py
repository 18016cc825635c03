"""Per-tick work shared by the sessions of a route, and the shape of what a tick sends."""

from __future__ import annotations

import math

import numpy as np
from bokeh.document import Document
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.models import ColumnDataSource
from bokeh.protocol import Protocol

from nvdash.apps import gpu_resources, gpu_utilization
from nvdash.live.follow import SMALL_STREAM_ROWS, streamable
from nvdash.live.ticks import WARM_ROWS, TickCache
from nvdash.sampling.records import Snapshot
from nvdash.store import Store
from tests.unit.test_apps import INVENTORY, NEW_ROW, ROWS, make_ctx, tick


def test_a_computation_runs_once_for_the_same_snapshots() -> None:
    cache = TickCache()
    calls: list[int] = []

    def compute(rows: object) -> list[float]:
        calls.append(1)
        return [1.0]

    first = cache.rows("route", ROWS[1:], compute)
    second = cache.rows("route", list(ROWS[1:]), compute)  # another list of the very same snapshots
    assert first is second
    assert len(calls) == 1
    cache.rows("route", ROWS[2:], compute)  # other rows
    cache.rows("other route", ROWS[1:], compute)  # another computation
    assert len(calls) == 3
    assert (cache.hits, cache.misses) == (1, 3)


def test_equal_but_distinct_snapshots_are_not_shared() -> None:
    cache = TickCache()
    twin = Snapshot(ROWS[0].time_s, ROWS[0].gpus, ROWS[0].host)
    assert twin == ROWS[0]
    first = cache.rows("route", [ROWS[0]], lambda rows: object())
    assert cache.rows("route", [twin], lambda rows: object()) is not first


def test_the_cache_is_bounded() -> None:
    cache = TickCache(capacity=2)
    for row in ROWS:
        cache.latest("bars", row, lambda snapshot: snapshot)
    assert len(cache) == 2
    cache.latest("bars", ROWS[0], lambda snapshot: snapshot)
    assert cache.misses == 4  # the oldest was evicted


def test_a_few_rows_are_sent_as_lists_many_as_arrays() -> None:
    few = np.array([1.0, math.nan])
    many = np.zeros(SMALL_STREAM_ROWS + 1)
    data = streamable({"few": few, "many": many, "labels": ["a", "b"]})
    assert data["few"][0] == 1.0
    assert math.isnan(data["few"][1])
    assert isinstance(data["few"], list)
    assert data["many"] is many
    assert data["labels"] == ["a", "b"]


def test_one_tick_of_a_timeline_is_one_message_without_binary_buffers() -> None:
    ctx = make_ctx()
    doc = Document()
    gpu_resources.build(doc, ctx)
    ctx.store.append(NEW_ROW)
    events = [event for event in tick(doc) if isinstance(event, ColumnsStreamedEvent)]
    assert len(events) == 1
    message = Protocol().create("PATCH-DOC", events)
    assert message.buffers == []  # a buffer per column is two frames each: 13 columns would be 26 frames
    assert events[0].data["util/0"] == [99.0]
    assert events[0].data["time"] == [NEW_ROW.time_s * 1000.0]


def test_sessions_of_a_route_share_one_computation_per_tick() -> None:
    ctx = make_ctx()
    docs = [Document() for _ in range(3)]
    for doc in docs:
        gpu_resources.build(doc, ctx)
    ctx.store.append(NEW_ROW)
    before = ctx.ticks.misses
    streamed = [next(e for e in tick(doc) if isinstance(e, ColumnsStreamedEvent)).data for doc in docs]
    assert ctx.ticks.misses == before + 1
    assert streamed[0] is streamed[1] is streamed[2]
    for doc in docs:
        (source,) = [s for s in doc.select({"type": ColumnDataSource}) if "util/0" in s.data]
        assert list(source.data["util/0"])[-1] == 99.0  # each document still holds its own copy


def test_bar_pages_share_their_columns_per_snapshot() -> None:
    ctx = make_ctx()
    docs = [Document() for _ in range(2)]
    for doc in docs:
        gpu_utilization.build(doc, ctx)
    ctx.store.append(NEW_ROW)
    before = ctx.ticks.misses
    for doc in docs:
        tick(doc)
    assert ctx.ticks.misses == before + 1
    for doc in docs:
        (source,) = [s for s in doc.select({"type": ColumnDataSource}) if "label" in s.data or "bar" in s.data]
        assert next(iter(source.data["bar"])) == 99.0


def _times(rows: object) -> dict[str, object]:
    """Per row: its time (an array) and a label (a list), each from that row alone."""
    snapshots = list(rows)  # type: ignore[call-overload]
    return {"time": np.array([row.time_s for row in snapshots]), "label": [f"t={row.time_s:g}" for row in snapshots]}


def _store(capacity: int, count: int) -> Store:
    store = Store(INVENTORY, capacity=capacity)
    for n in range(count):
        store.append(Snapshot(1000.0 + n, ROWS[0].gpus, ROWS[0].host))
    return store


def test_whole_store_columns_compute_each_row_once_and_follow_the_store() -> None:
    cache = TickCache()
    store = _store(capacity=5, count=3)
    data, seq = cache.store_columns("page", store, _times)
    assert (list(data["time"]), data["label"], seq) == ([1000.0, 1001.0, 1002.0], ["t=1000", "t=1001", "t=1002"], 3)
    assert cache.rows_computed == 3
    again, _ = cache.store_columns("page", store, _times)  # another page opening at the same row
    assert list(again["time"]) == [1000.0, 1001.0, 1002.0]
    assert cache.rows_computed == 3
    for n in range(3, 7):  # the store rolls over: it holds 1002..1006
        store.append(Snapshot(1000.0 + n, ROWS[0].gpus, ROWS[0].host))
    data, seq = cache.store_columns("page", store, _times)
    assert list(data["time"]) == [1002.0, 1003.0, 1004.0, 1005.0, 1006.0]
    assert data["label"] == ["t=1002", "t=1003", "t=1004", "t=1005", "t=1006"]
    assert seq == 7
    assert cache.rows_computed == 3 + 4  # only the new rows
    assert cache.store_columns("other", store, _times)[0]["label"] == data["label"]
    assert cache.rows_computed == 3 + 4 + 5  # another computation starts over


def test_whole_store_columns_start_over_when_the_store_moved_past_them() -> None:
    cache = TickCache()
    store = _store(capacity=3, count=3)
    cache.store_columns("page", store, _times)
    for n in range(3, 8):  # five new rows: none of the three computed is still held
        store.append(Snapshot(1000.0 + n, ROWS[0].gpus, ROWS[0].host))
    data, _ = cache.store_columns("page", store, _times)
    assert list(data["time"]) == [1005.0, 1006.0, 1007.0]
    other = _store(capacity=3, count=2)  # another store: its own rows, not the first one's
    assert list(cache.store_columns("page", other, _times)[0]["time"]) == [1000.0, 1001.0]


def test_each_caller_gets_columns_of_its_own() -> None:
    cache = TickCache()
    store = _store(capacity=5, count=2)
    first, _ = cache.store_columns("page", store, _times)
    first["label"].append("streamed")  # Bokeh's stream extends a list column in place
    first["time"][0] = -1.0
    second, _ = cache.store_columns("page", store, _times)
    assert second["label"] == ["t=1000", "t=1001"]
    assert list(second["time"]) == [1000.0, 1001.0]


def test_pages_opening_later_compute_only_the_new_rows() -> None:
    ctx = make_ctx()
    gpu_resources.build(Document(), ctx)
    computed = ctx.ticks.rows_computed
    ctx.store.append(NEW_ROW)
    doc = Document()
    gpu_resources.build(doc, ctx)
    assert ctx.ticks.rows_computed == computed + 1
    (source,) = [s for s in doc.select({"type": ColumnDataSource}) if "util/0" in s.data]
    assert list(source.data["util/0"]) == [row.gpus[0].utilization_pct for row in (*ROWS, NEW_ROW)]


def test_a_cold_computation_is_warmed_a_slice_at_a_time_oldest_first() -> None:
    cache = TickCache()
    store = _store(capacity=10, count=7)
    assert cache.unwarmed_rows("page", store) == 7
    cache.warm("page", store, _times, 3)
    assert (cache.unwarmed_rows("page", store), cache.rows_computed) == (4, 3)
    store.append(Snapshot(1007.0, ROWS[0].gpus, ROWS[0].host))  # a row arrives meanwhile
    cache.warm("page", store, _times, 3)
    assert (cache.unwarmed_rows("page", store), cache.rows_computed) == (2, 6)
    cache.warm("page", store, _times, 3)
    assert (cache.unwarmed_rows("page", store), cache.rows_computed) == (0, 8)
    data, seq = cache.store_columns("page", store, _times)
    assert list(data["time"]) == [1000.0 + n for n in range(8)]
    assert data["label"] == [f"t={1000 + n}" for n in range(8)]
    assert (seq, cache.rows_computed) == (8, 8)  # every row computed once


def test_warming_that_the_store_rolled_past_starts_over() -> None:
    cache = TickCache()
    store = _store(capacity=4, count=4)
    cache.warm("page", store, _times, 2)  # rows 1000 and 1001
    for n in range(4, 7):  # the store now holds 1003..1006: neither computed row is left
        store.append(Snapshot(1000.0 + n, ROWS[0].gpus, ROWS[0].host))
    assert cache.unwarmed_rows("page", store) == 4
    cache.warm("page", store, _times, 2)
    data, _ = cache.store_columns("page", store, _times)
    assert list(data["time"]) == [1003.0, 1004.0, 1005.0, 1006.0]


def test_a_page_on_a_cold_route_shows_the_whole_store_after_its_warming_steps() -> None:
    ctx = make_ctx()
    for n in range(WARM_ROWS + 50):  # more rows than one step computes
        ctx.store.append(Snapshot(ROWS[-1].time_s + 1.0 + n, ROWS[-1].gpus, ROWS[-1].host))
    rows, _ = ctx.store.since(0)
    doc = Document()
    gpu_resources.build(doc, ctx)  # no server: the steps run at once
    (source,) = [s for s in doc.select({"type": ColumnDataSource}) if "util/0" in s.data]
    assert list(source.data["time"]) == [row.time_s * 1000.0 for row in rows]
    assert ctx.ticks.rows_computed == len(rows)  # each row once, over two steps
