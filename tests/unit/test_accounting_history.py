"""The accounting table in the history file: tallies added per hour, kept past the readings, read back by range."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nvdash.accounting.accountant import Accountant
from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import Key, Tally
from nvdash.history import accounting_table
from nvdash.history.database import open_database
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from nvdash.sampling.usage_records import Usage
from tests.unit.test_history_store import inventory

GiB = 1 << 30
H = 3600.0
T0 = 1_790_000_000.0 - 1_790_000_000.0 % H  # the start of an hour
JOB = Owner("slurm", "555", "alice", "physics")
NOTEBOOK = Owner("user", "bob", "bob", "chemistry")


def tally(start: float, end: float, allocated: float, energy_j: float, peak: int | None) -> Tally:
    return Tally(start_s=start, end_s=end, allocated_s=allocated, busy_s=allocated, activity_known_s=allocated,
                 energy_j=energy_j, energy_known_s=allocated, peak_memory_bytes=peak)


def test_storing_adds_to_the_hour_and_a_range_adds_up_its_hours(tmp_path: Path) -> None:
    connection = open_database(tmp_path / "h.sqlite")
    first: dict[Key, Tally] = {(JOB, 0, T0): tally(T0 + 10, T0 + 20, 10.0, 100.0, 2 * GiB)}
    again: dict[Key, Tally] = {(JOB, 0, T0): tally(T0 + 20, T0 + 30, 10.0, 50.0, GiB),  # a restarted server
                               (JOB, 0, T0 + H): tally(T0 + H, T0 + H + 5, 5.0, 20.0, None),
                               (NOTEBOOK, 1, T0 + 2 * H): tally(T0 + 2 * H, T0 + 2 * H + 9, 9.0, 9.0, GiB)}
    accounting_table.store(connection, first)
    accounting_table.store(connection, again)
    totals = {(owner, gpu): t for owner, gpu, t in accounting_table.totals(connection, T0, T0 + 3 * H)}
    job = totals[(JOB, 0)]
    assert (job.allocated_s, job.energy_j) == (25.0, 170.0)
    assert (job.start_s, job.end_s) == (T0 + 10, T0 + H + 5)
    assert job.peak_memory_bytes == 2 * GiB, "the larger peak; an unknown one changes nothing"
    assert totals[(NOTEBOOK, 1)].allocated_s == 9.0
    # A range holds every hour it overlaps: from the middle of the first hour, up to the start of the third.
    later = {owner: t for owner, _, t in accounting_table.totals(connection, T0 + 1800, T0 + 2 * H)}
    assert set(later) == {JOB}
    assert later[JOB].allocated_s == 25.0
    assert accounting_table.prune(connection, T0 + H + 1) == 1, "the hour that ended before the cutoff"
    assert {o for o, _, _ in accounting_table.totals(connection, T0, T0 + 3 * H)} == {JOB, NOTEBOOK}


def test_a_history_written_before_the_table_existed_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    open_database(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE accounting")
    reader = open_database(path, read_only=True)
    assert accounting_table.totals(reader, 0, T0) == [], "read-only: an empty table stands in for it"
    reader.close()
    writer = open_database(path)
    assert accounting_table.has_table(writer)


def snapshot(time_s: float, energy_mj: int) -> Snapshot:
    gpu = GpuSample(index=0, utilization_pct=50.0, memory_used_bytes=GiB, energy_mj=energy_mj)
    return Snapshot(time_s=time_s, gpus=(gpu,), host=HostSample(), usage=Usage(time_s=T0))


def test_the_writer_stores_the_accountants_tallies_and_keeps_them_when_the_disk_fails(tmp_path: Path) -> None:
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "0").write_text("555\n")
    accountant = Accountant({0: inventory().gpus[0].uuid}, job_mapping_dir=tmp_path / "map")
    path = tmp_path / "h.sqlite"
    writer = HistoryWriter(path, inventory(), "test", 1.0, accounting=accountant)
    writer.open()
    for second in range(4):
        accountant.step(snapshot(T0 + second, 1000 * second))
    writer.flush()
    reader = open_database(path, read_only=True)
    [(owner, gpu, stored)] = accounting_table.totals(reader, T0, T0 + H)
    assert (owner.job, gpu, stored.allocated_s, stored.energy_j) == ("555", 0, 3.0, 3.0)
    assert accountant.tallies() == [], "drained into the file"

    accountant.step(snapshot(T0 + 4, 4000))
    assert writer._connection is not None
    writer._connection.execute("PRAGMA query_only = ON")  # every write now fails, as on a read-only disk
    writer.flush()
    assert writer.stats.errors == 1
    [(_, _, kept)] = accountant.tallies()
    assert kept.allocated_s == 1.0, "what could not be written is given back"
    writer._connection.execute("PRAGMA query_only = OFF")
    writer.flush()
    [(_, _, stored)] = accounting_table.totals(reader, T0, T0 + H)
    assert stored.allocated_s == pytest.approx(4.0)
    writer.stop()


def test_the_writer_prunes_hours_older_than_the_accounting_retention(tmp_path: Path) -> None:
    accountant = Accountant({0: inventory().gpus[0].uuid}, retention_s=2 * 86_400.0)
    path = tmp_path / "h.sqlite"
    writer = HistoryWriter(path, inventory(), "test", 1.0, retention_s=86_400.0, accounting=accountant)
    writer.open()
    assert writer._connection is not None
    old, kept = T0 - 3 * 86_400.0, T0 - 86_400.0 - H  # older than 2 days; older than the readings' 1 day only
    accounting_table.store(writer._connection, {(JOB, 0, old): tally(old, old + 60, 60.0, 1.0, None),
                                                (JOB, 0, kept): tally(kept, kept + 60, 60.0, 1.0, None)})
    writer.submit(snapshot(T0, 0))
    writer.flush()
    rows = writer._connection.execute("SELECT hour FROM accounting ORDER BY hour").fetchall()
    assert rows == [(kept,)]
    writer.stop()
