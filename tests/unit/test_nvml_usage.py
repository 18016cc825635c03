"""Processes, per-process utilization and MIG, read through the real pynvml over the fake NVML library.

Expected values come from NVML's definitions: ``usedGpuMemory`` in bytes, ``gpuInstanceId`` 0xFFFFFFFF without
MIG, per-process samples newer than ``lastSeenTimeStamp`` (µs), MIG profiles as ``nvidia-smi mig -lgip`` lists
them for an A100 40GB (3g.20gb: 42 SMs, 19.62 GiB; 2g.10gb: 28 SMs, 9.75 GiB; 1g.5gb: 14 SMs, 4.75 GiB).
"""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE
from nvdash.sampling.nvml_source import NvmlSource
from nvdash.sampling.nvml_usage import DeviceUsage, clamp_pct, learn_period_us, mig_profile
from tests.unit.conftest import START, FakeClock, open_source

MiB = 1024 * 1024


@pytest.fixture
def h100(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("dgx-h100", clock)


@pytest.fixture
def mig(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("a100-mig", clock)


def _usage(source: NvmlSource) -> tuple[DeviceUsage, ...]:
    return source.read_usage(timeout_s=10.0)


def test_every_process_list_is_read_and_merged_by_pid(
    h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, _ = h100
    source.open()
    clock.at(120.0)
    usages = _usage(source)
    assert [len(u.processes) for u in usages] == [1, 1, 1, 1, 1, 1, 3, 0]
    rank = usages[0].processes[0]
    assert rank.pid == GHOST_PID_BASE + 100
    assert rank.kinds == ("compute",)
    assert (rank.gpu_instance_id, rank.compute_instance_id) == (None, None)
    mps = {p.pid: p for p in usages[6].processes}
    assert mps[GHOST_PID_BASE + 600].kinds == ("compute",)
    assert mps[GHOST_PID_BASE + 601].kinds == ("compute", "mps")
    assert mps[GHOST_PID_BASE + 601].memory_bytes == 2048 * MiB
    assert mps[GHOST_PID_BASE + 602].memory_bytes == 3072 * MiB
    assert all(u.gpu.processes_readable for u in usages)
    assert [u.gpu.uuid for u in usages] == [g.uuid for g in source.gpus]


def test_process_memory_fits_in_the_gpus_used_memory(
    h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, _ = h100
    source.open()
    clock.at(300.0)
    samples = source.read(10.0)
    usages = _usage(source)
    for sample, usage in zip(samples, usages, strict=True):
        held = sum(p.memory_bytes or 0 for p in usage.processes)
        assert sample.memory_used_bytes is not None
        assert held <= sample.memory_used_bytes
        if usage.processes and sample.index < 6:
            # A training rank holds nearly all of its GPU's memory (v2 "used" excludes the driver's reservation).
            assert held >= 0.9 * sample.memory_used_bytes
    # MPS clients' memory shows in GPU 6's used memory (which is otherwise almost empty: it is outside the job).
    assert samples[6].memory_used_bytes is not None
    assert samples[6].memory_used_bytes >= (32 + 2048 + 3072) * MiB


def test_process_utilization_counts_each_sample_once_and_clamps_garbage(
    h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = h100
    source.open()
    clock.at(100.0)
    _usage(source)
    clock.at(105.0)
    usages = _usage(source)
    # Samples every 0.2 s in (100, 105]: the rank's SM % is the mean of the clamped samples, from the workload's
    # utilization at each sample time; on GPU 5 every 25th sample reads 37,100 % and counts as 100 %.
    period_us = 200_000
    first = int((START + 100.0) * 1e6) // period_us + 1
    last = int((START + 105.0) * 1e6) // period_us
    for gpu in (0, 5):
        values = []
        for k in range(first, last + 1):
            util, memory = fake.workload.utilization(gpu, k * 0.2 - START)
            if util == 0 and memory == 0:
                continue  # NVML returns samples only of periods with some non-zero utilization
            values.append(100.0 if gpu == 5 and k % 25 == 0 else clamp_pct(util))
        expected = sum(values) / len(values)
        process = usages[gpu].processes[0]
        assert usages[gpu].utilization[process.pid].sm_pct == pytest.approx(expected)
        assert 0 <= usages[gpu].utilization[process.pid].sm_pct <= 100
    # Nothing new since the last read: no sample is counted again, and the ranks read as idle (absent).
    again = _usage(source)
    assert again[0].utilization == {}
    assert again[0].gpu.process_utilization


def test_process_utilization_is_time_weighted_over_the_window(
    h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = h100
    source.open()
    # A light process (5 % of GPU 0's work) whose samples round to 0 in parts of the data-loader stall: NVML then
    # returns no sample for it. Its utilization over the window is its sample values x the 0.2 s sample period
    # over the window, idle periods counting as 0 (not the mean of the samples it got).
    pid = 12346
    fake.add_process(0, pid, sm_share=0.05)
    clock.at(29.0)
    _usage(source)
    clock.at(35.0)
    usages = _usage(source)
    period_us = 200_000
    first = int((START + 29.0) * 1e6) // period_us + 1
    last = int((START + 35.0) * 1e6) // period_us
    got: list[float] = []
    for k in range(first, last + 1):
        util, memory = fake.workload.utilization(0, k * 0.2 - START)
        sm, mem = round(util * 0.05), round(memory * 0.05)
        if sm or mem:
            got.append(clamp_pct(sm))
    periods = last - first + 1  # the rank on GPU 0 is busy in every period, so the window is all of them
    assert len(got) < periods, "the window holds periods in which the light process had no sample"
    expected = sum(got) / periods
    assert usages[0].utilization[pid].sm_pct == pytest.approx(expected)
    assert usages[0].utilization[pid].sm_pct < sum(got) / len(got)


def test_the_sample_period_is_the_smallest_gap_between_one_process_samples() -> None:
    # Two processes sampled in the same periods with a few µs between their stamps: the gap across processes is
    # not a period; a process busy every other period shows twice the period until it is seen in two in a row.
    assert learn_period_us(0, [[1_000_000, 1_400_000], [1_000_005, 1_400_005]]) == 400_000
    assert learn_period_us(400_000, [[2_000_000, 2_200_000, 2_200_000]]) == 200_000
    assert learn_period_us(200_000, [[3_000_000]]) == 200_000
    assert learn_period_us(0, [[3_000_000]]) == 0


def test_idle_mps_clients_have_no_samples(h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, _ = h100
    source.open()
    clock.at(60.0)
    usages = _usage(source)
    assert usages[6].gpu.process_utilization
    assert usages[6].utilization == {}


def test_mig_instances_with_profiles_placements_and_memory(
    mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, _ = mig
    source.open()
    clock.at(30.0)
    first, second = _usage(source)
    assert (first.gpu.mig_enabled, first.gpu.mig_pending) == (True, True)
    assert (second.gpu.mig_enabled, second.gpu.instances) == (False, ())
    table = [(i.profile, i.gpu_instance_id, i.compute_instance_id, i.placement_start, i.placement_size, i.sm_count,
              i.memory_total_bytes) for i in first.gpu.instances]
    assert table == [
        ("3g.20gb", 1, 0, 4, 4, 42, 20096 * MiB),
        ("2g.10gb", 5, 0, 0, 2, 28, 9984 * MiB),
        ("1g.5gb", 13, 0, 2, 1, 14, 4864 * MiB),
        ("1g.5gb", 14, 0, 3, 1, 14, 4864 * MiB),
    ]
    assert all(i.uuid.startswith("MIG-") for i in first.gpu.instances)
    assert len({i.uuid for i in first.gpu.instances}) == 4
    # Memory used per instance: its processes plus the instance's own context.
    used = [i.memory_used_bytes for i in first.gpu.instances]
    assert used[0] is not None
    assert used[0] >= (14000 + 4096) * MiB
    assert used[3] is not None
    assert used[3] < 64 * MiB
    assert all(i.sm_active_pct is None for i in first.gpu.instances)
    # Processes carry their GPU and compute instance ids; per-process utilization is not reported under MIG.
    ids = sorted((p.pid, p.gpu_instance_id, p.compute_instance_id) for p in first.processes)
    assert ids == [(GHOST_PID_BASE + 200, 1, 0), (GHOST_PID_BASE + 201, 1, 0), (GHOST_PID_BASE + 210, 5, 0),
                   (GHOST_PID_BASE + 220, 13, 0)]
    assert not first.gpu.process_utilization
    assert second.gpu.process_utilization


def test_a_gpu_in_mig_mode_reports_no_whole_gpu_utilization(
    mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, _ = mig
    source.open()
    clock.at(30.0)
    first, second = source.read(10.0)
    assert first.utilization_pct is None
    assert second.utilization_pct is not None
    # The parent's used memory is the sum over its instances.
    instances = _usage(source)[0].gpu.instances
    assert first.memory_used_bytes == sum(i.memory_used_bytes or 0 for i in instances)


def test_mig_handles_answer_only_what_nvml_answers_for_mig_devices(install: object) -> None:
    fake = install("a100-mig")  # type: ignore[operator]
    assert isinstance(fake, FakeNvmlLibrary)
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(handle).value == 1
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA A100-PCIE-40GB MIG 3g.20gb"
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 4)
    back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    assert pynvml.nvmlDeviceGetUUID(back) == pynvml.nvmlDeviceGetUUID(parent)


def test_mig_mode_is_none_where_mig_is_not_supported(clock: FakeClock) -> None:
    for profile, expected in (("t4", None), ("dgx-a100", False)):
        for source, _ in open_source(profile, clock):
            source.open()
            assert _usage(source)[0].gpu.mig_enabled is expected


def test_a_lost_gpu_has_no_readable_processes(h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, fake = h100
    source.open()
    fake.lose_gpu(2)
    usages = _usage(source)
    assert not usages[2].gpu.processes_readable
    assert usages[2].processes == ()
    assert usages[1].gpu.processes_readable
    assert usages[1].processes


def test_unsupported_process_lists_leave_the_gpu_unreadable(
    h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = h100
    source.open()
    for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
                 "nvmlDeviceGetMPSComputeRunningProcesses_v3"):
        fake.not_supported(name, device=3)
    usages = _usage(source)
    assert not usages[3].gpu.processes_readable
    assert usages[4].gpu.processes_readable


def test_added_processes_appear_and_removed_ones_go(h100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, fake = h100
    source.open()
    fake.add_process(7, 12345, kinds=("compute", "graphics"), memory_mib=512)
    (process,) = _usage(source)[7].processes
    assert (process.pid, process.kinds, process.memory_bytes) == (12345, ("compute", "graphics"), 512 * MiB)
    assert fake.remove_process(12345)
    assert _usage(source)[7].processes == ()


def test_mig_profile_from_device_names() -> None:
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 3g.20gb") == "3g.20gb"
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb") == "1c.3g.40gb"
    assert mig_profile("odd") == "odd"


def test_without_privileges_mig_processes_come_from_each_instance(
    mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    """nvml.h: in MIG mode the whole GPU's process list needs privileges; each MIG device handle lists its own."""
    source, fake = mig
    fake.run_unprivileged()
    source.open()
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3(pynvml.nvmlDeviceGetHandleByIndex(0))
    clock.at(30.0)
    first = _usage(source)[0]
    assert first.gpu.processes_readable
    ids = sorted((p.pid, p.gpu_instance_id, p.compute_instance_id, p.memory_bytes) for p in first.processes)
    assert ids == [(GHOST_PID_BASE + 200, 1, 0, 14000 * MiB), (GHOST_PID_BASE + 201, 1, 0, 4096 * MiB),
                   (GHOST_PID_BASE + 210, 5, 0, 8192 * MiB), (GHOST_PID_BASE + 220, 13, 0, 3000 * MiB)]
    # Placement needs a GPU instance handle, which NVML gives to privileged users only.
    assert [(i.profile, i.placement_start) for i in first.gpu.instances] == [
        ("3g.20gb", None), ("2g.10gb", None), ("1g.5gb", None), ("1g.5gb", None)]
