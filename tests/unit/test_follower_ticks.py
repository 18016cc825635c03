"""What a ticker asks of a follower: whether a tick brings it rows, and the rows up to that tick, however late."""

from __future__ import annotations

from bokeh.models.widgets import Toggle

from nvdash.live.follow import Follower
from tests.unit.test_follower import Received, _append, _store


def test_a_follower_is_due_for_a_whole_batch_unless_paused() -> None:
    store = _store()
    pause = Toggle(active=False)
    follower = Follower(store, 2, Received(), pause, batch=2)
    assert not follower.due(2)
    assert not follower.due(3)  # row 3 waits for row 4
    assert follower.due(4)
    pause.active = True
    assert not follower.due(4)
    assert Follower(store, 2, Received()).due(3)  # one row at a time: any new row


def test_sessions_updated_from_one_tick_get_the_same_rows_however_late_their_turn() -> None:
    store = _store()
    early, late = Received(), Received()
    first = Follower(store, 0, early, batch=2)
    second = Follower(store, 0, late, batch=2)
    _append(store, 5)
    tick_saw = store.last_seq  # 5: both due, up to row 4
    first.apply(tick_saw)
    _append(store, 2)  # rows 6 and 7 arrive before the second session's turn
    second.apply(tick_saw)
    assert early.batches == late.batches == [[1.0, 2.0, 3.0, 4.0]]
    assert first.seq == second.seq == 4
    first.apply(store.last_seq)
    second.apply(store.last_seq)
    assert early.batches == late.batches == [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0]]


def test_an_update_after_the_page_moved_on_hands_on_nothing_and_never_goes_back() -> None:
    store = _store()
    got = Received()
    follower = Follower(store, 0, got, batch=2)
    _append(store, 6)
    follower.seq = 6  # the page reloaded the store's columns (back to live) after the tick that saw row 4
    follower.apply(4)
    assert got.batches == []
    assert follower.seq == 6


def test_a_paused_follower_takes_no_update_from_a_tick_and_catches_up_on_resume() -> None:
    store = _store()
    pause = Toggle(active=False)
    got = Received()
    follower = Follower(store, 0, got, pause, batch=2)
    _append(store, 3)
    pause.active = True  # pressed between the tick and the document's turn
    follower.apply(3)
    assert got.batches == []
    pause.active = False
    follower.toggled("active", True, False)
    assert got.batches == [[1.0, 2.0, 3.0]]
