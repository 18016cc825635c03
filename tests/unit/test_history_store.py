"""The history file and its writer: the file format and its checks, the write lock, raw rows, the 10 s and
1 min tiers, events, processes, NVLink states, retention and page reuse, and reading the newest readings back.

Expected tier values are computed here from the readings the tests write (a bucket ``[t, t + step)``: gauges
keep min, arithmetic mean and max, counters their largest value, flags and bitmasks their OR).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nvdash.history.database import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    HistoryError,
    HistoryLocked,
    WriteLock,
    lock_for_writing,
    open_database,
    uri,
)
from nvdash.history.query import SqliteHistory
from nvdash.history.replay import recent_snapshots
from nvdash.history.writer import QUEUE_LIMIT, HistoryWriter
from nvdash.sampling.records import (
    GpuEvent,
    GpuInfo,
    GpuSample,
    HostInfo,
    HostSample,
    Inventory,
    NvLinkSample,
    Snapshot,
)
from nvdash.sampling.usage_records import CgroupIdentity, GpuProcess, HostProcess, Usage
from tests.conftest import wait_for

MIB = 1 << 20
HOUR = 3600.0
T0 = 1_699_999_200.0
"""2023-11-14 22:00:00 UTC: a whole hour, so 10 s and 1 min buckets start on it."""


def gpu_info(index: int) -> GpuInfo:
    return GpuInfo(index=index, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
                   memory_total_bytes=81559 * MIB, pcie_generation=5, pcie_width=16, pcie_max_bytes_per_s=None,
                   nvlink_links=0, nvlink_max_bytes_per_s=None, pci_bus_id=f"00000000:{0x18 + index:02X}:00.0")


def inventory(gpus: int = 1) -> Inventory:
    return Inventory(host=HostInfo(hostname="node1", cpu_count=64, memory_total_bytes=512 << 30),
                     gpus=tuple(gpu_info(index) for index in range(gpus)), driver_version="550.54.15")


class Clocks:
    """A wall clock and a monotonic clock for a writer: time passes on both; the wall clock alone can jump."""

    def __init__(self, wall_s: float) -> None:
        self.wall_s = wall_s
        self.monotonic_s = 1000.0

    def wall(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.monotonic_s

    def advance(self, seconds: float) -> None:
        self.wall_s += seconds
        self.monotonic_s += seconds

    def jump(self, seconds: float) -> None:
        self.wall_s += seconds


def writer_for(path: Path, gpus: int = 1, interval_s: float = 1.0, retention_s: float = 7 * 86_400.0,
               clocks: Clocks | None = None) -> HistoryWriter:
    if clocks is None:
        return HistoryWriter(path, inventory(gpus), "test", interval_s, retention_s=retention_s)
    return HistoryWriter(path, inventory(gpus), "test", interval_s, retention_s=retention_s, clock=clocks.wall,
                         monotonic=clocks.monotonic)


def write(path: Path, snapshots: Sequence[Snapshot], *, gpus: int = 1, interval_s: float = 1.0,
          retention_s: float = 7 * 86_400.0, events: Sequence[GpuEvent] = ()) -> HistoryWriter:
    """Open a writer, write ``snapshots`` (and ``events``) in one flush, close it; returns it for its stats."""
    writer = writer_for(path, gpus, interval_s, retention_s)
    writer.open()
    try:
        for snapshot in snapshots:
            writer.submit(snapshot)
        writer.submit_events(events)
        writer.flush()
    finally:
        writer.stop()
    return writer


def simple(time_s: float, gpus: int = 1, utilization: float = 50.0, cpu: float = 10.0) -> Snapshot:
    return Snapshot(time_s, gpus=tuple(GpuSample(index=g, utilization_pct=utilization + g, power_w=100.0 + g)
                                       for g in range(gpus)),
                    host=HostSample(cpu_pct=cpu, memory_used_bytes=8 << 30))


def rows(path: Path, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
    """Rows of ``sql`` over the file, read with a plain connection (not nvdash's)."""
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        return connection.execute(sql, parameters).fetchall()
    finally:
        connection.close()


def count(path: Path, table: str) -> int:
    return int(rows(path, f"SELECT count(*) FROM {table}")[0][0])


def pragma(path: Path, name: str) -> Any:
    return rows(path, f"PRAGMA {name}")[0][0]


def bucket(time_s: float, step_s: float) -> float:
    return math.floor(time_s / step_s) * step_s


def one_line(error: BaseException) -> str:
    text = str(error)
    assert text
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------------------------ the file


def test_a_new_file_is_an_nvdash_history_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"

    write(path, [simple(T0)])

    header = path.read_bytes()[:100]
    assert header.startswith(b"SQLite format 3\x00")
    assert (header[18], header[19]) == (2, 2)  # file format read and write versions 2: WAL
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID == 0x6E766461
    assert int.from_bytes(header[60:64], "big") == SCHEMA_VERSION == 1
    assert pragma(path, "journal_mode") == "wal"
    assert pragma(path, "application_id") == 0x6E766461
    assert pragma(path, "user_version") == 1


def test_a_history_is_created_in_a_directory_that_does_not_exist_yet(tmp_path: Path) -> None:
    # The default file, $XDG_DATA_HOME/nvdash/history.sqlite, lies in a directory a fresh account does not have.
    path = tmp_path / "data" / "nvdash" / "history.sqlite"

    write(path, [simple(T0)])

    assert count(path, "gpu_raw") == 1
    assert pragma(path, "application_id") == APPLICATION_ID


def test_reopening_a_history_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    write(path, [simple(T0 + i, utilization=float(i)) for i in range(3)])
    write(path, [simple(T0 + 3 + i, utilization=float(10 + i)) for i in range(2)])

    assert rows(path, "SELECT t, utilization_pct FROM gpu_raw ORDER BY t") == [
        (T0, 0.0), (T0 + 1, 1.0), (T0 + 2, 2.0), (T0 + 3, 10.0), (T0 + 4, 11.0)]
    assert count(path, "host_raw") == 5
    assert count(path, "sessions") == 2


def test_a_text_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    content = b"timestamp, index, utilization.gpu [%]\n2024/01/15 10:23:45.123, 0, 97 %\n"
    path.write_bytes(content)

    for read_only in (False, True):
        with pytest.raises(HistoryError) as refused:
            open_database(path, read_only=read_only)
        message = one_line(refused.value)
        assert str(path) in message
        assert "not an nvdash history" in message
    writer = writer_for(path)
    with pytest.raises(HistoryError):
        writer.open()

    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["notes.txt"]
    lock_for_writing(path).release()  # the failed open gave the write lock back


def test_an_sqlite_database_of_another_program_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE bookmarks (url TEXT, title TEXT)")
    other.execute("INSERT INTO bookmarks VALUES ('https://example.org', 'Example')")
    other.commit()
    other.close()
    content = path.read_bytes()

    for read_only in (False, True):
        with pytest.raises(HistoryError) as refused:
            open_database(path, read_only=read_only)
        assert "another program" in one_line(refused.value)
    with pytest.raises(HistoryError):
        writer_for(path).open()

    assert path.read_bytes() == content
    assert rows(path, "SELECT * FROM bookmarks") == [("https://example.org", "Example")]


def test_a_history_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    write(path, [simple(T0)])
    newer = sqlite3.connect(path)
    newer.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    newer.close()
    content = path.read_bytes()

    for read_only in (False, True):
        with pytest.raises(HistoryError) as refused:
            open_database(path, read_only=read_only)
        message = one_line(refused.value)
        assert "newer" in message
        assert str(SCHEMA_VERSION + 1) in message

    assert path.read_bytes() == content


def _damage(path: Path, how: str) -> None:
    size = path.stat().st_size
    if how == "truncated":
        os.truncate(path, size // 2)
        return
    data = bytearray(path.read_bytes())
    start, length = size // 2, size // 8
    data[start:start + length] = (bytes(range(256)) * (length // 256 + 1))[:length]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "overwritten in the middle"])
def test_a_damaged_history_gives_a_history_error(tmp_path: Path, how: str) -> None:
    path = tmp_path / "history.sqlite"
    write(path, [simple(T0 + i, gpus=2, utilization=float(i % 101)) for i in range(3600)], gpus=2)
    _damage(path, how)
    history = SqliteHistory(path)
    reads: list[tuple[str, Callable[[], object]]] = [
        ("extent", history.extent),
        ("the last 30 min", lambda: history.query(["utilization_pct", "host_cpu_pct"], T0 + 1800, T0 + 3600)),
        ("every reading", lambda: history.query(["utilization_pct", "host_cpu_pct"], T0, T0 + 3600, step_s=1.0)),
        ("1 h", lambda: history.query(["power_w"], T0, T0 + HOUR)),
    ]

    failures: list[str] = []
    try:
        open_database(path, read_only=True).close()
    except HistoryError as error:
        failures.append(one_line(error))
    else:
        for name, read in reads:
            try:
                read()
            except HistoryError as error:  # any other exception type fails the test
                failures.append(f"{name}: {one_line(error)}")

    assert failures, "a damaged file read back without any error"


# ------------------------------------------------------------------------------------------------ the lock


def test_a_second_write_lock_is_refused_naming_the_holder_and_released_after(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    first = lock_for_writing(path)

    with pytest.raises(HistoryLocked) as refused:
        lock_for_writing(path)
    message = one_line(refused.value)
    assert f"pid {os.getpid()}" in message
    assert str(path) in message
    assert isinstance(refused.value, HistoryError)

    first.release()
    second = lock_for_writing(path)
    second.release()


def test_a_running_writer_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    writer = writer_for(path)
    writer.open()
    try:
        with pytest.raises(HistoryLocked):
            writer_for(path).open()
    finally:
        writer.stop()
    lock_for_writing(path).release()


HOLDER = """
import signal, sys
from pathlib import Path
from nvdash.history.database import lock_for_writing
lock = lock_for_writing(Path(sys.argv[1]))
signal.pause()
"""


def _try_lock(path: Path) -> WriteLock | None:
    try:
        return lock_for_writing(path)
    except HistoryLocked:
        return None


def test_the_lock_of_a_killed_process_is_released(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    lock_file = path.with_name(path.name + ".lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)])
    try:
        wait_for(lambda: lock_file.read_text() if lock_file.exists() else "",
                 lambda text: text == str(holder.pid), timeout_s=30.0)
        with pytest.raises(HistoryLocked) as refused:
            lock_for_writing(path)
        assert f"pid {holder.pid}" in str(refused.value)

        os.kill(holder.pid, signal.SIGKILL)
        assert holder.wait(timeout=30) == -signal.SIGKILL

        lock = wait_for(lambda: _try_lock(path), lambda taken: taken is not None, timeout_s=10.0)
        assert isinstance(lock, WriteLock)
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)


# ------------------------------------------------------------------------------------------------ raw rows


def test_readings_land_in_the_raw_tables(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    snapshot = Snapshot(T0 + 0.5, gpus=(
        GpuSample(index=0, utilization_pct=97.0, memory_used_bytes=70123 * MIB, power_w=512.34, pstate=0,
                  remap_pending=True, clock_event_reasons=0x4),
        GpuSample(index=1, lost=True, error="GPU is lost"),
    ), host=HostSample(cpu_pct=12.5, memory_used_bytes=8 << 30, net_recv_bytes_per_s=1.5e6))

    write(path, [snapshot], gpus=2)

    assert rows(path, "SELECT t, gpu, lost, utilization_pct, memory_used_bytes, power_w, pstate, remap_pending,"
                      " clock_event_reasons, temperature_c, error FROM gpu_raw ORDER BY gpu") == [
        (T0 + 0.5, 0, 0, 97.0, 70123.0 * MIB, 512.34, 0, 1, 4, None, None),
        (T0 + 0.5, 1, 1, None, None, None, None, None, None, None, "GPU is lost"),
    ]
    assert rows(path, "SELECT t, cpu_pct, memory_used_bytes, net_recv_bytes_per_s, disk_read_bytes_per_s"
                      " FROM host_raw") == [(T0 + 0.5, 12.5, float(8 << 30), 1.5e6, None)]


def test_the_same_reading_imported_twice_is_kept_once(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    writer = writer_for(path)
    writer.open()
    try:
        writer.submit(simple(T0, utilization=30.0, cpu=5.0))
        writer.flush()
        writer.submit(simple(T0, utilization=90.0, cpu=50.0))
        writer.submit(simple(T0 + 1, utilization=60.0, cpu=6.0))
        writer.flush()
    finally:
        writer.stop()

    assert rows(path, "SELECT t, gpu, utilization_pct FROM gpu_raw ORDER BY t") == [(T0, 0, 30.0), (T0 + 1, 0, 60.0)]
    assert rows(path, "SELECT t, cpu_pct FROM host_raw ORDER BY t") == [(T0, 5.0), (T0 + 1, 6.0)]
    assert rows(path, "SELECT t, n, utilization_pct_min, utilization_pct_mean, utilization_pct_max FROM gpu_10s") == [
        (T0, 2, 30.0, 45.0, 60.0)]


# ------------------------------------------------------------------------------------------------ tiers


def _tier_reading(i: int) -> tuple[float, GpuSample, HostSample]:
    """Reading ``i`` of the tier tests: every 0.5 s from T0 + 3 s, values varying by field kind."""
    time_s = T0 + 3.0 + 0.5 * i
    sample = GpuSample(
        index=0,
        utilization_pct=float((i * 37) % 101),
        power_w=50.0 + ((i * 13) % 29) * 0.25,
        memory_used_bytes=(1000 + i) * MIB,
        pcie_tx_bytes_per_s=1.0e6 * (i % 4),
        pcie_rx_bytes_per_s=2.5e5 * (i % 3),
        energy_mj=1000 + 10 * i if i < 100 else 5 * (i - 100),  # the driver was reloaded at reading 100
        ecc_corrected_volatile=(i // 40) if i < 150 else 1,
        clock_event_reasons=(1 << (i % 5)) if i % 3 else 0,
        remap_pending=i == 50,
    )
    host = HostSample(cpu_pct=2.5 * (i % 9), memory_used_bytes=(4096 + i) * MIB)
    return time_s, sample, host


TIER_READINGS = 260


def _tier_snapshots(indices: range) -> list[Snapshot]:
    snapshots = []
    for i in indices:
        time_s, sample, host = _tier_reading(i)
        snapshots.append(Snapshot(time_s, gpus=(sample,), host=host))
    return snapshots


def _expected_gpu_tier(step_s: float) -> list[tuple[Any, ...]]:
    groups: dict[float, list[GpuSample]] = {}
    for i in range(TIER_READINGS):
        time_s, sample, _ = _tier_reading(i)
        groups.setdefault(bucket(time_s, step_s), []).append(sample)
    expected = []
    for start, samples in sorted(groups.items()):
        utilization = [s.utilization_pct for s in samples if s.utilization_pct is not None]
        power = [s.power_w for s in samples if s.power_w is not None]
        pcie = [(s.pcie_tx_bytes_per_s or 0.0) + (s.pcie_rx_bytes_per_s or 0.0) for s in samples]
        reasons = 0
        for s in samples:
            reasons |= s.clock_event_reasons or 0
        expected.append((
            start, 0, len(samples),
            min(utilization), sum(utilization) / len(utilization), max(utilization),
            min(power), sum(power) / len(power), max(power),
            sum(pcie) / len(pcie),
            max(s.energy_mj or 0 for s in samples),
            max(s.ecc_corrected_volatile or 0 for s in samples),
            reasons,
            int(any(s.remap_pending for s in samples)),
            None,
        ))
    return expected


GPU_TIER_COLUMNS = ("t, gpu, n, utilization_pct_min, utilization_pct_mean, utilization_pct_max, power_w_min,"
                    " power_w_mean, power_w_max, pcie_bytes_per_s_mean, energy_mj_max, ecc_corrected_volatile_max,"
                    " clock_event_reasons_or, remap_pending_or, temperature_c_mean")


def _approx(rows_: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for v in row) for row in rows_]


@pytest.mark.parametrize(("table", "step_s"), [("gpu_10s", 10.0), ("gpu_1m", 60.0)])
def test_a_gpu_tier_holds_each_buckets_aggregates(tmp_path: Path, table: str, step_s: float) -> None:
    path = tmp_path / "history.sqlite"
    write(path, _tier_snapshots(range(TIER_READINGS)), interval_s=0.5)

    stored = rows(path, f"SELECT {GPU_TIER_COLUMNS} FROM {table} ORDER BY t")
    expected = _expected_gpu_tier(step_s)

    assert [row[0] for row in stored] == [row[0] for row in expected]
    assert stored == _approx(expected)
    # The readings of the test include a counter reset and a single flagged reading; check those buckets by hand.
    reset = bucket(T0 + 3.0 + 0.5 * 100, step_s)
    assert {row[0]: row[10] for row in stored}[reset] == 1000 + 10 * 99
    flagged = bucket(T0 + 3.0 + 0.5 * 50, step_s)
    assert {row[0] for row in stored if row[13] == 1} == {flagged}


@pytest.mark.parametrize(("table", "step_s"), [("host_10s", 10.0), ("host_1m", 60.0)])
def test_a_host_tier_holds_each_buckets_aggregates(tmp_path: Path, table: str, step_s: float) -> None:
    path = tmp_path / "history.sqlite"
    write(path, _tier_snapshots(range(TIER_READINGS)), interval_s=0.5)

    groups: dict[float, list[HostSample]] = {}
    for i in range(TIER_READINGS):
        time_s, _, host = _tier_reading(i)
        groups.setdefault(bucket(time_s, step_s), []).append(host)
    expected = []
    for start, hosts in sorted(groups.items()):
        cpu = [h.cpu_pct or 0.0 for h in hosts]
        memory = [float(h.memory_used_bytes or 0) for h in hosts]
        expected.append((start, len(hosts), min(cpu), sum(cpu) / len(cpu), max(cpu), max(memory), None))

    stored = rows(path, f"SELECT t, n, host_cpu_pct_min, host_cpu_pct_mean, host_cpu_pct_max,"
                        f" host_memory_used_bytes_max, host_disk_read_bytes_per_s_mean FROM {table} ORDER BY t")
    assert stored == _approx(expected)


def test_a_bucket_written_in_two_flushes_equals_one_written_at_once(tmp_path: Path) -> None:
    whole, parts = tmp_path / "whole.sqlite", tmp_path / "parts.sqlite"
    write(whole, _tier_snapshots(range(TIER_READINGS)), interval_s=0.5)
    writer = writer_for(parts, interval_s=0.5)
    writer.open()
    try:
        for indices in (range(13), range(13, 131), range(131, TIER_READINGS)):  # each split inside a bucket
            for snapshot in _tier_snapshots(indices):
                writer.submit(snapshot)
            writer.flush()
    finally:
        writer.stop()

    for table in ("gpu_10s", "gpu_1m", "host_10s", "host_1m"):
        assert rows(parts, f"SELECT * FROM {table} ORDER BY t") == rows(whole, f"SELECT * FROM {table} ORDER BY t")
    assert rows(parts, f"SELECT {GPU_TIER_COLUMNS} FROM gpu_10s ORDER BY t") == _approx(_expected_gpu_tier(10.0))


# ------------------------------------------------------------------------------- events, processes, NVLink states


def test_events_are_stored(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    events = [
        GpuEvent(time_s=T0 + 1, gpu_index=0, kind="xid", message="XID 79: GPU has fallen off the bus",
                 severity="critical", code=79),
        GpuEvent(time_s=T0 + 2, gpu_index=1, kind="ecc", message="2 new corrected ECC errors", severity="warning",
                 counter="corrected ECC errors"),
        GpuEvent(time_s=T0 + 3, gpu_index=None, kind="health", message="driver reloaded"),
    ]

    write(path, [simple(T0, gpus=2)], gpus=2, events=events)

    assert rows(path, "SELECT t, gpu, kind, severity, code, counter, message FROM events ORDER BY t") == [
        (T0 + 1, 0, "xid", "critical", 79, None, "XID 79: GPU has fallen off the bus"),
        (T0 + 2, 1, "ecc", "warning", None, "corrected ECC errors", "2 new corrected ECC errors"),
        (T0 + 3, None, "health", "info", None, None, "driver reloaded"),
    ]


def _process(pid: int, sm_pct: float, memory: int) -> GpuProcess:
    host = HostProcess(pid=pid, user="alice", command="python train.py --epochs 10", started_s=T0 - 600.0,
                       cgroup=CgroupIdentity(runtime="containerd", container_id="c0ffee" * 10 + "abcd",
                                             slurm_job="4242"))
    return GpuProcess(gpu_index=0, gpu_uuid=gpu_info(0).uuid, pid=pid, kinds=("compute", "graphics"),
                      gpu_memory_bytes=memory, sm_pct=sm_pct, memory_pct=sm_pct / 2, host=host,
                      pod_namespace="research", pod_name="train-0", container_name="trainer")


def test_processes_are_stored_once_per_usage_reading_and_rolled_up_per_minute(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    first = Usage(time_s=T0 + 1.0, processes=(_process(1234, 80.0, 2048 * MIB),))
    second = Usage(time_s=T0 + 5.0, processes=(_process(1234, 60.0, 4096 * MIB),))
    snapshots = [Snapshot(T0 + i, gpus=(GpuSample(index=0, utilization_pct=50.0),), host=HostSample(),
                          usage=first if i < 5 else second) for i in range(1, 9)]

    write(path, snapshots)

    assert rows(path, "SELECT t, gpu, pid, started_s, kinds, gpu_memory_bytes, sm_pct, memory_pct, user, command,"
                      " container_id, pod_namespace, pod_name, container_name, slurm_job FROM processes"
                      " ORDER BY t") == [
        (T0 + 1.0, 0, 1234, T0 - 600.0, "compute,graphics", 2048.0 * MIB, 80.0, 40.0, "alice",
         "python train.py --epochs 10", "c0ffee" * 10 + "abcd", "research", "train-0", "trainer", "4242"),
        (T0 + 5.0, 0, 1234, T0 - 600.0, "compute,graphics", 4096.0 * MIB, 60.0, 30.0, "alice",
         "python train.py --epochs 10", "c0ffee" * 10 + "abcd", "research", "train-0", "trainer", "4242"),
    ]
    assert rows(path, "SELECT t, gpu, pid, n, gpu_memory_bytes_max, sm_pct_mean, memory_pct_mean, user, pod_name"
                      " FROM processes_1m") == [(T0, 0, 1234, 2, 4096.0 * MIB, 70.0, 35.0, "alice", "train-0")]


def _linked(time_s: float, crc: int, active: bool = True) -> Snapshot:
    links = (NvLinkSample(link=0, active=True, crc_flit_errors=crc, crc_data_errors=0, replay_errors=0,
                          recovery_errors=0),
             NvLinkSample(link=1, active=active, crc_flit_errors=0, crc_data_errors=0, replay_errors=0,
                          recovery_errors=0))
    return Snapshot(time_s, gpus=(GpuSample(index=0, nvlinks=links), GpuSample(index=1, nvlinks=links[:1])),
                    host=HostSample())


def test_nvlink_state_is_logged_when_a_link_changes_and_counters_at_most_once_a_minute(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    writer = writer_for(path, gpus=2)
    writer.open()
    try:
        for snapshot in (_linked(T0, 0), _linked(T0 + 1, 0), _linked(T0 + 2, 3)):
            writer.submit(snapshot)
        writer.flush()
        for snapshot in (_linked(T0 + 3, 3), _linked(T0 + 4, 3, active=False), _linked(T0 + 5, 3, active=False),
                         _linked(T0 + 30, 4, active=False), _linked(T0 + 70, 5, active=False)):
            writer.submit(snapshot)
        writer.flush()
    finally:
        writer.stop()

    stored = rows(path, "SELECT t, gpu, links FROM nvlink_state ORDER BY gpu, t")
    # GPU 0: its first state; link 1 going down (at once); the CRC count 64 s after that (a minute has passed).
    # The CRC rises at +2 s and +30 s came within a minute of the row before: not logged.
    # GPU 1 (one link, never down): its first state, then the CRC count at +70 s.
    assert [(t, gpu) for t, gpu, _ in stored] == [(T0, 0), (T0 + 4, 0), (T0 + 70, 0), (T0, 1), (T0 + 70, 1)]
    texts = [json.loads(links) for _, _, links in stored]
    assert 3 not in texts[0][0]
    assert texts[1][1][1] is False  # link 1 down
    assert 3 in texts[1][0]  # the counters as they were when the link went down
    assert 5 in texts[2][0]


# ------------------------------------------------------------------------------------------------ retention


def test_a_prune_deletes_what_is_older_than_the_retention(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    retention = 1 * HOUR
    times = [T0 + i for i in range(int(3 * HOUR))]
    events = [GpuEvent(time_s=T0 + 100, gpu_index=0, kind="xid", message="XID 13", code=13),
              GpuEvent(time_s=T0 + 10_000, gpu_index=0, kind="xid", message="XID 31", code=31)]

    writer = write(path, [simple(t, utilization=float(i % 100)) for i, t in enumerate(times)], retention_s=retention,
                   events=events)

    newest = times[-1]
    raw_horizon = newest - min(6 * HOUR, retention)
    tier_horizon = newest - retention
    kept_raw = [t for t in times if t >= raw_horizon]
    assert [r[0] for r in rows(path, "SELECT t FROM gpu_raw ORDER BY t")] == kept_raw
    assert [r[0] for r in rows(path, "SELECT t FROM host_raw ORDER BY t")] == kept_raw
    removed = 2 * (len(times) - len(kept_raw))
    for table, step in (("10s", 10.0), ("1m", 60.0), ("10m", 600.0)):
        buckets = sorted({bucket(t, step) for t in times})
        kept = [b for b in buckets if b >= tier_horizon]
        assert [r[0] for r in rows(path, f"SELECT t FROM gpu_{table} ORDER BY t")] == kept
        assert [r[0] for r in rows(path, f"SELECT t FROM host_{table} ORDER BY t")] == kept
        removed += 2 * (len(buckets) - len(kept))
    # The kept buckets still hold every reading of them (the newest bucket included).
    assert rows(path, "SELECT n FROM gpu_1m ORDER BY t")[0][0] == 60
    assert [r[0] for r in rows(path, "SELECT code FROM events")] == [31]
    removed += 1
    assert writer.stats.pruned_rows == removed


def _volume(time_s: float, gpus: int) -> list[Snapshot]:
    """An hour of readings every second, varied enough that pages fill as they would with real readings."""
    return [Snapshot(time_s + i, gpus=tuple(
        GpuSample(index=g, utilization_pct=float((i * 7 + g) % 101), power_w=100.0 + (i * 13 + g) % 300 / 7,
                  temperature_c=40.0 + (i + g) % 20, energy_mj=10_000 * i + g, memory_used_bytes=(i * 31 + g) * MIB)
        for g in range(gpus)), host=HostSample(cpu_pct=float(i % 97), memory_used_bytes=(8 << 30) + i * 4096))
        for i in range(int(HOUR))]


def _flush(writer: HistoryWriter, snapshots: Sequence[Snapshot]) -> None:
    for snapshot in snapshots:
        writer.submit(snapshot)
    writer.flush()


def test_pruned_pages_are_reused(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    write(path, [], gpus=16, retention_s=HOUR)
    empty = int(pragma(path, "page_count"))
    clocks = Clocks(T0 + HOUR)
    writer = writer_for(path, gpus=16, retention_s=HOUR, clocks=clocks)
    writer.open()
    try:
        _flush(writer, _volume(T0, 16))
        volume = int(pragma(path, "page_count")) - empty
        assert volume > 4 * 256

        # One reading two hours later: the first hour is past the retention and is pruned.
        clocks.advance(HOUR)
        _flush(writer, [simple(T0 + 2 * HOUR, gpus=16)])
        pages, free = int(pragma(path, "page_count")), int(pragma(path, "freelist_count"))
        assert free + (empty + volume - pages) > volume // 2  # freed: on the free list, or given back

        # The same volume again (nothing pruned this time): it goes into the freed pages, the file grows far less.
        _flush(writer, _volume(T0 + 2 * HOUR + 1, 16))
    finally:
        writer.stop()
    assert count(path, "gpu_raw") == 16 * (int(HOUR) + 1)
    assert int(pragma(path, "freelist_count")) < free
    assert int(pragma(path, "page_count")) - pages < volume // 2


def test_a_prune_gives_freed_pages_back_to_the_file_system(tmp_path: Path) -> None:
    # README: freed pages are reused and returned to the file system gradually; each prune runs
    # PRAGMA incremental_vacuum(256), which gives up to 256 free pages back.
    path = tmp_path / "history.sqlite"
    clocks = Clocks(T0 + HOUR)
    writer = writer_for(path, gpus=8, retention_s=HOUR, clocks=clocks)
    writer.open()
    try:
        _flush(writer, _volume(T0, 8))
        before = int(pragma(path, "page_count"))
        assert before > 2 * 256

        # One reading two hours later: the whole first hour is past the retention and is pruned.
        clocks.advance(2 * HOUR)
        _flush(writer, [simple(T0 + 3 * HOUR, gpus=8)])
    finally:
        writer.stop()
    after, free = int(pragma(path, "page_count")), int(pragma(path, "freelist_count"))

    assert free + (before - after) > 256  # more than 256 pages were freed ...
    assert before - after >= 256 - 16  # ... and 256 of them left the file (less a few the new reading took)


# ------------------------------------------------------------------------------------------------ the writer thread


def test_the_writer_thread_writes_what_is_submitted(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    writer = writer_for(path, gpus=2)
    writer.start()
    try:
        for i in range(5):
            writer.submit(simple(T0 + i, gpus=2))

        def stored() -> int:
            return count(path, "gpu_raw") if path.exists() else 0

        assert wait_for(stored, lambda n: n == 10, timeout_s=20.0) == 10
        assert writer.stats.snapshots == 5
        assert writer.stats.errors == 0
        writer.submit(simple(T0 + 5, gpus=2))  # submitted just before the stop: written by it
    finally:
        writer.stop()
    assert count(path, "host_raw") == 6
    lock_for_writing(path).release()  # stopping released the lock


def test_stop_writes_what_is_queued_without_a_thread(tmp_path: Path) -> None:
    # HistoryWriter.stop: "Write what is queued, stop the thread, close the file and release the lock."
    path = tmp_path / "history.sqlite"
    writer = writer_for(path)
    writer.open()
    writer.submit(simple(T0))
    writer.submit_events([GpuEvent(time_s=T0, gpu_index=0, kind="xid", message="XID 79", code=79)])
    writer.stop()

    assert count(path, "gpu_raw") == 1
    assert count(path, "events") == 1


def test_a_full_queue_drops_the_oldest_snapshots_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    writer = writer_for(path)
    writer.open()
    try:
        for i in range(QUEUE_LIMIT + 5):
            writer.submit(simple(T0 + i))
        assert writer.stats.dropped == 5
        writer.flush()
    finally:
        writer.stop()

    assert rows(path, "SELECT min(t), max(t), count(*) FROM gpu_raw") == [(T0 + 5, T0 + QUEUE_LIMIT + 4, QUEUE_LIMIT)]


# ------------------------------------------------------------------------------------------------ replay


def _full_sample(index: int, i: int) -> GpuSample:
    return GpuSample(
        index=index, lost=False, utilization_pct=90.0 + i, memory_used_bytes=(70_000 + i) * MIB + 123,
        memory_total_bytes=81559 * MIB, pcie_tx_bytes_per_s=1.25e9, pcie_rx_bytes_per_s=2.5e8,
        nvlink_tx_bytes_per_s=4.5e10, nvlink_rx_bytes_per_s=4.25e10, temperature_c=45.0 + index, power_w=512.34,
        memory_reserved_bytes=620 * MIB, memory_temperature_c=51.0, fan_speed_pct=None, power_limit_w=700.0,
        energy_mj=123_456_789_012 + i, pstate=0, clock_graphics_mhz=1980.0, clock_sm_mhz=1980.0,
        clock_memory_mhz=2619.0, clock_video_mhz=1545.0, clock_event_reasons=0x1F4 if index else 0,
        ecc_corrected_volatile=3, ecc_uncorrected_volatile=0, ecc_corrected_aggregate=17,
        ecc_uncorrected_aggregate=1, remapped_rows_corrected=2, remapped_rows_uncorrected=0, remap_pending=index == 1,
        remap_failure=False, retired_pages_sbe=None, retired_pages_dbe=None, retired_pages_pending=None,
        pcie_generation_current=5, pcie_width_current=16, pcie_replay_count=4, nvlink_partial=index == 1,
        gpm_sm_active_pct=71.5, gpm_sm_occupancy_pct=40.25, gpm_tensor_active_pct=33.0, gpm_dram_active_pct=None,
    )


def _full_snapshot(i: int) -> Snapshot:
    return Snapshot(T0 + 0.5 * i, gpus=(_full_sample(0, i), _full_sample(1, i)), host=HostSample(
        cpu_pct=12.5 + i, memory_used_bytes=(200 << 30) + i, memory_total_bytes=512 << 30,
        disk_read_bytes_per_s=1.5e7, disk_write_bytes_per_s=None, net_sent_bytes_per_s=2.0e6,
        net_recv_bytes_per_s=3.0e6))


@pytest.fixture
def replayed(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    path = tmp_path / "history.sqlite"
    write(path, [_full_snapshot(i) for i in range(6)], gpus=2, interval_s=0.5)
    connection = open_database(path, read_only=True)
    yield connection
    connection.close()


def test_recent_snapshots_are_the_newest_readings_as_written(replayed: sqlite3.Connection) -> None:
    snapshots = recent_snapshots(replayed, 3)

    assert snapshots == [_full_snapshot(i) for i in (3, 4, 5)]
    assert recent_snapshots(replayed, 100) == [_full_snapshot(i) for i in range(6)]


def test_recent_snapshots_have_the_types_of_the_records(replayed: sqlite3.Connection) -> None:
    snapshot = recent_snapshots(replayed, 1)[0]
    sample = snapshot.gpus[1]

    for name in ("lost", "remap_pending", "remap_failure", "nvlink_partial"):
        assert type(getattr(sample, name)) is bool, name
    for name in ("memory_used_bytes", "memory_total_bytes", "memory_reserved_bytes", "energy_mj", "pstate",
                 "clock_event_reasons", "ecc_corrected_volatile", "ecc_uncorrected_aggregate",
                 "remapped_rows_corrected", "pcie_generation_current", "pcie_width_current", "pcie_replay_count"):
        assert type(getattr(sample, name)) is int, name
    for name in ("utilization_pct", "power_w", "temperature_c", "clock_sm_mhz", "pcie_tx_bytes_per_s",
                 "gpm_sm_active_pct"):
        assert type(getattr(sample, name)) is float, name
    assert sample.retired_pages_pending is None
    assert sample.fan_speed_pct is None
    assert sample.memory_used_bytes == (70_000 + 5) * MIB + 123
    assert sample.energy_mj == 123_456_789_017
    assert sample.clock_event_reasons == 0x1F4
    assert type(snapshot.host.memory_used_bytes) is int
    assert type(snapshot.host.memory_total_bytes) is int
    assert type(snapshot.host.cpu_pct) is float
    assert snapshot.host.disk_write_bytes_per_s is None
