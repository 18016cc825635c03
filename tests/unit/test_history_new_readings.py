"""The readings this release adds, in the history: each kept by its kind (a violation time or an error total is a
counter, a utilization a level) with its unit, and a history file written by the previous version keeps every row
when it gains their columns.

The previous version's file is ``fixtures/history_format1.sql``: that version's own dump of a file it wrote.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from nvdash.history.catalog import METRICS, Kind
from nvdash.history.database import open_database
from nvdash.history.query import SqliteHistory
from nvdash.history.replay import recent_snapshots
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot

T0 = 1_699_999_200.0
"""Where the fixture's readings start (2023-11-14 22:00:00 UTC, a whole hour)."""
FIXTURE = Path(__file__).parent / "fixtures" / "history_format1.sql"
OLD_APPLICATION_ID = 0x6E766461
OLD_USER_VERSION = 1

VIOLATIONS = tuple(f"violation_{policy}_ns" for policy in (
    "power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability"))
NVLINK_ERRORS = tuple(f"nvlink_{counter}_errors" for counter in ("crc_flit", "crc_data", "replay", "recovery"))
LEVELS_PCT = ("encoder_utilization_pct", "decoder_utilization_pct", "gpm_fp64_active_pct", "gpm_fp32_active_pct",
              "gpm_fp16_active_pct")


# ------------------------------------------------------------------------------------------------- the catalogue


@pytest.mark.parametrize("name", VIOLATIONS)
def test_a_violation_time_is_a_counter_in_nanoseconds(name: str) -> None:
    # NVML: nvmlViolationTime_t.violationTime is the time (ns) clocks were held below the requested ones since the
    # driver loaded: a running total, so a bucket keeps its newest value, never a mean of totals.
    metric = METRICS[name]
    assert (metric.kind, metric.unit) == (Kind.COUNTER, "ns")
    assert metric.tier_columns() == (f"{name}_max",)


@pytest.mark.parametrize("name", NVLINK_ERRORS)
def test_an_nvlink_error_total_is_a_counter(name: str) -> None:
    metric = METRICS[name]
    assert (metric.kind, metric.unit) == (Kind.COUNTER, "")


@pytest.mark.parametrize("name", LEVELS_PCT)
def test_a_share_of_time_busy_is_a_level_in_percent(name: str) -> None:
    metric = METRICS[name]
    assert (metric.kind, metric.unit) == (Kind.GAUGE, "%")


def test_the_requested_power_limit_is_a_level_in_watts() -> None:
    assert (METRICS["power_management_limit_w"].kind, METRICS["power_management_limit_w"].unit) == (Kind.GAUGE, "W")


# ----------------------------------------------------------------------------------- a file of the older version


def _old_file(path: Path) -> None:
    connection = sqlite3.connect(path)
    try:
        connection.executescript(FIXTURE.read_text(encoding="utf-8"))
        connection.execute(f"PRAGMA application_id = {OLD_APPLICATION_ID}")
        connection.execute(f"PRAGMA user_version = {OLD_USER_VERSION}")
        connection.commit()
    finally:
        connection.close()
    path.chmod(0o600)


def _columns(path: Path, table: str) -> set[str]:
    connection = sqlite3.connect(path)
    try:
        return {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
    finally:
        connection.close()


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def _inventory() -> Inventory:
    info = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
                   memory_total_bytes=81559 * 2**20, pcie_generation=5, pcie_width=16, pcie_max_bytes_per_s=None,
                   nvlink_links=0, nvlink_max_bytes_per_s=None, pci_bus_id="00000000:18:00.0")
    return Inventory(host=HostInfo("node1", 64, 512 << 30), gpus=(info,), driver_version="550.54.15")


def _new_reading(i: int) -> GpuSample:
    return GpuSample(0, utilization_pct=50.0 + i, power_w=400.0, power_limit_w=600.0, power_management_limit_w=700.0,
                     encoder_utilization_pct=12.0 + i, decoder_utilization_pct=34.0, gpm_fp32_active_pct=22.5,
                     violation_power_ns=9_000_000_000 + 500_000_000 * i, violation_thermal_ns=0,
                     nvlink_crc_flit_errors=3 + i, nvlink_replay_errors=1)


def _write_new(path: Path, start_s: float, count: int) -> None:
    """The current version's writer adds ``count`` readings (its clock just after them: nothing is old enough to
    be pruned)."""
    writer = HistoryWriter(path, _inventory(), "test", 1.0, clock=lambda: start_s + count,
                           monotonic=lambda: 1000.0)
    writer.open()
    try:
        for i in range(count):
            writer.submit(Snapshot(start_s + i, (_new_reading(i),), HostSample(cpu_pct=9.0)))
        writer.flush()
    finally:
        writer.stop()


def test_the_fixture_is_a_file_of_the_older_version(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    _old_file(path)
    assert "utilization_pct" in _columns(path, "gpu_raw")
    assert not (_columns(path, "gpu_raw") & {*VIOLATIONS, *NVLINK_ERRORS, *LEVELS_PCT, "power_management_limit_w"})
    assert "violation_power_ns_max" not in _columns(path, "gpu_10s")


def test_an_older_file_reads_with_the_new_readings_unknown_and_is_left_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    _old_file(path)
    before = path.read_bytes()

    reader = open_database(path, read_only=True)
    try:
        snapshots = recent_snapshots(reader, 10)
    finally:
        reader.close()
    assert [s.gpus[0].utilization_pct for s in snapshots] == [10.0, 11.0, 12.0]
    assert [s.gpus[0].power_limit_w for s in snapshots] == [700.0] * 3
    assert all(s.gpus[0].violation_power_ns is None and s.gpus[0].power_management_limit_w is None
               and s.gpus[0].nvlink_crc_flit_errors is None and s.gpus[0].encoder_utilization_pct is None
               for s in snapshots)
    history = SqliteHistory(path)
    try:
        result = history.query(["violation_power_ns", "utilization_pct"], T0, T0 + 3, step_s=1.0)
    finally:
        history.close()
    assert list(result.series["utilization_pct"][0].mean) == [10.0, 11.0, 12.0]
    assert all(math.isnan(value) for value in result.series["violation_power_ns"][0].maximum)
    assert path.read_bytes() == before, "a reader never changes the file"


def test_an_older_file_gains_the_new_columns_and_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    _old_file(path)
    old_raw = _rows(path, "SELECT t, gpu, utilization_pct, power_w, power_limit_w, energy_mj FROM gpu_raw ORDER BY t")
    old_host = _rows(path, "SELECT * FROM host_raw ORDER BY t")
    old_tier = _rows(path, "SELECT t, n, utilization_pct_mean, energy_mj_max FROM gpu_10s ORDER BY t")
    assert len(old_raw) == 3

    _write_new(path, T0 + 20, 2)

    assert {*VIOLATIONS, *NVLINK_ERRORS, *LEVELS_PCT, "power_management_limit_w"} <= _columns(path, "gpu_raw")
    assert {"violation_power_ns_max", "nvlink_crc_flit_errors_max", "encoder_utilization_pct_mean"} <= _columns(
        path, "gpu_1m")
    assert _rows(path, "SELECT t, gpu, utilization_pct, power_w, power_limit_w, energy_mj FROM gpu_raw"
                       f" WHERE t < {T0 + 20} ORDER BY t") == old_raw
    assert _rows(path, f"SELECT * FROM host_raw WHERE t < {T0 + 20} ORDER BY t") == old_host
    assert _rows(path, f"SELECT t, n, utilization_pct_mean, energy_mj_max FROM gpu_10s WHERE t < {T0 + 20}"
                       " ORDER BY t") == old_tier
    # The past was not read then: unknown, not zero. The new readings are there with their values.
    assert _rows(path, "SELECT t, violation_power_ns, power_management_limit_w, encoder_utilization_pct,"
                       " nvlink_crc_flit_errors FROM gpu_raw ORDER BY t") == [
        (T0, None, None, None, None), (T0 + 1, None, None, None, None), (T0 + 2, None, None, None, None),
        (T0 + 20, 9_000_000_000, 700.0, 12.0, 3), (T0 + 21, 9_500_000_000, 700.0, 13.0, 4)]
    # A counter's bucket keeps the newest total; a level's bucket its mean.
    assert _rows(path, f"SELECT n, violation_power_ns_max, nvlink_crc_flit_errors_max, encoder_utilization_pct_mean,"
                       f" power_management_limit_w_mean, power_limit_w_mean FROM gpu_10s WHERE t = {T0 + 20}") == [
        (2, 9_500_000_000, 4, 12.5, 700.0, 600.0)]

    reader = open_database(path, read_only=True)
    try:
        snapshots = recent_snapshots(reader, 10)
    finally:
        reader.close()
    assert [s.gpus[0].violation_power_ns for s in snapshots] == [None, None, None, 9_000_000_000, 9_500_000_000]
    assert [s.gpus[0].power_management_limit_w for s in snapshots] == [None, None, None, 700.0, 700.0]
