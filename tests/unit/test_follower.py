"""The follower hands a document the store's new rows: one at a time, or in batches every session shares."""

from __future__ import annotations

from collections.abc import Sequence

from bokeh.models.widgets import Toggle

from nvdash.apps.context import AppContext
from nvdash.live.follow import Follower, refresh_batch
from nvdash.sampling.records import HostInfo, HostSample, Inventory, Snapshot
from nvdash.store import Store


def _store(capacity: int = 100) -> Store:
    return Store(Inventory(host=HostInfo("h", 1, 1)), capacity=capacity)


def _append(store: Store, count: int) -> None:
    for _ in range(count):
        seq = store.last_seq + 1
        store.append(Snapshot(time_s=float(seq), gpus=(), host=HostSample(cpu_pct=float(seq))))


class Received:
    def __init__(self) -> None:
        self.batches: list[list[float]] = []

    def __call__(self, rows: Sequence[Snapshot]) -> None:
        self.batches.append([row.time_s for row in rows])


def test_one_row_at_a_time_by_default() -> None:
    store = _store()
    got = Received()
    follower = Follower(store, 0, got)
    for _ in range(3):
        _append(store, 1)
        follower.poll()
    follower.poll()  # nothing new: nothing handed on
    assert got.batches == [[1.0], [2.0], [3.0]]


def test_batches_end_on_multiples_of_the_batch_so_sessions_that_start_apart_get_the_same_rows() -> None:
    store = _store()
    _append(store, 1)
    early, late = Received(), Received()
    first = Follower(store, 1, early, batch=2)
    _append(store, 1)
    second = Follower(store, 2, late, batch=2)
    for _ in range(5):
        _append(store, 1)
        first.poll()
        second.poll()
    # Rows 3 to 7 came one per poll: rows 1-2 were in the pages, row 7 waits for row 8.
    assert early.batches == [[2.0], [3.0, 4.0], [5.0, 6.0]]
    assert late.batches == [[3.0, 4.0], [5.0, 6.0]]
    assert first.seq == second.seq == 6


def test_a_reader_behind_by_more_than_the_store_keeps_gets_the_kept_rows_up_to_the_boundary() -> None:
    store = _store(capacity=4)
    got = Received()
    follower = Follower(store, 0, got, batch=2)
    _append(store, 9)
    follower.poll()
    assert got.batches == [[6.0, 7.0, 8.0]]  # the store keeps rows 6-9; row 9 waits for row 10
    assert follower.seq == 8


def test_catching_up_after_a_pause_hands_on_every_row_at_once() -> None:
    store = _store()
    pause = Toggle(active=True)
    got = Received()
    follower = Follower(store, 0, got, pause, batch=2)
    _append(store, 3)
    follower.poll()
    assert got.batches == []
    pause.active = False
    follower.toggled("active", True, False)
    assert got.batches == [[1.0, 2.0, 3.0]]
    _append(store, 1)
    follower.poll()
    assert got.batches == [[1.0, 2.0, 3.0], [4.0]]


def test_a_refresh_batch_covers_about_a_second_of_samples() -> None:
    def batch(interval_s: float) -> int:
        return refresh_batch(AppContext(store=_store(), interval_s=interval_s))

    assert batch(0.5) == 2
    assert batch(0.25) == 4
    assert batch(0.1) == 10
    assert batch(1.0) == 1
    assert batch(5.0) == 1
