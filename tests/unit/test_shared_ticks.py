"""Per-tick work shared by the sessions of a route, and the shape of what a tick sends."""

from __future__ import annotations

import math

import numpy as np
from bokeh.document import Document
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.models import ColumnDataSource
from bokeh.protocol import Protocol

from nvdash.apps import gpu_resources, gpu_utilization
from nvdash.apps.live import SMALL_STREAM_ROWS, streamable
from nvdash.apps.shared_ticks import TickCache
from nvdash.sampling.records import Snapshot
from tests.unit.test_apps import NEW_ROW, ROWS, make_ctx, tick


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
