"""The NVML source, run under the real pynvml wrapper against the fake NVML library."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.nvml_source import NvmlSource, NvmlUnavailable
from tests.unit.conftest import FakeClock, open_source

GIB = 2**30


@pytest.fixture
def dgx(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("dgx-h100", clock)


@pytest.fixture
def a100(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("a100-pcie-2", clock)


@pytest.fixture
def t4(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("t4", clock)


def test_dgx_inventory(dgx: tuple[NvmlSource, FakeNvmlLibrary]) -> None:
    source, _ = dgx
    gpus = source.open()
    assert len(gpus) == 8
    assert source.driver_version == "570.133.20"
    for index, gpu in enumerate(gpus):
        assert gpu.index == index
        assert gpu.name == "NVIDIA H100 80GB HBM3"
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_total_bytes == 81559 * 2**20
        assert (gpu.pcie_generation, gpu.pcie_width) == (5, 16)
        assert gpu.pcie_max_bytes_per_s == pytest.approx(16 * 32e9 * 128 / 130 / 8)
        links = 17 if index == 7 else 18  # the dgx-h100 scenario starts with one of GPU 7's links down
        assert gpu.nvlink_links == links
        # NVIDIA's H100 data rate, 25 GB/s per link per direction; the driver's speed field (26,562 MB/s per link,
        # nvidia-smi nvlink -s) is the signalling rate.
        assert gpu.nvlink_max_bytes_per_s == pytest.approx(links * 25e9)
        assert gpu.nvlink_signalling_max_bytes_per_s == pytest.approx(links * 26562e6)
    assert len({gpu.uuid for gpu in gpus}) == 8


def test_dgx_rates_come_from_counters_and_match_the_workload(
    dgx: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = dgx
    source.open()
    start = clock.now
    first = source.read(5.0)
    assert all(sample.pcie_tx_bytes_per_s is None for sample in first), "no rate from a single counter reading"
    clock.now += 0.5
    second = source.read(5.0)
    workload, t1, t2 = fake.workload, start - fake.created_at, clock.now - fake.created_at
    for sample in second:
        assert not sample.lost
        assert sample.pcie_rx_bytes_per_s == pytest.approx(
            workload.mean_rate_bytes_per_s(sample.index, "pcie_rx", t1, t2), rel=1e-3, abs=1.0
        )
        assert sample.pcie_tx_bytes_per_s == pytest.approx(
            workload.mean_rate_bytes_per_s(sample.index, "pcie_tx", t1, t2), rel=1e-3, abs=1.0
        )
        expected_nvlink = workload.mean_rate_bytes_per_s(sample.index, "nvlink_tx", t1, t2)
        assert sample.nvlink_tx_bytes_per_s == pytest.approx(expected_nvlink, rel=1e-2, abs=18 * 1024 / 0.5)
        assert sample.utilization_pct is not None
        assert 0 <= sample.utilization_pct <= 100
        assert sample.memory_total_bytes == 81559 * 2**20
        assert sample.memory_used_bytes is not None
        assert 0 < sample.memory_used_bytes <= sample.memory_total_bytes
        assert sample.temperature_c is not None
        assert sample.power_w is not None
        assert 0 < sample.power_w <= 700
    calls = fake.call_counts()
    assert "nvmlDeviceGetPcieThroughput" not in calls, "counters are available: the slow call must not be used"


def test_idle_gpus_look_idle(dgx: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, _ = dgx
    source.open()
    clock.now += 90
    source.read(5.0)
    clock.now += 0.5
    samples = source.read(5.0)
    busy = [s.utilization_pct for s in samples[:6]]
    idle = [s.utilization_pct for s in samples[6:]]
    assert all(u is not None and u <= 5 for u in idle), idle
    assert sum(u or 0 for u in busy) > 6 * 20, busy


def test_a100_falls_back_to_pcie_throughput_and_has_no_nvlink(
    a100: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = a100
    gpus = source.open()
    assert [gpu.name for gpu in gpus] == ["NVIDIA A100-PCIE-40GB"] * 2
    assert all(gpu.nvlink_links == 0 and gpu.nvlink_max_bytes_per_s is None for gpu in gpus)
    assert gpus[0].pcie_max_bytes_per_s == pytest.approx(16 * 16e9 * 128 / 130 / 8)
    samples = source.read(5.0)
    for sample in samples:
        assert sample.pcie_tx_bytes_per_s is not None, "the fallback gives a rate on the first read"
        assert sample.pcie_rx_bytes_per_s is not None
        assert sample.nvlink_tx_bytes_per_s is None
        assert sample.nvlink_rx_bytes_per_s is None
    assert fake.call_counts()["nvmlDeviceGetPcieThroughput"] == 4


def test_t4_unsupported_power_is_absent_not_zero_and_not_asked_again(
    t4: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = t4
    gpus = source.open()
    assert gpus[0].name == "Tesla T4"
    assert gpus[0].memory_total_bytes == 15360 * 2**20
    assert gpus[0].pcie_generation == 3
    for _ in range(3):
        clock.now += 0.5
        (sample,) = source.read(5.0)
        assert sample.power_w is None
        assert sample.utilization_pct is not None
        assert sample.temperature_c is not None
    assert fake.call_counts()["nvmlDeviceGetPowerUsage"] == 1


def test_not_supported_injected_on_one_device_only(dgx: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, fake = dgx
    source.open()
    fake.not_supported("nvmlDeviceGetUtilizationRates", device=2)
    samples = source.read(5.0)
    assert samples[2].utilization_pct is None
    assert samples[2].memory_used_bytes is not None
    assert all(s.utilization_pct is not None for i, s in enumerate(samples) if i != 2)


def test_gpu_lost_mid_run_is_reported_lost_and_the_others_keep_updating(
    dgx: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = dgx
    source.open()
    source.read(5.0)
    fake.lose_gpu(5)
    clock.now += 0.5
    samples = source.read(5.0)
    assert samples[5].lost
    assert samples[5].utilization_pct is None
    calls_after_loss = fake.call_counts().get("nvmlDeviceGetUtilizationRates", 0)
    clock.now += 0.5
    samples = source.read(5.0)
    assert samples[5].lost
    assert [s.lost for s in samples].count(True) == 1
    assert all(s.utilization_pct is not None for s in samples if not s.lost)
    assert fake.call_counts()["nvmlDeviceGetUtilizationRates"] == calls_after_loss + 7, "a lost GPU is not polled"


def test_slow_call_does_not_stall_the_sweep(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        source.open()
        fake.slow("nvmlDeviceGetUtilizationRates", 1.5, device=1)
        started = time.monotonic()
        samples = source.read(0.3)
        assert time.monotonic() - started < 1.0
        assert samples[1].utilization_pct is None
        assert not samples[1].lost
        assert samples[0].utilization_pct is not None
        started = time.monotonic()
        samples = source.read(0.3)
        assert time.monotonic() - started < 1.0
        assert fake.call_counts()["nvmlDeviceGetUtilizationRates"] == 8 + 7, "no second call while one hangs"


def test_a_hung_read_is_not_waited_for_again_by_later_sweeps(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        source.open()
        fake.slow("nvmlDeviceGetUtilizationRates", 120.0, device=1)
        source.read(0.3)
        started = time.monotonic()
        samples = source.read(60.0)
        waited = time.monotonic() - started
        assert samples[1].utilization_pct is None
        assert all(s.utilization_pct is not None for i, s in enumerate(samples) if i != 1)
        assert waited < 30.0, f"the sweep waited {waited:.1f} s of its 60 s budget for a read it had given up on"
        assert source.skipped_reads == 1  # GPU 1 was not asked in the second sweep; the sampler reports it


def test_pcie_fallback_blocks_like_the_real_call(clock: FakeClock) -> None:
    for source, _ in open_source("a100-pcie-2", clock, latency_scale=1.0):
        source.open()
        started = time.monotonic()
        samples = source.read(1.0)
        elapsed = time.monotonic() - started
        assert all(s.pcie_tx_bytes_per_s is not None for s in samples)
        assert elapsed >= 0.035, "each GPU's two PCIe throughput calls block ~20 ms each"


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "insufficient permissions"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML could not be initialised"),
    ],
)
def test_init_failures_explain_themselves(clock: FakeClock, code: int, words: str) -> None:
    for source, fake in open_source("dgx-h100", clock):
        fake.fail_init(code)
        with pytest.raises(NvmlUnavailable, match=words):
            source.open()
        assert source.read(0.1) == ()


def test_real_pynvml_without_a_driver_reports_library_not_found() -> None:
    if pynvml.nvmlLib is not None:
        pytest.skip("an NVML library is loaded in this process")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    hardware = open_hardware(None)
    try:
        assert hardware.gpus is None
        assert hardware.inventory.gpus == ()
        assert "libnvidia-ml.so.1" in (hardware.inventory.nvml_error or "")
    finally:
        hardware.close()


def test_open_hardware_simulated_restores_pynvml_on_close() -> None:
    before = pynvml.nvmlLib
    hardware = open_hardware("a100-pcie-2", seed=3)
    try:
        assert pynvml.nvmlLib is hardware.fake
        assert hardware.inventory.simulated == "a100-pcie-2"
        assert len(hardware.inventory.gpus) == 2
    finally:
        hardware.close()
    assert pynvml.nvmlLib is before


def test_counts_its_own_nvml_calls(dgx: tuple[NvmlSource, FakeNvmlLibrary]) -> None:
    source, fake = dgx
    source.open()
    source.read(5.0)
    assert source.settle(60.0)  # a read given up on (a busy machine) still calls NVML after ``read`` returned
    assert source.calls == fake.total_calls()


def test_counts_the_calls_of_reads_it_gave_up_on(dgx: tuple[NvmlSource, FakeNvmlLibrary]) -> None:
    """Rounds that stop waiting at once leave every read running; once they finished, both counts agree."""
    source, fake = dgx
    source.open()
    for _ in range(3):
        source.read(0.0)
    assert source.settle(60.0)
    assert source.calls == fake.total_calls()
    assert source.settle(0.0)
