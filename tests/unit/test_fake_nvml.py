"""The fake libnvidia-ml, exercised through the real pynvml wrapper."""

from __future__ import annotations

import functools
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from nvdash.sampling.fake import PROFILES, FakeNvmlLibrary, profile_names
from nvdash.sampling.fake.workload import SLOT_S, Series, Workload
from nvdash.sampling.nvml_source import install_library
from tests.unit.conftest import START, FakeClock, Install

MIB = 1024 * 1024
GIB = 1024 * MIB
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
FI_PCIE_TX, FI_PCIE_RX = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
FI_NVLINK_TX, FI_NVLINK_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
FI_LINK_COUNT = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
PCIE_COUNTERS: list[tuple[int, Series]] = [
    (pynvml.NVML_PCIE_UTIL_TX_BYTES, "pcie_tx"),
    (pynvml.NVML_PCIE_UTIL_RX_BYTES, "pcie_rx"),
]


def handles() -> list[Any]:
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def field_values(handle: Any, ids: list[Any]) -> list[Any]:
    return list(pynvml.nvmlDeviceGetFieldValues(handle, ids))


def integrate(workload: Workload, gpu: int, series: Any, t1: float, t2: float) -> float:
    """Bytes moved over [t1, t2], summed slot by slot from the instantaneous rate (independent of the
    workload's prefix sums and closed-form cycle sums)."""
    total = 0.0
    slot = math.floor(t1 / SLOT_S)
    while slot * SLOT_S < t2:
        start, end = max(slot * SLOT_S, t1), min((slot + 1) * SLOT_S, t2)
        total += workload.rate_bytes_per_s(gpu, series, (slot + 0.5) * SLOT_S) * (end - start)
        slot += 1
    return total


# Profiles through pynvml


EXPECTED = {
    "dgx-h100": ("NVIDIA H100 80GB HBM3", 8, 81559, 5, 18),
    "dgx-a100": ("NVIDIA A100-SXM4-80GB", 8, 81920, 4, 12),
    "dgx-b200": ("NVIDIA B200", 8, 183359, 5, 18),
    "a100-pcie-2": ("NVIDIA A100-PCIE-40GB", 2, 40960, 4, 0),
    "t4": ("Tesla T4", 1, 15360, 3, 0),
}
NVLINK_ENUM = {
    "dgx-h100": pynvml.NVML_NVLINK_VERSION_4_0,
    "dgx-a100": pynvml.NVML_NVLINK_VERSION_3_1,
    "dgx-b200": pynvml.NVML_NVLINK_VERSION_5_0,
}
DOWNTRAINED = {("dgx-h100", 3): 8}
NEWER_DRIVER = {"dgx-h100": "570.133.20", "dgx-b200": "570.133.20"}
"""Profiles on an R570 driver (the others run R550, which lacks the R565 entry points)."""
"""(profile, GPU) -> current PCIe width, where the scenario trains a link narrower than x16."""
DOWN_LINKS = {("dgx-h100", 7): 3}


def test_profile_names_and_unknown_profile() -> None:
    names = ["a100-mig", "a100-pcie-2", "dgx-a100", "dgx-b200", "dgx-h100", "h100-mig", "hgx-h100-hpc", "none", "t4",
             "timesliced", "vgpu"]
    assert profile_names() == names
    assert set(PROFILES) == set(profile_names())
    known = r"a100-pcie-2, dgx-a100, dgx-b200, dgx-h100, h100-mig, hgx-h100-hpc, none, t4"
    with pytest.raises(ValueError, match=rf"unknown profile 'h200'.*{known}"):
        FakeNvmlLibrary("h200")


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_profile_identity_memory_and_links(install: Install, profile: str) -> None:
    name, count, memory_mib, pcie_gen, links = EXPECTED[profile]
    install(profile)
    assert pynvml.nvmlSystemGetDriverVersion() == NEWER_DRIVER.get(profile, "550.54.15")
    assert pynvml.nvmlDeviceGetCount() == count
    uuids = set()
    for index, handle in enumerate(handles()):
        assert pynvml.nvmlDeviceGetName(handle) == name
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        assert UUID_RE.match(uuid)
        uuids.add(uuid)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        assert isinstance(memory, pynvml.c_nvmlMemory_t)
        assert memory.total == memory_mib * MIB
        assert memory.used + memory.free == memory.total
        assert isinstance(pynvml.nvmlDeviceGetUtilizationRates(handle), pynvml.c_nvmlUtilization_t)
        assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle) == pcie_gen
        assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle) == 16
        assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle) == DOWNTRAINED.get((profile, index), 16)
        assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle) in (1, pcie_gen)
        if links:
            down = DOWN_LINKS.get((profile, index))
            states = [pynvml.nvmlDeviceGetNvLinkState(handle, link) for link in range(links)]
            assert states == [0 if link == down else 1 for link in range(links)]
            assert pynvml.nvmlDeviceGetNvLinkVersion(handle, 0) == NVLINK_ENUM[profile]
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetNvLinkState(handle, links)
            (count_field,) = field_values(handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
            assert (count_field.nvmlReturn, count_field.value.uiVal) == (pynvml.NVML_SUCCESS, links)
        else:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkState(handle, 0)
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkVersion(handle, 0)
    assert len(uuids) == count


def test_none_profile_has_a_driver_but_no_gpu(install: Install) -> None:
    install("none")
    assert pynvml.nvmlDeviceGetCount() == 0
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(0)


def test_memory_info_v2_separates_the_driver_reservation(install: Install, clock: FakeClock) -> None:
    install("a100-pcie-2")
    clock.at(90.0)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert isinstance(v2, pynvml.c_nvmlMemory_v2_t)
    assert v2.total == v1.total
    assert v2.reserved == PROFILES["a100-pcie-2"].memory_reserved_bytes
    assert v2.used + v2.reserved == v1.used
    assert v2.free == v1.free
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)


def test_a_shared_gpus_used_memory_is_what_its_processes_hold(install: Install, clock: FakeClock) -> None:
    """No training rank holds the job's memory on the time-sliced GPU: nvidia-smi's used memory (v2) is the driver's
    few MiB plus what the three processes hold (12000 + 8000 + 4000 MiB), and each process lists its own amount."""
    install("timesliced")
    clock.at(90.0)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert sorted(p.usedGpuMemory // MIB for p in listed) == [4000, 8000, 12000]
    assert v2.used == (4 + 12000 + 8000 + 4000) * MIB


def test_temperature_sensor_and_power_units(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    clock.at(120.0)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == fake.workload.temperature_c(0, 120.0)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == fake.workload.power_mw(0, 120.0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperature(handle, 1)


# Counters, rates and timestamps


def test_field_counters_integrate_the_workload_rates(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = [FI_PCIE_TX, FI_PCIE_RX] + [(FI_NVLINK_TX, link) for link in range(18)]
    ids += [(FI_NVLINK_RX, link) for link in range(18)]
    t1, t2 = 3.217, 88.9  # spans at least two stall cycles (each 20-40 s)
    clock.at(t1)
    first = field_values(handle, ids)
    clock.at(t2)
    second = field_values(handle, ids)
    for values, t in ((first, t1), (second, t2)):
        assert {v.nvmlReturn for v in values} == {pynvml.NVML_SUCCESS}
        assert {v.valueType for v in values} == {pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG}
        assert {v.timestamp for v in values} == {math.floor((START + t) * 1e6)}
    dt = (second[0].timestamp - first[0].timestamp) / 1e6
    assert dt == pytest.approx(t2 - t1, abs=1e-6)

    fake_t1, fake_t2 = (values[0].timestamp / 1e6 - fake.created_at for values in (first, second))
    for index, (_, series) in enumerate(PCIE_COUNTERS):
        moved = second[index].value.ullVal - first[index].value.ullVal
        assert moved / dt == pytest.approx(integrate(fake.workload, 0, series, t1, t2) / (t2 - t1), rel=1e-6)
        workload = fake.workload
        exact = workload.transferred_bytes(0, series, fake_t2) - workload.transferred_bytes(0, series, fake_t1)
        assert moved == pytest.approx(exact, abs=2)
    nvlink: list[tuple[int, Series]] = [(2, "nvlink_tx"), (20, "nvlink_rx")]
    for offset, series in nvlink:
        per_link = [(second[i].value.ullVal - first[i].value.ullVal) * 1024 for i in range(offset, offset + 18)]
        expected = integrate(fake.workload, 0, series, t1, t2)
        assert sum(per_link) == pytest.approx(expected, rel=1e-6)
        assert per_link[5] == pytest.approx(fake.workload.link_weight(0, 5) * expected, rel=1e-6)


def test_counter_does_not_depend_on_how_often_it_is_read(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    ids = [FI_PCIE_RX, (FI_NVLINK_TX, 7)]
    clock.at(61.0)
    direct = [v.value.ullVal for v in field_values(handle, ids)]
    for step in range(200):
        clock.at(step * 0.3037)
        field_values(handle, ids)
    clock.at(61.0)
    assert [v.value.ullVal for v in field_values(handle, ids)] == direct


def test_pcie_throughput_is_the_mean_over_the_last_20_ms(install: Install, clock: FakeClock) -> None:
    fake = install("a100-pcie-2")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for step in range(300):
        clock.at(1.0 + step * 0.0731)
        t = clock.now - fake.created_at
        for counter, series in PCIE_COUNTERS:
            kb_per_s = pynvml.nvmlDeviceGetPcieThroughput(handle, counter)
            mean = fake.workload.mean_rate_bytes_per_s(0, series, t - 0.02, t)
            assert kb_per_s == pytest.approx(mean / 1024, abs=1), "KiB/s, the unit nvdash reads it in"
            seen.append(kb_per_s * 1024)
    assert max(seen) <= PROFILES["a100-pcie-2"].pcie_max_bytes_per_s
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPcieThroughput(handle, 2)


def test_field_values_timestamp_comes_from_the_fake_clock(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    clock.now = 1_234_567.891234
    (value,) = field_values(pynvml.nvmlDeviceGetHandleByIndex(0), [FI_PCIE_RX])
    assert value.timestamp == 1_234_567_891_234
    assert value.latencyUsec >= 0


def test_unreadable_fields_fail_alone(install: Install) -> None:
    install("a100-pcie-2")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = [FI_PCIE_TX, FI_PCIE_RX, (FI_NVLINK_TX, 0), FI_LINK_COUNT, pynvml.NVML_FI_DEV_ECC_CURRENT]
    assert [v.nvmlReturn for v in field_values(handle, ids)] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 5
    install("dgx-h100")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = [(FI_NVLINK_RX, 17), (FI_NVLINK_RX, 18), pynvml.NVML_FI_DEV_ECC_CURRENT, FI_PCIE_RX]
    codes = [v.nvmlReturn for v in field_values(handle, ids)]
    assert codes == [0, pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_SUPPORTED, 0]


# The workload


def test_same_seed_same_readings_different_seed_different(install: Install, clock: FakeClock) -> None:
    def readings(seed: int) -> list[Any]:
        workload = FakeNvmlLibrary("dgx-h100", seed=seed, clock=clock, latency_scale=0).workload
        out: list[Any] = []
        for t in (0.5, 17.3, 44.4, 130.0):
            out += [workload.utilization(1, t), workload.memory_used_bytes(1, t), workload.power_mw(1, t)]
            out += [workload.pcie_counter_bytes(1, "pcie_rx", t), workload.nvlink_counter_kib(1, "nvlink_tx", 3, t)]
        return out

    assert readings(7) == readings(7)
    assert readings(7) != readings(8)
    uuids = []
    for seed in (1, 1, 2):
        install("t4", seed=seed)
        uuids.append(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)))
    assert uuids[0] == uuids[1] != uuids[2]


def test_training_job_looks_like_training() -> None:
    profile = PROFILES["dgx-h100"]
    workload = Workload(profile, seed=3)
    times = [i * 0.1 for i in range(1500)]
    util = [workload.utilization(0, t)[0] for t in times]
    assert sorted(util)[len(util) // 2] >= 90
    assert min(util[:450]) <= 20, "a data-loader stall within the first 45 s"
    assert all(0 <= u <= 100 for u in util)
    assert workload.memory_used_bytes(0, 0.0) == pytest.approx(GIB, rel=0.05)
    plateau = workload.memory_used_bytes(0, 140.0) / profile.memory_total_bytes
    assert 0.55 <= plateau <= 0.92
    assert all(workload.memory_used_bytes(0, t) <= profile.memory_total_bytes for t in times)
    rx = [workload.rate_bytes_per_s(0, "pcie_rx", t) for t in (i * SLOT_S + 0.005 for i in range(6000))]
    assert max(rx) >= 0.15 * profile.pcie_max_bytes_per_s
    assert max(rx) <= profile.pcie_max_bytes_per_s
    assert sorted(rx)[len(rx) // 2] <= 0.01 * profile.pcie_max_bytes_per_s
    nvlink = [workload.rate_bytes_per_s(0, "nvlink_tx", t) for t in (i * SLOT_S + 0.005 for i in range(6000))]
    assert 200e9 <= max(nvlink) <= profile.nvlink_max_bytes_per_s
    assert max(workload.link_weight(0, link) for link in range(18)) * max(nvlink) <= 25e9
    temperatures = [workload.temperature_c(0, t) for t in times]
    assert min(temperatures) >= 30
    assert max(t for t, when in zip(temperatures, times, strict=True) if when < 75) <= 85
    assert max(temperatures) <= profile.temperature_slowdown_c + 1, "GPU 0's thermal episode peaks at slowdown"
    assert max(temperatures) - min(temperatures) >= 15
    watts = [workload.power_mw(0, t) / 1000 for t in times]
    assert min(watts) >= 60
    assert 500 <= max(watts) <= 700


def test_idle_gpus_stay_idle(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    clock.at(75.0)
    all_handles = handles()
    for index in (6, 7):
        handle = all_handles[index]
        assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 0
        # Outside the training job; GPU 6 holds its (idle) MPS server and clients' memory besides.
        held = sum(p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle))
        assert pynvml.nvmlDeviceGetMemoryInfo(handle).used - held < 0.6 * GIB
        assert pynvml.nvmlDeviceGetPowerUsage(handle) < 100_000
        assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle) == 1
        assert fake.workload.mean_rate_bytes_per_s(index, "nvlink_tx", 0.0, 75.0) == 0.0
    assert pynvml.nvmlDeviceGetMemoryInfo(all_handles[0]).used > 20 * GIB
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v3(all_handles[7]) == []
    fake = install("a100-pcie-2")
    assert pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(1)).gpu == 0
    assert fake.workload.mean_rate_bytes_per_s(1, "pcie_rx", 0.0, 75.0) < 10e3


# Lifecycle and errors


def test_calls_before_init_and_after_last_shutdown_are_uninitialized(install: Install) -> None:
    fake = install("t4", init=False)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()
    assert fake.nvmlInit_v2() == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetCount() == 1


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVMLError_DriverNotLoaded),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVMLError_LibraryNotFound),
    ],
)
def test_init_failures(install: Install, code: int, error: type[Exception]) -> None:
    fake = install("dgx-h100", init=False)
    fake.fail_init(code)
    with pytest.raises(error):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    fake.fail_init(0)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 8


def test_missing_function_is_function_not_found(install: Install) -> None:
    fake = install("dgx-h100")
    assert not hasattr(fake, "nvmlDeviceGetBAR1MemoryInfo")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetBAR1MemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert "nvmlDeviceGetBAR1MemoryInfo" not in fake.call_counts()


def test_error_strings_and_foreign_handles(install: Install) -> None:
    other = FakeNvmlLibrary("dgx-h100", latency_scale=0)
    restore = install_library(pynvml, other)
    pynvml.nvmlInit()
    foreign = pynvml.nvmlDeviceGetHandleByIndex(0)
    restore()
    install("dgx-h100")
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert pynvml.nvmlErrorString(12345) == "Unknown Error"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(foreign)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)


def test_not_supported_per_device_and_per_profile(install: Install) -> None:
    fake = install("dgx-h100")
    gpu0, gpu1, gpu2 = handles()[:3]
    fake.not_supported("nvmlDeviceGetPowerUsage", device=1)
    assert pynvml.nvmlDeviceGetPowerUsage(gpu0) > 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(gpu1)
    fake.not_supported("nvmlDeviceGetTemperature")
    for handle in (gpu0, gpu2):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTemperature(handle, 0)
    install("t4")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    assert pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) >= 0


def test_gpu_lost_mid_run(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    all_handles = handles()
    assert pynvml.nvmlDeviceGetUtilizationRates(all_handles[3]).gpu > 0
    clock.at(10.0)
    fake.lose_gpu(3)
    calls: list[Callable[[Any], object]] = [
        pynvml.nvmlDeviceGetUtilizationRates,
        pynvml.nvmlDeviceGetMemoryInfo,
        pynvml.nvmlDeviceGetName,
        functools.partial(pynvml.nvmlDeviceGetFieldValues, fieldIds=[FI_PCIE_RX]),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(all_handles[3])
        call(all_handles[2])
        call(all_handles[4])
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetCount() == 8


def test_scheduled_faults_wait_for_their_time(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    fake.apply_faults(" lose:3@5 ; unsupported:nvmlDeviceGetPowerUsage:0@2.5;; ")
    gpu0, gpu3 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(3)
    clock.at(4.9)
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu3).gpu > 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(gpu0)
    clock.at(5.0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUtilizationRates(gpu3)


def test_slow_function_on_one_device(install: Install) -> None:
    fake = install("dgx-h100")
    gpu0, gpu1 = handles()[:2]
    fake.slow("nvmlDeviceGetUtilizationRates", 0.05, device=0)
    started = time.perf_counter()
    pynvml.nvmlDeviceGetUtilizationRates(gpu0)
    assert time.perf_counter() - started >= 0.045
    fake.apply_faults("slow:nvmlDeviceGetUtilizationRates:0")
    started = time.perf_counter()
    pynvml.nvmlDeviceGetUtilizationRates(gpu1)
    pynvml.nvmlDeviceGetUtilizationRates(gpu0)
    assert time.perf_counter() - started >= 0.045, "the device's own setting wins over the all-devices one"


@pytest.mark.parametrize(
    "spec",
    [
        "lose",
        "lose:x",
        "lose:8",
        "lose:1:2",
        "lose:1@-3",
        "lose:1@soon",
        "slow:nvmlDeviceGetNothing:1",
        "slow:nvmlDeviceGetPowerUsage:abc",
        "slow:nvmlDeviceGetPowerUsage",
        "unsupported:nvmlDeviceGetPowerUsage:1:2",
        "fail_init:0",
        "melt:1",
        "unsupported:nvmlDeviceGetPowerUsage;lose:99",
        "name:0:",
        "name:0",
        "name:0:%FF",
        "name:0:" + "a" * 96,
        "name:0:GPU@3",
        "process:0:0",
        "process:0:1@-2",
        "process:0:1:0.5@later",
        "process:8:1",
    ],
)
def test_bad_fault_specs_are_rejected_whole(install: Install, spec: str) -> None:
    fake = install("dgx-h100")
    with pytest.raises(ValueError, match="bad NVML fault") as caught:
        fake.apply_faults(spec)
    assert "\n" not in str(caught.value)
    assert pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(1)) > 0


def _pcie_counters(gpu: int) -> tuple[int, int]:
    tx, rx = field_values(pynvml.nvmlDeviceGetHandleByIndex(gpu), [FI_PCIE_TX, FI_PCIE_RX])
    return int(tx.value.ullVal), int(rx.value.ullVal)


def test_pcie_wrap_fault_counts_modulo_its_width_from_zero_at_its_time(install: Install, clock: FakeClock) -> None:
    """nvml.h: the PCIe byte counters "can be wrapped"; from the wrap's time they count the bytes moved since,
    modulo 2**BITS (the bytes moved are the workload's own integral of its rate)."""
    fake = install("dgx-h100")
    fake.apply_faults("pcie_wrap:40@5")
    clock.at(5.0)
    assert _pcie_counters(2) == (0, 0)
    clock.at(5.5)
    tx, rx = _pcie_counters(2)
    assert tx == pytest.approx(integrate(fake.workload, 2, "pcie_tx", 5.0, 5.5), rel=1e-6)
    assert rx == pytest.approx(integrate(fake.workload, 2, "pcie_rx", 5.0, 5.5), rel=1e-6)
    assert 0 < tx < 2**40


def test_pcie_wrap_fault_defaults_to_32_bits_and_wraps(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    fake.apply_faults("pcie_wrap@0")
    moved = 0.0
    t = 0.0
    while moved < 2**32:
        t += 1.0
        moved = integrate(fake.workload, 0, "pcie_tx", 0.0, t)
    clock.at(t)
    tx, _ = _pcie_counters(0)
    assert tx < 2**32
    assert tx == pytest.approx(moved - 2**32, abs=moved * 1e-6), "wrapped once, at 2**32"


def test_pcie_wrap_fault_with_a_small_width_keeps_every_reading_below_it(install: Install, clock: FakeClock) -> None:
    install("dgx-h100").apply_faults("pcie_wrap:16")
    readings = set()
    for step in range(1, 20):
        clock.at(step * 0.37)
        readings.update(_pcie_counters(0))
    assert all(0 <= value < 2**16 for value in readings)
    assert len(readings) > 10


def test_driver_reload_fault_restarts_the_energy_and_pcie_counters(install: Install, clock: FakeClock) -> None:
    """``nvmlDeviceGetTotalEnergyConsumption``: mJ "since the driver was last reloaded"."""
    fake = install("dgx-h100")
    fake.apply_faults("driver_reload@10")
    gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
    clock.at(9.5)
    before = pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu)
    tx_before, _ = _pcie_counters(1)
    assert before == fake.workload.energy_mj(1, 9.5)
    clock.at(10.5)
    after = pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu)
    assert after == fake.workload.energy_mj(1, 10.5) - fake.workload.energy_mj(1, 10.0)
    assert 0 < after < before
    tx_after, _ = _pcie_counters(1)
    assert tx_after == pytest.approx(integrate(fake.workload, 1, "pcie_tx", 10.0, 10.5), rel=1e-6)
    assert tx_after < tx_before


def test_mig_fault_turns_mig_off_and_on_at_its_time(install: Install, clock: FakeClock) -> None:
    """nvidia-smi shows a whole GPU's utilization as N/A in MIG mode (NVML: NOT_SUPPORTED)."""
    install("a100-mig").apply_faults("mig:0:off@5; mig:0:on@8")
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.at(4.9)
    assert pynvml.nvmlDeviceGetMigMode(gpu)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(gpu)
    clock.at(5.0)
    assert pynvml.nvmlDeviceGetMigMode(gpu)[0] == pynvml.NVML_DEVICE_MIG_DISABLE
    assert 0 <= pynvml.nvmlDeviceGetUtilizationRates(gpu).gpu <= 100
    clock.at(8.0)
    assert pynvml.nvmlDeviceGetMigMode(gpu)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) > 0


@pytest.mark.parametrize(
    ("profile", "spec", "message"),
    [
        ("dgx-h100", "pcie_wrap:7", "bits 7 must be 8 to 64"),
        ("dgx-h100", "pcie_wrap:65@1", "bits 65 must be 8 to 64"),
        ("dgx-h100", "pcie_wrap:x", "bits 'x' is not an integer"),
        ("dgx-h100", "pcie_wrap:32:1", "unknown fault or wrong number of fields"),
        ("dgx-h100", "driver_reload:0", "unknown fault or wrong number of fields"),
        ("dgx-h100", "driver_reload@later", "time 'later' is not a number"),
        ("dgx-h100", "driver_reload@3;driver_reload@9", "only one driver_reload per spec"),
        ("dgx-h100", "pcie_wrap;pcie_wrap:16@4", "only one pcie_wrap per spec"),
        ("dgx-h100", "driver_reload@3;pcie_wrap", "pcie_wrap and driver_reload cannot be combined"),
        ("a100-mig", "mig:0:maybe", "MIG mode 'maybe' must be on or off"),
        ("a100-mig", "mig:0", "unknown fault or wrong number of fields"),
        ("a100-mig", "mig:2:off", "device 2 out of range: the profile has 2 GPU(s)"),
        ("a100-mig", "mig:1:on", "profile 'a100-mig' has no MIG layout for GPU 1 to turn on"),
        ("t4", "mig:0:off@3", "profile 't4' has GPUs without MIG support"),
        ("dgx-h100", "mig:0:on", "profile 'dgx-h100' has no MIG layout for GPU 0 to turn on"),
    ],
)
def test_bad_new_fault_items_get_one_line_naming_the_fault(
    install: Install, clock: FakeClock, profile: str, spec: str, message: str
) -> None:
    fake = install(profile)
    with pytest.raises(ValueError, match="bad NVML fault") as caught:
        fake.apply_faults(f"lose:0@1;{spec}")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"bad NVML fault {spec.rsplit(';', maxsplit=1)[-1]!r}: {message}; expected ITEM")
    assert "pcie_wrap[:BITS], driver_reload or mig:DEVICE:on|off" in text
    clock.at(2.0)
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)), "nothing of a rejected spec is applied"


def test_fault_methods_validate_their_arguments(install: Install) -> None:
    fake = install("a100-pcie-2")
    with pytest.raises(ValueError, match="unknown NVML function"):
        fake.not_supported("nvmlDeviceGetPowerUsageX")
    with pytest.raises(ValueError, match="out of range"):
        fake.lose_gpu(2)
    fake.apply_faults("fail_init:9")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_name_and_process_faults_carry_any_text_and_a_real_pid(install: Install) -> None:
    fake = install("a100-pcie-2")
    fake.apply_faults("name:1:%3Cimg%20src%3Dx%3E%3B%22%3A%40;process:0:4242")
    gpu0, gpu1 = handles()
    assert pynvml.nvmlDeviceGetName(gpu1) == '<img src=x>;":@'
    assert pynvml.nvmlDeviceGetName(gpu0) == PROFILES["a100-pcie-2"].gpu_name
    assert 4242 in [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0)]
    assert 4242 not in [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu1)]


# Latency, threads, accounting


def test_latency_is_modelled() -> None:
    fake = FakeNvmlLibrary("a100-pcie-2", latency_scale=1.0)
    restore = install_library(pynvml, fake)
    try:
        started = time.perf_counter()
        pynvml.nvmlInit()
        assert time.perf_counter() - started >= 0.04
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        started = time.perf_counter()
        pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        assert time.perf_counter() - started >= 0.015
    finally:
        restore()


def test_concurrent_calls_on_different_devices(install: Install) -> None:
    fake = install("dgx-h100")
    all_handles = handles()
    fake.reset_counts()
    errors: list[BaseException] = []

    def hammer(handle: Any) -> None:
        try:
            for _ in range(200):
                pynvml.nvmlDeviceGetUtilizationRates(handle)
                pynvml.nvmlDeviceGetFieldValues(handle, [FI_PCIE_TX, (FI_NVLINK_RX, 1)])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=hammer, args=(handle,)) for handle in all_handles[:4]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert fake.call_counts() == {"nvmlDeviceGetUtilizationRates": 800, "nvmlDeviceGetFieldValues": 800}


def test_every_call_is_counted_failing_ones_too(install: Install) -> None:
    fake = install("t4", init=False)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    counts = fake.call_counts()
    assert counts == {
        "nvmlDeviceGetCount_v2": 1,
        "nvmlInitWithFlags": 1,
        "nvmlDeviceGetHandleByIndex_v2": 1,
        "nvmlDeviceGetPowerUsage": 1,
    }
    counts["nvmlInitWithFlags"] = 99
    assert fake.call_counts()["nvmlInitWithFlags"] == 1
    assert fake.total_calls() == 4


def test_importing_the_fake_does_not_import_pynvml() -> None:
    code = "import sys, nvdash.sampling.fake; assert 'pynvml' not in sys.modules, 'pynvml imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
