"""The accounting table in the history file: tallies added per hour, kept past the readings, read back by range."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import fields
from pathlib import Path

import pytest

from nvdash.accounting.accountant import Accountant
from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import Key, Tally, hour_of
from nvdash.accounting.stored import totals as read_totals
from nvdash.cli import main
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
    totals = {(owner, gpu): t for owner, gpu, t in read_totals(connection, T0, T0 + 3 * H)}
    job = totals[(JOB, 0)]
    assert (job.allocated_s, job.energy_j) == (25.0, 170.0)
    assert (job.start_s, job.end_s) == (T0 + 10, T0 + H + 5)
    assert job.peak_memory_bytes == 2 * GiB, "the larger peak; an unknown one changes nothing"
    assert totals[(NOTEBOOK, 1)].allocated_s == 9.0
    # A range holds every hour it overlaps: from the middle of the first hour, up to the start of the third.
    later = {owner: t for owner, _, t in read_totals(connection, T0 + 1800, T0 + 2 * H)}
    assert set(later) == {JOB}
    assert later[JOB].allocated_s == 25.0
    assert accounting_table.prune(connection, T0 + H + 1) == 1, "the hour that ended before the cutoff"
    assert {o for o, _, _ in read_totals(connection, T0, T0 + 3 * H)} == {JOB, NOTEBOOK}


def test_a_history_written_before_the_table_existed_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    open_database(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE accounting")
    reader = open_database(path, read_only=True)
    assert read_totals(reader, 0, T0) == [], "read-only: an empty table stands in for it"
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
    [(owner, gpu, stored)] = read_totals(reader, T0, T0 + H)
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
    [(_, _, stored)] = read_totals(reader, T0, T0 + H)
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


OLD_TABLE = (  # the accounting table as nvdash wrote it before it kept the time lost to throttling
    "CREATE TABLE accounting (hour REAL NOT NULL, gpu INTEGER NOT NULL, kind TEXT NOT NULL, job TEXT NOT NULL,"
    " user TEXT NOT NULL, project TEXT NOT NULL, start_s REAL NOT NULL, end_s REAL NOT NULL,"
    " allocated_s REAL NOT NULL, busy_s REAL NOT NULL, activity_known_s REAL NOT NULL, utilization_s REAL NOT NULL,"
    " sm_active_s REAL NOT NULL, sm_known_s REAL NOT NULL, energy_j REAL NOT NULL, energy_known_s REAL NOT NULL,"
    " memory_byte_s REAL NOT NULL, memory_known_s REAL NOT NULL, peak_memory_bytes INTEGER,"
    " PRIMARY KEY (hour, gpu, kind, job, user, project)) WITHOUT ROWID")


def throttled(time_s: float, second: int) -> Snapshot:
    """GPU 0 with its power-cap counter 0.14 s and its thermal counter 0.05 s further each second."""
    gpu = GpuSample(index=0, utilization_pct=100.0, memory_used_bytes=GiB, energy_mj=1000 * second,
                    violation_power_ns=140_000_000 * second, violation_thermal_ns=50_000_000 * second)
    return Snapshot(time_s=time_s, gpus=(gpu,), host=HostSample(), usage=Usage(time_s=T0))


def report_rows(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, object]]:
    assert main(["report", "--history", str(path), "--format", "json", "--from", str(T0 - H), "--to",
                 str(T0 + H)]) == 0
    return {row["key"]: row for row in json.loads(capsys.readouterr().out)["rows"]}


def test_a_history_written_before_the_throttle_columns_keeps_its_rows_and_gains_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.sqlite"
    open_database(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE accounting")
        raw.execute(OLD_TABLE)
        raw.execute("INSERT INTO accounting VALUES (?, 0, 'slurm', '111', 'bob', 'chemistry', ?, ?, 600, 600, 600,"
                    " 300, 0, 0, 6000, 600, 0, 0, NULL)", (T0 - H, T0 - H, T0 - H + 600))
    old = report_rows(path, capsys)["111"]  # read-only, before any writer touched the file
    assert old["gpu_seconds"] == 600.0
    assert (old["power_cap_s"], old["power_cap_pct"], old["thermal_pct"]) == (None, None, None), "not measured"

    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "0").write_text("4242\n")
    accountant = Accountant({0: inventory().gpus[0].uuid}, job_mapping_dir=tmp_path / "map")
    writer = HistoryWriter(path, inventory(), "test", 1.0, accounting=accountant)
    writer.open()
    for second in range(11):
        accountant.step(throttled(T0 + second, second))
    writer.flush()
    writer.stop()
    with sqlite3.connect(path) as raw:
        columns = {row[1] for row in raw.execute("PRAGMA table_info(accounting)")}
        assert {"power_cap_s", "power_cap_known_s", "thermal_s", "thermal_known_s"} <= columns
        assert raw.execute("SELECT count(*) FROM accounting").fetchone()[0] == 2, "the old row kept"
    rows = report_rows(path, capsys)
    assert rows["111"]["gpu_seconds"] == 600.0
    assert rows["111"]["power_cap_pct"] is None, "its hours were not measured: unknown, not 0"
    job = rows["4242"]
    assert (job["gpu_seconds"], job["power_cap_s"], job["power_cap_pct"]) == (10.0, 1.4, 14.0)
    assert (job["thermal_s"], job["thermal_pct"]) == (0.5, 5.0)


def test_stored_throttle_seconds_add_up_per_hour(tmp_path: Path) -> None:
    connection = open_database(tmp_path / "h.sqlite")
    first = Tally(start_s=T0, end_s=T0 + 10, allocated_s=10.0, power_cap_s=1.4, power_cap_known_s=10.0,
                  thermal_s=0.0, thermal_known_s=10.0)
    again = Tally(start_s=T0 + 10, end_s=T0 + 20, allocated_s=10.0, power_cap_s=0.6, power_cap_known_s=10.0)
    accounting_table.store(connection, {(JOB, 0, T0): first})
    accounting_table.store(connection, {(JOB, 0, T0): again})  # a restarted server, the same hour
    [(_, _, stored)] = read_totals(connection, T0, T0 + H)
    assert (stored.power_cap_s, stored.power_cap_known_s) == pytest.approx((2.0, 20.0))
    assert stored.power_cap_pct == pytest.approx(10.0)
    assert (stored.thermal_s, stored.thermal_known_s) == pytest.approx((0.0, 10.0))
    assert stored.thermal_pct == pytest.approx(0.0)


def old_history(path: Path) -> None:
    """A history whose accounting table predates the throttle columns, with one job's row in it."""
    open_database(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE accounting")
        raw.execute(OLD_TABLE)
        raw.execute("INSERT INTO accounting VALUES (?, 0, 'slurm', '111', 'bob', 'chemistry', ?, ?, 600, 600, 600,"
                    " 300, 0, 0, 6000, 600, 0, 0, NULL)", (T0, T0, T0 + 600))


def table_columns(path: Path) -> dict[str, list[tuple[str, str, int, object]]]:
    """Every table's columns: name, type, not-null, default."""
    with sqlite3.connect(path) as raw:
        tables = [row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: [(row[1], row[2], row[3], row[4]) for row in raw.execute(f"PRAGMA table_info({table})")]
                for table in tables}


def test_a_writer_opening_an_older_file_adds_the_throttle_columns_at_once_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old_history(path)
    before = table_columns(path)
    open_database(path).close()  # a writer's open: the schema upgrade, before any tally is stored
    after = table_columns(path)
    added = [column for column in after["accounting"] if column not in before["accounting"]]
    assert added == [(name, "REAL", 1, "0") for name in ("power_cap_s", "power_cap_known_s", "thermal_s",
                                                          "thermal_known_s")]
    assert {table: columns for table, columns in after.items() if table != "accounting"} == \
        {table: columns for table, columns in before.items() if table != "accounting"}, "only accounting changes"
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT busy_s, power_cap_s, power_cap_known_s, thermal_s, thermal_known_s"
                           " FROM accounting").fetchall() == [(600.0, 0.0, 0.0, 0.0, 0.0)], "its row kept"


def test_a_read_only_open_of_an_older_file_reads_the_throttle_columns_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old_history(path)
    pristine = path.read_bytes()
    reader = open_database(path, read_only=True)
    assert reader.execute("SELECT power_cap_s, power_cap_known_s, thermal_s, thermal_known_s FROM accounting"
                          ).fetchall() == [(0.0, 0.0, 0.0, 0.0)]
    [(owner, _, stored)] = read_totals(reader, T0, T0 + H)
    assert (owner.job, stored.allocated_s, stored.energy_j) == ("111", 600.0, 6000.0)
    assert (stored.power_cap_pct, stored.thermal_pct) == (None, None), "never measured: unknown, not 0"
    reader.close()
    assert path.read_bytes() == pristine, "a reader leaves the file as it was"


def test_the_table_has_a_column_for_each_field_of_a_tally_that_adds_up() -> None:
    """The history spells the tallies' columns out (it does not import the accounting): they must stay the
    ``Tally``'s own fields, in its order, and its hours the ledger's."""
    summed = tuple(f.name for f in fields(Tally) if f.name not in ("start_s", "end_s", "peak_memory_bytes"))
    assert summed == accounting_table.SUMMED
    for time_s in (T0, T0 + 1, T0 + H - 0.001, T0 - 0.5, 0.0):
        assert accounting_table.hour_of(time_s) == hour_of(time_s)
