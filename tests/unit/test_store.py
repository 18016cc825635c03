"""The ring buffer: bounds, sequence numbers, readers that fall behind."""

from __future__ import annotations

import threading

import pytest

from nvdash.sampling.records import GpuEvent, HostInfo, HostSample, Inventory, Snapshot
from nvdash.store import Store


def _inventory() -> Inventory:
    return Inventory(host=HostInfo("box", 4, 8 * 2**30))


def _snap(t: float) -> Snapshot:
    return Snapshot(time_s=t, gpus=(), host=HostSample(cpu_pct=t))


def test_empty_store() -> None:
    store = Store(_inventory(), capacity=3)
    assert len(store) == 0
    assert store.latest() is None
    assert store.since(0) == ([], 0)


def test_capacity_bounds_the_rows_and_keeps_the_newest() -> None:
    store = Store(_inventory(), capacity=3)
    for i in range(10):
        assert store.append(_snap(float(i))) == i + 1
    assert len(store) == 3
    rows, last = store.since(0)
    assert [row.time_s for row in rows] == [7.0, 8.0, 9.0]
    assert last == 10
    latest = store.latest()
    assert latest is not None
    assert latest.time_s == 9.0


def test_since_returns_only_newer_rows_once() -> None:
    store = Store(_inventory(), capacity=10)
    for i in range(4):
        store.append(_snap(float(i)))
    rows, last = store.since(2)
    assert [row.time_s for row in rows] == [2.0, 3.0]
    assert store.since(last) == ([], 4)


def test_rejects_zero_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Store(_inventory(), capacity=0)


def test_concurrent_writer_and_readers_see_every_kept_row_in_order() -> None:
    store = Store(_inventory(), capacity=50)
    seen: list[list[float]] = [[] for _ in range(4)]

    def writer() -> None:
        for i in range(2000):
            store.append(_snap(float(i)))

    def reader(out: list[float]) -> None:
        seq = 0
        while seq < 2000:
            rows, seq = store.since(seq)
            out.extend(row.time_s for row in rows)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in seen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    for values in seen:
        assert values == sorted(values)
        assert len(values) == len(set(values))
        assert values[-1] == 1999.0


def test_routine_events_never_push_warnings_out_of_the_log() -> None:
    store = Store(_inventory(), capacity=10, event_capacity=5)
    xid = GpuEvent(10.0, 3, "xid", "XID 79", "critical", 79)
    store.add_events([xid])
    store.add_events([GpuEvent(10.0 + i, 0, "throttle", "SW power cap", "info") for i in range(1, 50)])
    kept = store.events()
    assert xid in kept, "the XID outlives a flood of informational events"
    assert len(kept) == 6
    assert [event.time_s for event in kept] == sorted(event.time_s for event in kept)
    assert store.event_seq == 50
    assert store.events(limit=2) == kept[-2:]
    assert store.events(limit=0) == []
