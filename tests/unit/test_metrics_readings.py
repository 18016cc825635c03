"""The readings behind ``DCGM_FI_DEV_MEM_COPY_UTIL`` and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, through the real NVML
code over the fake library, and where every reading field goes: the history file (an older file gains the
columns) and nvidia-smi's CSV (``utilization.memory``).

Expected values come from NVML itself, asked through pynvml at the same moments: ``nvmlUtilization_t.memory``,
and ``NVML_GPM_METRIC_GRAPHICS_UTIL`` between two GPM samples taken when the sampler takes its own.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC
from pathlib import Path
from typing import Any

import pynvml

from nvdash.history.database import open_database
from nvdash.history.nvsmi_csv import format_header, format_row, parse_csv
from nvdash.history.query import SqliteHistory
from nvdash.history.replay import recent_snapshots
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot
from tests.unit.conftest import FakeClock, open_source

NEW_COLUMNS = ("memory_utilization_pct", "gpm_graphics_active_pct")
T0 = 1_699_999_200.0


def _graphics_util(handle: Any, first: Any, second: Any) -> float:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1 = first
    request.sample2 = second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    metric = pynvml.nvmlGpmMetricsGet(request).metrics[0]
    assert metric.nvmlReturn == pynvml.NVML_SUCCESS
    return float(metric.value)


def test_memory_utilization_is_nvmls_utilization_memory(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock):
        source.open()
        for step in (30.0, 31.0, 47.5):
            clock.at(step)
            samples = source.read(5.0)
            for sample in samples:
                rates = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(sample.index))
                assert sample.memory_utilization_pct == rates.memory
                assert sample.utilization_pct == rates.gpu
        busy, idle = samples[0], samples[7]
        assert busy.memory_utilization_pct is not None
        assert idle.memory_utilization_pct is not None
        assert busy.memory_utilization_pct > idle.memory_utilization_pct


def test_memory_utilization_is_absent_on_a_gpu_in_mig_mode(clock: FakeClock) -> None:
    for source, _ in open_source("a100-mig", clock):
        source.open()
        clock.at(20.0)
        mig, whole = source.read(5.0)
        assert mig.memory_utilization_pct is None  # nvidia-smi: N/A; the instances share the memory
        assert whole.memory_utilization_pct is not None


def test_graphics_activity_is_gpm_graphics_util_between_the_sweeps(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock):
        source.open()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(8)]
        mine = [(pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()) for _ in handles]
        clock.at(30.0)
        for handle, (first, _) in zip(handles, mine, strict=True):
            pynvml.nvmlGpmSampleGet(handle, first)
        assert all(sample.gpm_graphics_active_pct is None for sample in source.read(5.0)), "GPM needs two samples"
        clock.at(31.5)
        for handle, (_, second) in zip(handles, mine, strict=True):
            pynvml.nvmlGpmSampleGet(handle, second)
        samples = source.read(5.0)
        for sample, handle, (first, second) in zip(samples, handles, mine, strict=True):
            assert sample.gpm_graphics_active_pct == _graphics_util(handle, first, second)
        assert samples[0].gpm_graphics_active_pct is not None
        assert samples[7].gpm_graphics_active_pct is not None
        assert samples[0].gpm_graphics_active_pct > samples[7].gpm_graphics_active_pct  # in the job vs idle
        for first, second in mine:
            pynvml.nvmlGpmSampleFree(first)
            pynvml.nvmlGpmSampleFree(second)


def test_graphics_activity_is_absent_without_gpm(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-a100", clock):
        source.open()
        source.read(5.0)
        clock.now += 1
        assert all(sample.gpm_graphics_active_pct is None for sample in source.read(5.0))


# ---------------------------------------------------------------------------------------------- the history


def _inventory() -> Inventory:
    info = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd", 80 << 30, 5, 16, None, 0,
                   None, pci_bus_id="00000000:18:00.0")
    return Inventory(host=HostInfo(hostname="node1", cpu_count=8, memory_total_bytes=64 << 30), gpus=(info,),
                     driver_version="550.54.15")


def _write(path: Path, samples: list[GpuSample], start_s: float = T0) -> None:
    writer = HistoryWriter(path, _inventory(), "test", 1.0)
    writer.open()
    try:
        for offset, sample in enumerate(samples):
            writer.submit(Snapshot(start_s + offset, (sample,), HostSample(cpu_pct=5.0)))
        writer.flush()
    finally:
        writer.stop()


def _columns(path: Path, table: str) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
    finally:
        connection.close()


def _make_old(path: Path) -> None:
    """Leave the file as an nvdash from before the new reading fields wrote it."""
    connection = sqlite3.connect(path)
    try:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for column in _columns(path, table):
                if column.startswith(NEW_COLUMNS):
                    connection.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        connection.commit()
    finally:
        connection.close()


def test_an_older_history_file_reads_and_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    _write(path, [GpuSample(0, utilization_pct=float(i), memory_utilization_pct=10.0 + i) for i in range(3)])
    _make_old(path)
    assert "memory_utilization_pct" not in _columns(path, "gpu_raw")
    assert "memory_utilization_pct_mean" not in _columns(path, "gpu_10s")

    # Read-only (export, replay, the timelines): the file reads as if the columns were there, empty.
    reader = open_database(path, read_only=True)
    try:
        old = recent_snapshots(reader, 10)
    finally:
        reader.close()
    assert [snapshot.gpus[0].utilization_pct for snapshot in old] == [0.0, 1.0, 2.0]
    assert all(snapshot.gpus[0].memory_utilization_pct is None for snapshot in old)
    history = SqliteHistory(path)
    result = history.query(["memory_utilization_pct", "utilization_pct"], T0, T0 + 3, step_s=1.0)
    assert list(result.series["utilization_pct"][0].mean) == [0.0, 1.0, 2.0]
    empty = result.series["memory_utilization_pct"][0].mean
    assert len(empty) == 3
    assert all(math.isnan(value) for value in empty)
    assert "memory_utilization_pct" not in _columns(path, "gpu_raw"), "a reader never changes the file"

    # The next writer adds them; the old rows keep NULL, the new rows their readings.
    _write(path, [GpuSample(0, utilization_pct=50.0, memory_utilization_pct=37.0, gpm_graphics_active_pct=88.5)],
           start_s=T0 + 3)
    assert "memory_utilization_pct" in _columns(path, "gpu_raw")
    assert {"gpm_graphics_active_pct_min", "gpm_graphics_active_pct_mean"} <= set(_columns(path, "gpu_1m"))
    reader = open_database(path, read_only=True)
    try:
        snapshots = recent_snapshots(reader, 10)
    finally:
        reader.close()
    assert [s.gpus[0].memory_utilization_pct for s in snapshots] == [None, None, None, 37.0]
    assert snapshots[-1].gpus[0].gpm_graphics_active_pct == 88.5


# ---------------------------------------------------------------------------------------------- nvidia-smi CSV


def test_nvidia_smis_utilization_memory_is_the_memory_utilization() -> None:
    log = parse_csv(["timestamp, index, utilization.gpu [%], utilization.memory [%]",
                     "2024/06/01 11:27:05.177, 0, 97 %, 38 %"], tz=UTC)
    assert log.ignored_fields == []
    assert log.rows[0].values == {"utilization_pct": 97.0, "memory_utilization_pct": 38.0}
    assert format_header(["utilization.memory"]) == "utilization.memory [%]"
    info = _inventory().gpus[0]
    assert format_row(["utilization.memory"], T0, info, {"memory_utilization_pct": 38.0}, None, tz=UTC) == "38 %"
    assert format_row(["utilization.memory"], T0, info, {}, None, tz=UTC) == "[N/A]"
