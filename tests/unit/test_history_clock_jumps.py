"""Clock jumps never delete history: the writer with an injected wall clock that jumps ahead and back by hours and
days (the monotonic clock only moves with the time that really passes), and a write that fails.

Readings are stamped by the wall clock, as the sampler stamps them, and written a few minutes at a time, so the
writer prunes as often as it would in a server (once per minute of monotonic time).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import Key, Tally, hour_of
from nvdash.history.database import uri
from nvdash.history.retention_clock import AHEAD_TOLERANCE_S
from nvdash.history.tiers import RAW_KEEP_S
from nvdash.history.writer import HistoryWriter
from tests.unit.test_history_store import T0, Clocks, count, inventory, simple

HOUR = 3600.0
DAY = 86_400.0
YEAR = 366 * DAY
STEP = 5.0
"""Seconds between readings."""
TABLES = ("gpu_raw", "host_raw", "gpu_10s", "host_10s", "gpu_1m", "host_1m", "gpu_10m", "host_10m", "events",
          "accounting")


class Tallies:
    """The accountant's side of the writer: one tally for the first hour, handed over once."""

    retention_s = 365 * DAY

    def __init__(self) -> None:
        owner = Owner("user", "", "alice", "")
        self._pending: dict[Key, Tally] = {(owner, 0, hour_of(T0)): Tally(start_s=T0, end_s=T0 + 60, allocated_s=60)}
        self.restored = 0

    def drain(self) -> dict[Key, Tally]:
        pending, self._pending = self._pending, {}
        return pending

    def restore(self, tallies: dict[Key, Tally]) -> None:
        self.restored += 1
        self._pending.update(tallies)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks(T0)


@pytest.fixture
def writer(tmp_path: Path, clocks: Clocks) -> Iterator[HistoryWriter]:
    writer = HistoryWriter(tmp_path / "history.sqlite", inventory(1), "test", STEP, clock=clocks.wall,
                           monotonic=clocks.monotonic, accounting=Tallies())
    writer.open()
    try:
        yield writer
    finally:
        writer.stop()


def run(writer: HistoryWriter, clocks: Clocks, seconds: float, utilization: float = 50.0,
        write_every: int = 60) -> None:
    """Take a reading every ``STEP`` seconds for ``seconds``, stamped by the wall clock; write every
    ``write_every`` readings (5 minutes)."""
    for index in range(1, round(seconds / STEP) + 1):
        clocks.advance(STEP)
        writer.submit(simple(clocks.wall(), utilization=utilization))
        if index % write_every == 0:
            writer.flush()
    writer.flush()


def contents(path: Path) -> dict[str, set[tuple[object, ...]]]:
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        return {table: set(connection.execute(f"SELECT * FROM {table}").fetchall()) for table in TABLES}
    finally:
        connection.close()


def missing(before: dict[str, set[tuple[object, ...]]], path: Path) -> dict[str, int]:
    """Per table, how many of the rows in ``before`` are no longer in the file (changed rows count as gone)."""
    now = contents(path)
    return {table: len(rows - now[table]) for table, rows in before.items() if rows - now[table]}


# ------------------------------------------------------------------------------------------------ forward


@pytest.mark.parametrize("jump_s", [7 * HOUR, 8 * DAY, YEAR], ids=["7h", "8d", "1y"])
def test_a_forward_jump_deletes_nothing_that_was_written_before_it(writer: HistoryWriter, clocks: Clocks,
                                                                    jump_s: float) -> None:
    run(writer, clocks, HOUR)
    before = contents(writer.path)
    assert all(before[table] for table in TABLES if table != "events")
    prunes = writer.stats.prunes

    clocks.jump(jump_s)
    run(writer, clocks, 10 * 60)

    assert writer.stats.prunes > prunes  # it pruned after the jump ...
    assert missing(before, writer.path) == {}  # ... and every row written before it is still there
    # The readings after the jump are written, kept, counted as ahead, and the jump is measured.
    assert count(writer.path, "host_raw") == len(before["host_raw"]) + 120
    assert writer.retention_clock.ahead_readings == 120
    assert writer.retention_clock.wall_offset_s == pytest.approx(jump_s)


def test_after_a_forward_jump_rows_go_when_they_are_really_old(writer: HistoryWriter, clocks: Clocks) -> None:
    run(writer, clocks, HOUR)
    first_hour = {row[0] for row in contents(writer.path)["host_raw"]}
    clocks.jump(8 * DAY)

    run(writer, clocks, RAW_KEEP_S - HOUR)  # the first hour is not yet 6 h old: kept
    assert first_hour <= {row[0] for row in contents(writer.path)["host_raw"]}
    run(writer, clocks, HOUR + 10 * 60)  # now it is
    assert not first_hour & {row[0] for row in contents(writer.path)["host_raw"]}
    assert count(writer.path, "host_1m") > 0


def test_without_a_jump_the_retention_applies_as_before(writer: HistoryWriter, clocks: Clocks) -> None:
    run(writer, clocks, RAW_KEEP_S + HOUR)
    stamps = sorted(row[0] for row in contents(writer.path)["host_raw"])
    assert stamps[0] >= clocks.wall() - RAW_KEEP_S
    assert stamps[0] < clocks.wall() - RAW_KEEP_S + 5 * 60  # pruned at most one write's worth late


def test_a_restart_with_the_wall_clock_a_year_ahead_deletes_nothing(tmp_path: Path, clocks: Clocks) -> None:
    path = tmp_path / "history.sqlite"
    first = HistoryWriter(path, inventory(1), "test", STEP, clock=clocks.wall, monotonic=clocks.monotonic,
                          accounting=Tallies())
    first.open()
    run(first, clocks, HOUR)
    first.stop()
    before = contents(path)

    # A bad RTC at boot: the next server starts with the wall clock a year ahead (and a new monotonic clock).
    clocks.jump(YEAR)
    clocks.monotonic_s = 5.0
    second = HistoryWriter(path, inventory(1), "test", STEP, clock=clocks.wall, monotonic=clocks.monotonic)
    second.open()
    try:
        run(second, clocks, 10 * 60)
        assert second.stats.prunes > 0
    finally:
        second.stop()

    assert missing(before, path) == {}


# ------------------------------------------------------------------------------------------------ backward


def tier_consistent(path: Path, mark_s: float) -> None:
    """From the raw tables' low-water mark on, each 10 s bucket counts exactly the raw readings in it, and each
    1 min bucket the readings of its 10 s buckets: no reading is counted twice."""
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        mismatched = connection.execute(
            "SELECT b.t, b.n, (SELECT count(*) FROM host_raw r WHERE r.t >= b.t AND r.t < b.t + 10) FROM host_10s b"
            " WHERE b.t >= ? AND b.n != (SELECT count(*) FROM host_raw r WHERE r.t >= b.t AND r.t < b.t + 10)",
            (mark_s,)).fetchall()
        assert mismatched == []
        mismatched = connection.execute(
            "SELECT m.t FROM host_1m m WHERE m.t >= ? AND m.n != (SELECT sum(n) FROM host_10s s"
            " WHERE s.t >= m.t AND s.t < m.t + 60)", (mark_s,)).fetchall()
        assert mismatched == []
        assert connection.execute("SELECT count(*) - count(DISTINCT t) FROM host_raw").fetchone()[0] == 0
    finally:
        connection.close()


def raw_mark(path: Path) -> float:
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        return float(connection.execute("SELECT value FROM meta WHERE key = 'pruned_before:host_raw'").fetchone()[0])
    finally:
        connection.close()


@pytest.mark.parametrize("jump_s", [7 * HOUR, 3 * DAY], ids=["7h", "3d"])
def test_a_backward_jump_keeps_the_tiers_and_duplicates_nothing(writer: HistoryWriter, clocks: Clocks,
                                                                 jump_s: float) -> None:
    run(writer, clocks, 8 * HOUR)  # the first 2 h of raw readings are pruned; their buckets stay in the tiers
    mark = raw_mark(writer.path)
    assert mark == pytest.approx(T0 + 2 * HOUR, abs=5 * 60)
    # What must not change: every reading, and every bucket before the mark (one from the mark on is recomputed
    # from its complete source when late readings land in it: checked by tier_consistent).
    buckets = count(writer.path, "host_10s")
    before = {table: rows if table.endswith("raw") else {row for row in rows if row[0] < mark}
              for table, rows in contents(writer.path).items()}

    # Back in time, half a reading off the old stamps, with other values: the new readings fall into buckets
    # whose raw readings were pruned (7 h) or before everything (3 d).
    clocks.jump(-jump_s - STEP / 2)
    run(writer, clocks, 90 * 60, utilization=90.0)

    assert missing(before, writer.path) == {}  # no reading or bucket written before the jump is gone or changed
    new = {row for row in contents(writer.path)["host_raw"] if row[0] % STEP}
    assert len(new) == 90 * 60 / STEP  # every reading after it is kept ...
    assert writer.retention_clock.ahead_readings == 0
    tier_consistent(writer.path, mark)  # ... and counted once in the tiers where its bucket is complete
    if jump_s > 8 * HOUR:  # before everything: the new readings make new buckets
        assert count(writer.path, "host_10s") == buckets + 90 * 6


def test_a_backward_then_forward_jump_deletes_nothing(writer: HistoryWriter, clocks: Clocks) -> None:
    run(writer, clocks, HOUR)
    before = contents(writer.path)
    clocks.jump(-2 * DAY)
    run(writer, clocks, 10 * 60)
    clocks.jump(2 * DAY + 8 * DAY)
    run(writer, clocks, 10 * 60)
    assert missing(before, writer.path) == {}


def test_ahead_readings_are_those_past_the_tolerance(writer: HistoryWriter, clocks: Clocks) -> None:
    clocks.jump(AHEAD_TOLERANCE_S / 2)
    run(writer, clocks, 60, write_every=1)
    assert writer.retention_clock.ahead_readings == 0
    clocks.jump(AHEAD_TOLERANCE_S)
    run(writer, clocks, 60, write_every=1)
    assert writer.retention_clock.ahead_readings == 12


# ------------------------------------------------------------------------------------------------ failures


def test_a_failed_write_keeps_its_readings_and_tallies_until_a_write_succeeds(writer: HistoryWriter,
                                                                               clocks: Clocks) -> None:
    run(writer, clocks, 60)
    assert count(writer.path, "host_raw") == 12
    other = sqlite3.connect(uri(writer.path, "rw"), uri=True)
    try:
        # The disk "fills": every insert into host_raw fails, as SQLITE_FULL would.
        other.execute("CREATE TRIGGER full BEFORE INSERT ON host_raw BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        other.commit()
        failed_at = clocks.wall()
        writer.accounting = tallies = Tallies()
        run(writer, clocks, 60)
        run(writer, clocks, 60)
        assert count(writer.path, "host_raw") == 12
        assert count(writer.path, "accounting") == 1
        assert writer.stats.failing_since == failed_at + 60
        assert writer.stats.failed_writes == 2
        assert writer.stats.queued == 24
        assert writer.stats.last_error is not None
        assert "disk full" in writer.stats.last_error
        assert tallies.restored == 2

        other.execute("DROP TRIGGER full")
        other.commit()
    finally:
        other.close()
    run(writer, clocks, 60)
    assert count(writer.path, "host_raw") == 48  # the 24 readings held while it failed, and 12 more
    assert count(writer.path, "gpu_raw") == 48
    assert writer.stats.failing_since is None
    assert writer.stats.failed_writes == 0
    assert writer.stats.queued == 0
    rows = contents(writer.path)["accounting"]
    assert sorted(row[8] for row in rows) == [60.0 + 60.0]  # allocated_s: the first tally and the held one
