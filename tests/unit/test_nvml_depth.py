"""The NVML source's health and depth readings, under the real pynvml wrapper and the fake library.

Expected values come from NVML's definitions (units, enums) applied to what pynvml itself returns from the
same fake, or from published figures, never from nvdash's own conversion code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.fake import constants as fake_constants
from nvdash.sampling.gpm import GpmReader
from nvdash.sampling.nvml_device import Device, NvmlCaller
from nvdash.sampling.nvml_probe import decode_nvlink_version
from nvdash.sampling.nvml_read import sum_links
from nvdash.sampling.nvml_source import NvmlSource
from nvdash.sampling.records import GpuEvent
from tests.unit.conftest import FakeClock, open_source

MIB = 2**20


@pytest.fixture
def dgx(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("dgx-h100", clock, slow_interval_s=0.0)


def _handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


@pytest.mark.parametrize(
    ("enum_name", "generation"),
    [
        ("NVML_NVLINK_VERSION_1_0", "1.0"),
        ("NVML_NVLINK_VERSION_2_0", "2.0"),
        ("NVML_NVLINK_VERSION_2_2", "2.2"),
        ("NVML_NVLINK_VERSION_3_0", "3.0"),
        ("NVML_NVLINK_VERSION_3_1", "3.1"),
        ("NVML_NVLINK_VERSION_4_0", "4.0"),
        ("NVML_NVLINK_VERSION_5_0", "5.0"),
    ],
)
def test_nvlink_version_enum_decodes_by_pynvml_names(enum_name: str, generation: str) -> None:
    assert decode_nvlink_version(getattr(pynvml, enum_name)) == generation


def test_invalid_nvlink_version_is_unknown() -> None:
    assert decode_nvlink_version(pynvml.NVML_NVLINK_VERSION_INVALID) is None
    assert decode_nvlink_version(None) is None


@pytest.mark.parametrize(
    ("profile", "links", "generation", "published_per_direction"),
    [
        # Published: A100 SXM 600 GB/s, H100 SXM 900 GB/s, B200 1.8 TB/s, all links, both directions together.
        ("dgx-a100", 12, "3.1", 300e9),
        ("dgx-h100", 18, "4.0", 450e9),
        ("dgx-b200", 18, "5.0", 900e9),
    ],
)
def test_nvlink_maximum_matches_the_published_figure(
    clock: FakeClock, profile: str, links: int, generation: str, published_per_direction: float
) -> None:
    for source, _ in open_source(profile, clock):
        gpus = source.open()
        complete = 0
        for gpu in gpus:
            handle = _handle(gpu.index)
            up = sum(1 for link in range(links) if pynvml.nvmlDeviceGetNvLinkState(handle, link))
            assert gpu.nvlink_links == up
            assert gpu.nvlink_version == generation
            assert pynvml.nvmlDeviceGetNvLinkVersion(handle, 0) == getattr(
                pynvml, f"NVML_NVLINK_VERSION_{generation.replace('.', '_')}"
            ), "the driver answers the enum, not a version number"
            assert gpu.nvlink_max_bytes_per_s is not None
            assert gpu.nvlink_link_bytes_per_s is not None
            assert gpu.nvlink_max_bytes_per_s == pytest.approx(gpu.nvlink_link_bytes_per_s * up)
            (speed,) = pynvml.nvmlDeviceGetFieldValues(handle, [(pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, 0)])
            if speed.nvmlReturn == pynvml.NVML_SUCCESS:
                assert gpu.nvlink_speed_from_driver
                assert gpu.nvlink_link_signalling_bytes_per_s == pytest.approx(speed.value.uiVal * 1e6)
            if up == links:
                complete += 1
                assert gpu.nvlink_max_bytes_per_s == pytest.approx(published_per_direction)
        assert complete >= len(gpus) - 1


def test_memory_used_is_nvml_v2_and_reserved_is_separate(dgx: tuple[NvmlSource, FakeNvmlLibrary]) -> None:
    source, _ = dgx
    source.open()
    sample = source.read(5.0)[0]
    v1 = pynvml.nvmlDeviceGetMemoryInfo(_handle(0))
    v2 = pynvml.nvmlDeviceGetMemoryInfo(_handle(0), version=pynvml.nvmlMemory_v2)
    assert sample.memory_used_bytes == v2.used
    assert sample.memory_reserved_bytes == v2.reserved
    assert sample.memory_reserved_bytes is not None
    assert sample.memory_reserved_bytes > 0
    assert v1.used == v2.used + v2.reserved, "v1 counts the driver's reservation as used"
    assert sample.memory_total_bytes == v2.total


def test_memory_falls_back_to_v1_on_a_driver_without_v2(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        fake.not_supported("nvmlDeviceGetMemoryInfo_v2")
        source.open()
        for _ in range(2):
            sample = source.read(5.0)[0]
            v1 = pynvml.nvmlDeviceGetMemoryInfo(_handle(0))
            assert sample.memory_used_bytes == v1.used
            assert sample.memory_reserved_bytes is None
        assert fake.call_counts()["nvmlDeviceGetMemoryInfo_v2"] == 8, "asked once per GPU, then not again"


def test_readings_follow_nvml_units(dgx: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, _ = dgx
    gpus = source.open()
    clock.now += 30
    sample = source.read(5.0)[0]
    handle = _handle(0)
    info = gpus[0]
    assert sample.power_w == pytest.approx(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000)
    assert sample.power_limit_w == pytest.approx(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)
    assert sample.energy_mj == pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert sample.pstate == pynvml.nvmlDeviceGetPerformanceState(handle)
    assert sample.temperature_c == pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    for name, clock_type in (("graphics", pynvml.NVML_CLOCK_GRAPHICS), ("sm", pynvml.NVML_CLOCK_SM),
                             ("memory", pynvml.NVML_CLOCK_MEM), ("video", pynvml.NVML_CLOCK_VIDEO)):
        assert getattr(sample, f"clock_{name}_mhz") == pynvml.nvmlDeviceGetClockInfo(handle, clock_type)
        assert getattr(info, f"clock_{name}_max_mhz") == pynvml.nvmlDeviceGetMaxClockInfo(handle, clock_type)
    assert sample.clock_event_reasons == pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    threshold = pynvml.nvmlDeviceGetTemperatureThreshold
    assert info.temperature_slowdown_c == threshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    assert info.temperature_shutdown_c == threshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    assert info.power_default_limit_w == pytest.approx(
        pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000
    )
    assert info.pci_bus_id == pynvml.nvmlDeviceGetPciInfo(handle).busId
    assert info.ecc_enabled is True
    assert info.memory_error_mechanism == "row remapping"
    assert info.gpm_supported is True
    assert info.nvlink_to_switch is (
        pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    )
    assert info.nvlink_to_switch, "a DGX H100's links lead to NVSwitches"
    assert info.nvlink_active_links == tuple(range(18))
    assert sample.pcie_generation_current == pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)
    assert sample.pcie_width_current == pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
    assert sample.pcie_replay_count == pynvml.nvmlDeviceGetPcieReplayCounter(handle)
    corrected, uncorrected, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
    assert (sample.remapped_rows_corrected, sample.remapped_rows_uncorrected) == (corrected, uncorrected)
    assert (sample.remap_pending, sample.remap_failure) == (bool(pending), bool(failure))
    assert sample.ecc_corrected_volatile == pynvml.nvmlDeviceGetTotalEccErrors(
        handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
    )
    assert sample.ecc_uncorrected_aggregate == pynvml.nvmlDeviceGetTotalEccErrors(
        handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC
    )
    assert len(sample.nvlinks) == 18
    assert all(link.active is not None for link in sample.nvlinks)


def test_gpm_metrics_arrive_from_the_second_sweep_on_hopper_only(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock):
        source.open()
        clock.now += 30
        first = source.read(5.0)
        assert all(sample.gpm_sm_active_pct is None for sample in first), "GPM needs two samples"
        clock.now += 1
        second = source.read(5.0)
        for sample in second:
            for value in (sample.gpm_sm_active_pct, sample.gpm_tensor_active_pct, sample.gpm_dram_active_pct):
                assert value is not None
                assert 0.0 <= value <= 100.0
        busy, idle = second[0], second[7]
        assert busy.gpm_sm_active_pct is not None
        assert idle.gpm_sm_active_pct is not None
        assert busy.gpm_sm_active_pct > idle.gpm_sm_active_pct
    for source, fake in open_source("dgx-a100", clock):
        gpus = source.open()
        assert not any(gpu.gpm_supported for gpu in gpus)
        source.read(5.0)
        clock.now += 1
        assert all(sample.gpm_sm_active_pct is None for sample in source.read(5.0))
        assert "nvmlGpmSampleGet" not in fake.call_counts(), "GPM is not sampled where it is not supported"


def test_unsupported_functions_leave_their_metric_absent_and_the_rest_working(clock: FakeClock) -> None:
    missing = ["nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons",
               "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetRemappedRows",
               "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetPcieReplayCounter"]
    for source, fake in open_source("dgx-h100", clock, slow_interval_s=0.0):
        for function in missing:
            fake.not_supported(function)
        gpus = source.open()
        assert gpus[0].temperature_slowdown_c is None
        assert gpus[0].memory_error_mechanism is None
        sample = source.read(5.0)[0]
        assert sample.clock_sm_mhz is None
        assert sample.energy_mj is None
        assert sample.pcie_replay_count is None
        assert sample.remap_pending is None
        assert sample.utilization_pct is not None
        assert sample.power_w is not None
        assert sample.memory_used_bytes is not None
        assert sample.ecc_corrected_volatile is not None


def test_a_function_missing_from_the_driver_behaves_like_unsupported(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock, slow_interval_s=0.0):
        del fake._entry_points["nvmlDeviceGetCurrentClocksEventReasons"]
        del fake._entry_points["nvmlGpmQueryDeviceSupport"]
        gpus = source.open()
        assert not gpus[0].gpm_supported
        sample = source.read(5.0)[0]
        # The older name of the same bitmask answers instead.
        assert sample.clock_event_reasons == pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(_handle(0))
        assert sample.utilization_pct is not None


def test_slow_readings_are_read_at_their_own_cadence(clock: FakeClock) -> None:
    ticks = [0.0]
    for source, fake in open_source("dgx-h100", clock, slow_interval_s=5.0):
        source._reader._clock = lambda: ticks[0]  # the slow cadence follows its own monotonic clock
        source.open()
        for step in range(10):
            ticks[0] = step * 1.0
            samples = source.read(5.0)
            assert samples[0].ecc_corrected_volatile is not None, "carried between slow readings"
        assert fake.call_counts()["nvmlDeviceGetTotalEccErrors"] == 8 * 4 * 2, "at 0 s and 5 s only"
        assert fake.call_counts()["nvmlDeviceGetUtilizationRates"] == 8 * 10


def test_an_unexpected_error_costs_only_that_gpus_reading(dgx: tuple[NvmlSource, FakeNvmlLibrary]) -> None:
    source, _ = dgx
    source.open()
    reader = source._reader
    original = reader.read

    def explode_on_gpu_2(device: Any) -> Any:
        if device.index == 2:
            raise ZeroDivisionError("a bug in one reading")
        return original(device)

    reader.read = explode_on_gpu_2  # type: ignore[method-assign]
    samples = source.read(5.0)
    assert samples[2].error is not None
    assert "ZeroDivisionError" in samples[2].error
    assert samples[2].utilization_pct is None
    assert not samples[2].lost
    assert all(s.utilization_pct is not None and s.error is None for i, s in enumerate(samples) if i != 2)
    reader.read = original  # type: ignore[method-assign]
    assert source.read(5.0)[2].utilization_pct is not None, "the next sweep reads it again"


def test_partial_nvlink_sum_is_marked(dgx: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, fake = dgx
    source.open()
    driver = fake._driver
    original = driver._field

    def link_3_of_gpu_0_fails(entry: Any, device: int, t: float) -> int:
        if device == 0 and entry.scopeId == 3 and entry.fieldId in (
            fake_constants.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            fake_constants.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ):
            return fake_constants.NVML_ERROR_UNKNOWN
        return original(entry, device, t)

    source.read(5.0)
    clock.now += 0.5
    driver._field = link_3_of_gpu_0_fails  # type: ignore[method-assign]
    samples = source.read(5.0)
    assert samples[0].nvlink_partial
    assert samples[0].nvlink_tx_bytes_per_s is not None
    assert not samples[1].nvlink_partial


def test_sum_links_marks_a_partial_sum_and_knows_nothing_without_rates() -> None:
    assert sum_links({(138, 0): 1.0, (138, 1): 2.0}, 138, (0, 1)) == (3.0, False)
    assert sum_links({(138, 0): 1.0, (138, 1): None}, 138, (0, 1)) == (1.0, True)
    assert sum_links({}, 138, (0, 1)) == (None, False)


def test_pcie_throughput_kb_is_read_as_1024_bytes(clock: FakeClock) -> None:
    for source, fake in open_source("a100-pcie-2", clock):
        source.open()
        clock.now += 30.0
        sample = source.read(5.0)[0]
        kb = pynvml.nvmlDeviceGetPcieThroughput(_handle(0), pynvml.NVML_PCIE_UTIL_RX_BYTES)
        # The clock stands still: both calls average the same 20 ms window of the workload.
        assert sample.pcie_rx_bytes_per_s == kb * 1024
        workload_rate = fake.workload.mean_rate_bytes_per_s(0, "pcie_rx", 29.98, 30.0)
        assert kb > 0
        assert kb == int(workload_rate // 1024), "the simulated driver answers KiB/s, as nvdash reads it"


def test_topology_matches_nvidia_smi_codes(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock):
        source.open()
        matrix = source.topology
        up = [info.nvlink_links for info in source.gpus]
        assert len(matrix) == 8
        assert all(matrix[i][i] == "X" for i in range(8))
        # Every GPU reaches every other through the NVSwitches: nvidia-smi shows the links the pair can use.
        assert all(matrix[i][j] == f"NV{min(up[i], up[j])}" for i in range(8) for j in range(8) if i != j), matrix
    for source, _ in open_source("a100-pcie-2", clock):
        source.open()
        matrix = source.topology
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(_handle(0), _handle(1))
        codes = {pynvml.NVML_TOPOLOGY_SINGLE: "PIX", pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
                 pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB", pynvml.NVML_TOPOLOGY_NODE: "NODE",
                 pynvml.NVML_TOPOLOGY_SYSTEM: "SYS"}
        assert matrix == (("X", codes[level]), (codes[level], "X"))


def test_xid_events_arrive_on_their_own_thread(clock: FakeClock) -> None:
    received: list[GpuEvent] = []
    arrived = threading.Event()

    def record(event: GpuEvent) -> None:
        received.append(event)
        arrived.set()

    for source, fake in open_source("dgx-h100", clock):
        source.open()
        assert source.watch_xids(record) is None
        calls_before = fake.call_counts().get("nvmlEventSetWait_v2", 0)
        waiting_since = time.monotonic()
        fake.apply_faults("xid:79:5")
        assert arrived.wait(10.0), "the XID was not delivered"
        (event,) = received
        assert (event.kind, event.code, event.gpu_index) == ("xid", 79, 5)
        waits = fake.call_counts().get("nvmlEventSetWait_v2", 0) - calls_before
        waited_s = time.monotonic() - waiting_since
        assert waits <= waited_s / 0.5 + 2, f"waiting is not polling: {waits} waits in {waited_s:.1f} s"
        started = time.monotonic()
        source.close()
        assert time.monotonic() - started < 5.0, "closing waits at most about one wait timeout"


def test_closing_frees_the_gpm_sample_buffers(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        source.open()
        source.read(5.0)
        clock.now += 1
        source.read(5.0)
        allocated = fake.call_counts()["nvmlGpmSampleAlloc"]
        assert allocated == 16, "two buffers per GPU, reused every sweep"
        source.close()
        assert fake.call_counts().get("nvmlGpmSampleFree", 0) == allocated


class _ClosingCaller(NvmlCaller):
    """Closes ``reader`` from inside the first GPM buffer allocation, as the shutdown thread does meanwhile."""

    reader: GpmReader | None = None
    closed = False

    def call(self, fn: Any, *args: Any) -> Any:
        result = super().call(fn, *args)
        if fn is pynvml.nvmlGpmSampleAlloc and not self.closed and self.reader is not None:
            self.closed = True
            self.reader.close()
        return result


def test_closing_while_a_read_allocates_gpm_buffers_keeps_none_and_frees_all(clock: FakeClock) -> None:
    """A read that hung in ``nvmlGpmSampleAlloc`` wakes while the source closes: closing must not trip over the
    read's new buffers (it once iterated the buffer map while the read added to it), and none is left allocated."""
    for source, fake in open_source("dgx-h100", clock):
        source.open()
        caller = _ClosingCaller(pynvml)
        reader = caller.reader = GpmReader(caller)
        device = Device(index=0, handle=pynvml.nvmlDeviceGetHandleByIndex(0), info=source.gpus[0])
        before = fake.call_counts()
        values = reader.read(device)
        after = fake.call_counts()
        allocated = after.get("nvmlGpmSampleAlloc", 0) - before.get("nvmlGpmSampleAlloc", 0)
        freed = after.get("nvmlGpmSampleFree", 0) - before.get("nvmlGpmSampleFree", 0)
        assert allocated == 2, "the read allocated its two buffers"
        assert freed == allocated, "the buffers allocated while closing are freed, not kept"
        assert all(value is None for value in values.values())
        assert after.get("nvmlGpmSampleGet", 0) == before.get("nvmlGpmSampleGet", 0), "a closed reader samples none"
        reader.read(device)
        assert fake.call_counts().get("nvmlGpmSampleAlloc", 0) == after["nvmlGpmSampleAlloc"], \
            "a closed reader allocates no more"
