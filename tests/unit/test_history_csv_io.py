"""The history as nvidia-smi CSV, both ways: an export read back by the import exports identically, an import
adds nothing twice, skips bad lines by number, numbers GPUs named only by UUID, and readings older than the raw
window are exported as their 10 s bucket means.

The CSV layout itself is covered by ``test_nvsmi_csv.py``; here the text goes through a real history file.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from nvdash.cli import import_parser
from nvdash.commands.import_ import run_import
from nvdash.history.csv_io import export_lines, import_log
from nvdash.history.query import SqliteHistory
from nvdash.history.ranges import TimeRange
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot

MIB = 1 << 20
HOUR = 3600.0
T0 = 1_699_999_200.0
"""2023-11-14 22:00:00 UTC: a whole hour, so 10 s buckets start on it."""

ROUND_TRIP_FIELDS = ("timestamp,index,name,uuid,pci.bus_id,driver_version,pstate,temperature.gpu,utilization.gpu,"
                     "memory.total,memory.reserved,memory.used,memory.free,power.draw,enforced.power.limit,clocks.sm,"
                     "clocks.mem,clocks_event_reasons.active,ecc.errors.corrected.volatile.total")


def gpu_info(index: int) -> GpuInfo:
    return GpuInfo(index=index, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-5117a0e{index}-6d1c-4a7e-9b0f-3c2d1e0f9a8b",
                   memory_total_bytes=81559 * MIB, pcie_generation=5, pcie_width=16, pcie_max_bytes_per_s=None,
                   nvlink_links=0, nvlink_max_bytes_per_s=None, pci_bus_id=f"00000000:{0x18 + 0x11 * index:02X}:00.0")


def inventory(gpus: int) -> Inventory:
    return Inventory(host=HostInfo(hostname="node1", cpu_count=64, memory_total_bytes=512 << 30),
                     gpus=tuple(gpu_info(g) for g in range(gpus)), driver_version="550.54.15")


def write(path: Path, snapshots: Sequence[Snapshot], gpus: int, interval_s: float) -> None:
    writer = HistoryWriter(path, inventory(gpus), "test", interval_s)
    writer.open()
    try:
        for snapshot in snapshots:
            writer.submit(snapshot)
        writer.flush()
    finally:
        writer.stop()


def export(path: Path, chosen: TimeRange, fields: str, layout: str = "csv") -> list[str]:
    history = SqliteHistory(path)
    try:
        return list(export_lines(history, chosen, fields_text=fields, layout=layout, gpus=None))
    finally:
        history.close()


def rows(path: Path, sql: str) -> list[Any]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def local(time_s: float) -> str:
    """nvidia-smi's timestamp of a whole-millisecond time, in local time."""
    whole = math.floor(time_s)
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(whole)) + f".{round((time_s - whole) * 1000):03d}"


def local_epoch(text: str) -> float:
    """Epoch seconds of a local wall-clock time written ``YYYY-MM-DD HH:MM:SS``."""
    return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))


# ------------------------------------------------------------------------------------------------ round trip


def _round_trip_sample(g: int, i: int) -> GpuSample:
    return GpuSample(
        index=g,
        utilization_pct=97.4 - 3.3 * i if g == 0 else float(i % 4) * 12.5,
        memory_used_bytes=(70_123 + 17 * i) * MIB + 777 * g,
        memory_total_bytes=None if g == 2 else 81559 * MIB,
        memory_reserved_bytes=620 * MIB + 5,
        temperature_c=45.0 + 0.4 * i + g,
        power_w=None if g == 1 else 512.345 + 1.01 * i,
        power_limit_w=700.0,
        pstate=(0, 2, 8)[g],
        clock_sm_mhz=1980.0 - 15.5 * (i % 3),
        clock_memory_mhz=2619.0,
        clock_event_reasons=(0, 0x1, 0x4, 0x1F4)[(i + g) % 4],
        ecc_corrected_volatile=i // 7 if g != 2 else None,
    )


def _round_trip_snapshots() -> list[Snapshot]:
    return [Snapshot(T0 + 0.5 * i + 0.1 + 0.013 * (i % 3), gpus=tuple(_round_trip_sample(g, i) for g in range(3)),
                     host=HostSample(cpu_pct=10.0)) for i in range(20)]


def test_export_import_export_is_identical(tmp_path: Path) -> None:
    recorded, imported = tmp_path / "recorded.sqlite", tmp_path / "imported.sqlite"
    write(recorded, _round_trip_snapshots(), gpus=3, interval_s=0.5)
    chosen = TimeRange(T0 - 60, T0 + 60, "custom")

    first = export(recorded, chosen, ROUND_TRIP_FIELDS)
    added, present, parsed = import_log(imported, first, "import:gpus.csv")
    second = export(imported, chosen, ROUND_TRIP_FIELDS)

    assert parsed.errors == []
    assert (added, present) == (60, 0)
    assert len(first) == 1 + 3 * 20
    assert "\n".join(second) == "\n".join(first)
    # What the export says, written out by hand for the first round of GPU 1 (no power reading) and GPU 2 (no
    # memory total reading: the inventory's).
    assert first[0] == (
        "timestamp, index, name, uuid, pci.bus_id, driver_version, pstate, temperature.gpu, utilization.gpu [%], "
        "memory.total [MiB], memory.reserved [MiB], memory.used [MiB], memory.free [MiB], power.draw [W], "
        "enforced.power.limit [W], clocks.current.sm [MHz], clocks.current.memory [MHz], "
        "clocks_event_reasons.active, ecc.errors.corrected.volatile.total")
    stamp = local(T0 + 0.1)
    assert first[1 + 1] == (
        f"{stamp}, 1, NVIDIA H100 80GB HBM3, GPU-5117a0e1-6d1c-4a7e-9b0f-3c2d1e0f9a8b, 00000000:29:00.0, 550.54.15, "
        "P2, 46, 0 %, 81559 MiB, 620 MiB, 70123 MiB, 10816 MiB, [N/A], 700.00 W, 1980 MHz, 2619 MHz, "
        "0x0000000000000001, 0")
    assert first[1 + 2] == (
        f"{stamp}, 2, NVIDIA H100 80GB HBM3, GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b, 00000000:3A:00.0, 550.54.15, "
        "P8, 47, 0 %, 81559 MiB, 620 MiB, 70123 MiB, 10816 MiB, 512.35 W, 700.00 W, 1980 MHz, 2619 MHz, "
        "0x0000000000000004, [N/A]")


NEW_READING_FIELDS = ("timestamp,index,power.limit,enforced.power.limit,utilization.encoder,utilization.decoder,"
                      "nvdash.gpm.fp64_active,nvdash.gpm.fp32_active,nvdash.gpm.fp16_active,"
                      "nvdash.violation_time.power,nvdash.violation_time.thermal,nvdash.violation_time.sync_boost,"
                      "nvdash.violation_time.board_limit,nvdash.violation_time.low_utilization,"
                      "nvdash.violation_time.reliability,nvdash.nvlink.errors.crc_flit,nvdash.nvlink.errors.crc_data,"
                      "nvdash.nvlink.errors.replay,nvdash.nvlink.errors.recovery")
NEW_COLUMNS = ("power_management_limit_w", "power_limit_w", "encoder_utilization_pct", "decoder_utilization_pct",
               "gpm_fp64_active_pct", "gpm_fp32_active_pct", "gpm_fp16_active_pct", "violation_power_ns",
               "violation_thermal_ns", "violation_sync_boost_ns", "violation_board_limit_ns",
               "violation_low_utilization_ns", "violation_reliability_ns", "nvlink_crc_flit_errors",
               "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors")


def _new_readings(i: int) -> GpuSample:
    """Every reading this release adds, each a different value (a counter rising), the GPM pipes unknown at i=1."""
    return GpuSample(
        index=0, power_limit_w=400.0, power_management_limit_w=700.0,
        encoder_utilization_pct=10.0 + i, decoder_utilization_pct=20.0 + i,
        gpm_fp64_active_pct=None if i == 1 else 1.0 + i, gpm_fp32_active_pct=None if i == 1 else 30.0 + i,
        gpm_fp16_active_pct=None if i == 1 else 5.0 + i,
        violation_power_ns=1_500_000_000_123 + 250_000_000 * i, violation_thermal_ns=7_000_000 * i,
        violation_sync_boost_ns=0, violation_board_limit_ns=3 + i, violation_low_utilization_ns=4_000_000_000 + i,
        violation_reliability_ns=5, nvlink_crc_flit_errors=11 + i, nvlink_crc_data_errors=12,
        nvlink_replay_errors=13 + 2 * i, nvlink_recovery_errors=0)


def test_the_new_readings_go_out_and_come_back_unchanged(tmp_path: Path) -> None:
    recorded, imported = tmp_path / "recorded.sqlite", tmp_path / "imported.sqlite"
    write(recorded, [Snapshot(T0 + i, gpus=(_new_readings(i),), host=HostSample()) for i in range(3)],
          gpus=1, interval_s=1.0)
    chosen = TimeRange(T0 - 60, T0 + 60, "custom")

    first = export(recorded, chosen, NEW_READING_FIELDS)
    added, _present, parsed = import_log(imported, first, "import:new.csv")
    second = export(imported, chosen, NEW_READING_FIELDS)

    assert parsed.errors == []
    assert parsed.ignored_fields == []
    assert added == 3
    assert "\n".join(second) == "\n".join(first)
    assert first[0].split(", ")[2:5] == ["power.limit [W]", "enforced.power.limit [W]", "utilization.encoder [%]"]
    assert "nvdash.violation_time.power [ns]" in first[0]
    assert first[2].split(", ")[2:] == [
        "700.00 W", "400.00 W", "11 %", "21 %", "[N/A]", "[N/A]", "[N/A]", "1500250000123 ns", "7000000 ns",
        "0 ns", "4 ns", "4000000001 ns", "5 ns", "12", "12", "15", "0"]
    assert rows(imported, f"SELECT {', '.join(NEW_COLUMNS)} FROM gpu_raw ORDER BY t") == [
        (700.0, 400.0, 10.0 + i, 20.0 + i, None if i == 1 else 1.0 + i, None if i == 1 else 30.0 + i,
         None if i == 1 else 5.0 + i, 1_500_000_000_123 + 250_000_000 * i, 7_000_000 * i, 0, 3 + i,
         4_000_000_000 + i, 5, 11 + i, 12, 13 + 2 * i, 0)
        for i in range(3)]


def test_a_log_without_the_new_fields_imports_with_them_unknown(tmp_path: Path) -> None:
    """A log nvidia-smi (or an older nvdash) wrote: the readings it has land, the others are unknown, not zero."""
    path = tmp_path / "history.sqlite"
    log = ["timestamp, index, utilization.gpu [%], power.draw [W], enforced.power.limit [W]",
           "2024/01/15 10:23:45.123, 0, 97 %, 512.34 W, 700.00 W"]
    added, _present, parsed = import_log(path, log, "import:old.csv")
    assert (added, parsed.errors) == (1, [])
    ((utilization, power, requested, enforced, *new),) = rows(
        path, f"SELECT utilization_pct, power_w, {', '.join(NEW_COLUMNS)} FROM gpu_raw")
    assert (utilization, power, requested, enforced) == (97.0, 512.34, None, 700.0)
    assert new == [None] * (len(NEW_COLUMNS) - 2)
    (exported,) = export(path, TimeRange(0, 2e9, "custom"), NEW_READING_FIELDS, layout="csv,noheader")
    assert exported.split(", ")[2:] == ["[N/A]", "700.00 W", *["[N/A]"] * (len(NEW_COLUMNS) - 2)]


def test_the_same_log_imported_twice_adds_nothing_the_second_time(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    log = [
        "timestamp, index, uuid, utilization.gpu [%], memory.used [MiB], power.draw [W]",
        "2024/01/15 10:23:45.123, 0, GPU-a, 97 %, 70123 MiB, 512.34 W",
        "2024/01/15 10:23:45.131, 1, GPU-b, 0 %, 4 MiB, 70.50 W",
        "2024/01/15 10:23:46.140, 0, GPU-a, 100 %, 70125 MiB, 689.07 W",
        "2024/01/15 10:23:46.148, 1, GPU-b, 0 %, 4 MiB, 70.12 W",
    ]

    first = import_log(path, log, "import:gpus.csv")
    stored = rows(path, "SELECT * FROM gpu_raw ORDER BY t, gpu")
    second = import_log(path, log, "import:gpus.csv")

    assert first[:2] == (4, 0)
    assert second[:2] == (0, 4)
    assert rows(path, "SELECT * FROM gpu_raw ORDER BY t, gpu") == stored
    assert len(stored) == 4
    assert rows(path, "SELECT count(*) FROM sessions") == [(1,)]
    assert rows(path, "SELECT sum(n) FROM gpu_10s") == [(4,)]


def test_bad_lines_are_skipped_and_reported_by_line_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.sqlite"
    log = [
        "timestamp, index, utilization.gpu [%], memory.used [MiB]",  # 1
        "2024/01/15 10:00:00.000, 0, 10 %, 100 MiB",  # 2
        "this line is garbage",  # 3
        "2024/01/15 10:00:01.000, 0, 20 %, 200 MiB",  # 4
        "2024/01/15 10:00:02.000, 0, lots %, 300 MiB",  # 5: a value that is not one
        "2024/01/15 10:00:03.000, 0, 40 %",  # 6: a value missing
        "2024/01/15 25:00:04.000, 0, 50 %, 500 MiB",  # 7: no such hour
        "",  # 8: blank lines are not errors
        "2024/01/15 10:00:05.000, 0, 60 %, 600 MiB",  # 9
    ]

    added, present, parsed = import_log(path, log, "import:gpus.csv")

    assert (added, present) == (3, 0)
    assert [number for number, _ in parsed.errors] == [3, 5, 6, 7]
    assert all(reason and "\n" not in reason for _, reason in parsed.errors)
    assert rows(path, "SELECT t, gpu, utilization_pct, memory_used_bytes FROM gpu_raw ORDER BY t") == [
        (local_epoch("2024-01-15 10:00:00"), 0, 10.0, 100.0 * MIB),
        (local_epoch("2024-01-15 10:00:01"), 0, 20.0, 200.0 * MIB),
        (local_epoch("2024-01-15 10:00:05"), 0, 60.0, 600.0 * MIB),
    ]

    # The command reports each skipped line by its number.
    log_file = tmp_path / "gpus.csv"
    log_file.write_text("\n".join(log) + "\n", encoding="utf-8")
    status = run_import(import_parser().parse_args([str(log_file), "--history", str(tmp_path / "other.sqlite")]), {})
    captured = capsys.readouterr()
    assert status == 0
    for number in (3, 5, 6, 7):
        assert f"{log_file}:{number}: skipped" in captured.err
    assert f"{log_file}:9:" not in captured.err
    assert "imported 3 readings" in captured.out


def test_a_log_without_index_numbers_gpus_by_first_appearance(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    log = [
        "timestamp, uuid, name, utilization.gpu [%], memory.total [MiB]",
        "2024/01/15 10:00:00.000, GPU-zzzz, Tesla T4, 11 %, 15360 MiB",
        "2024/01/15 10:00:00.010, GPU-aaaa, NVIDIA L4, 22 %, 23034 MiB",
        "2024/01/15 10:00:01.000, GPU-zzzz, Tesla T4, 33 %, 15360 MiB",
        "2024/01/15 10:00:01.010, GPU-aaaa, NVIDIA L4, 44 %, 23034 MiB",
        "2024/01/15 10:00:01.020, GPU-mmmm, NVIDIA A10, 55 %, 23028 MiB",
    ]

    import_log(path, log, "import:mixed.csv")

    assert rows(path, "SELECT gpu, utilization_pct FROM gpu_raw ORDER BY t") == [
        (0, 11.0), (1, 22.0), (0, 33.0), (1, 44.0), (2, 55.0)]
    recorded = SqliteHistory(path).inventory()
    assert recorded is not None
    assert [(gpu.index, gpu.uuid, gpu.name, gpu.memory_total_bytes) for gpu in recorded.gpus] == [
        (0, "GPU-zzzz", "Tesla T4", 15360 * MIB), (1, "GPU-aaaa", "NVIDIA L4", 23034 * MIB),
        (2, "GPU-mmmm", "NVIDIA A10", 23028 * MIB)]


# ------------------------------------------------------------------------------------------------ past the raw window


def _utilization(i: int) -> float:
    return 5.0 * (i % 17)


def _power(i: int) -> float:
    return 100.0 + (i % 9)


def test_readings_older_than_the_raw_window_export_as_10_s_bucket_means(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    times = [T0 + 2.0 * i for i in range(int(8 * HOUR / 2))]
    write(path, [Snapshot(t, gpus=(GpuSample(index=0, utilization_pct=_utilization(i), power_w=_power(i)),),
                          host=HostSample()) for i, t in enumerate(times)], gpus=1, interval_s=2.0)
    history = SqliteHistory(path)
    extent = history.extent()
    assert extent is not None

    lines = export(path, TimeRange(extent[0], extent[1], "all"), "timestamp,index,utilization.gpu,power.draw",
                   layout="csv,noheader,nounits")

    raw_first = min(t for t in times if t >= times[-1] - 6 * HOUR)  # the raw rows kept: the last 6 hours
    assert raw_first > T0 + HOUR
    buckets: dict[float, list[int]] = {}
    for i, t in enumerate(times):
        buckets.setdefault(math.floor(t / 10) * 10, []).append(i)
    expected = []
    for start in sorted(buckets):
        if start + 10 > raw_first:  # a bucket reaching into the raw window is written as its raw readings
            break
        indices = buckets[start]
        utilization = sum(_utilization(i) for i in indices) / len(indices)
        power = sum(_power(i) for i in indices) / len(indices)
        expected.append(f"{local(start)}, 0, {round(utilization)}, {power:.2f}")
    tier_lines = len(expected)
    expected += [f"{local(t)}, 0, {round(_utilization(i))}, {_power(i):.2f}"
                 for i, t in enumerate(times) if t >= raw_first]

    assert tier_lines > 600
    assert lines[:tier_lines] == expected[:tier_lines]
    assert lines[tier_lines:] == expected[tier_lines:]
    assert datetime.strptime(lines[tier_lines - 1][:19], "%Y/%m/%d %H:%M:%S").timestamp() < raw_first
