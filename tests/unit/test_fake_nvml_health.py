"""The fake NVML's health, clocks, power, GPM and event entry points, through the real pynvml wrapper.

Expected values are written from NVML's definitions (units, enums, struct versions) and from the published
figures of each GPU model (``nvidia-smi -q`` captures), not from the fake's code.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
from typing import Any

import pynvml
import pytest

from nvdash.sampling.fake import PROFILES, FakeNvmlLibrary
from tests.unit.conftest import START, FakeClock, Install

MIB = 1024 * 1024
SLOT = 0.01
XID = pynvml.nvmlEventTypeXidCriticalError
SBE = pynvml.nvmlEventTypeSingleBitEccError
DBE = pynvml.nvmlEventTypeDoubleBitEccError
CORRECTED, UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE, AGGREGATE = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
CLOCK_TYPES = (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_VIDEO)
GPU_IDLE = pynvml.nvmlClocksEventReasonGpuIdle
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown


KNOWN_HANDLES: dict[int | None, int] = {}
"""Handle address -> GPU index of every handle the tests asked for (lost GPUs give out no new handle)."""


def handle(index: int) -> Any:
    device = pynvml.nvmlDeviceGetHandleByIndex(index)
    KNOWN_HANDLES[address(device)] = index
    return device


def raw(name: str, *args: Any) -> None:
    """Call a C entry point with hand-built arguments and map its return code as pynvml does."""
    pynvml._nvmlCheckReturn(pynvml._nvmlGetFunctionPointer(name)(*args))


def address(pointer: Any) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value


# Static properties, from nvidia-smi -q captures of each model

STATIC = {
    # profile: (architecture, pciDeviceId, pciSubSystemId, (bus, device) per GPU,
    #           (shutdown, slowdown, memory max, GPU max) C, (default, min, max) mW, max clocks MHz)
    "dgx-h100": (
        pynvml.NVML_DEVICE_ARCH_HOPPER, 0x233010DE, 0x16C110DE,
        [(bus, 0) for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)],
        (92, 89, 95, 87), (700_000, 200_000, 700_000), (1980, 1980, 2619, 1545),
    ),
    "dgx-a100": (
        pynvml.NVML_DEVICE_ARCH_AMPERE, 0x20B210DE, 0x147F10DE,
        [(bus, 0) for bus in (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)],
        (92, 89, 95, 85), (400_000, 100_000, 400_000), (1410, 1410, 1593, 1290),
    ),
    "dgx-b200": (
        pynvml.NVML_DEVICE_ARCH_BLACKWELL, 0x290110DE, 0x199910DE,
        [(bus, 0) for bus in (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)],
        (93, 91, 95, 88), (1_000_000, 200_000, 1_000_000), (1965, 1965, 3996, 1965),
    ),
    "a100-pcie-2": (
        pynvml.NVML_DEVICE_ARCH_AMPERE, 0x20F110DE, 0x145F10DE, [(0x3B, 0), (0xAF, 0)],
        (92, 89, 95, 85), (250_000, 150_000, 250_000), (1410, 1410, 1215, 1290),
    ),
    "t4": (
        pynvml.NVML_DEVICE_ARCH_TURING, 0x1EB810DE, 0x12A210DE, [(0x00, 0x1E)],
        (96, 93, None, 85), (70_000, 60_000, 70_000), (1590, 1590, 5001, 1470),
    ),
}  # fmt: skip
POWER_CAPS_MW = {("dgx-a100", 2): 300_000}
"""(profile, GPU) -> the out-of-band cap the scenario puts below the management limit."""
THRESHOLDS = (
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
)


@pytest.mark.parametrize("profile", sorted(STATIC))
def test_static_properties_follow_the_model(install: Install, profile: str) -> None:
    arch, device_id, subsystem_id, locations, thresholds, power, clocks = STATIC[profile]
    install(profile)
    bus_ids = set()
    for index, (bus, device) in enumerate(locations):
        h = handle(index)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        assert isinstance(pci, pynvml.nvmlPciInfo_t)
        assert (pci.domain, pci.bus, pci.device) == (0, bus, device)
        assert pci.busId == f"{0:08X}:{bus:02X}:{device:02X}.0"
        assert pci.busIdLegacy == f"{0:04X}:{bus:02X}:{device:02X}.0"
        assert (pci.pciDeviceId, pci.pciSubSystemId) == (device_id, subsystem_id)
        assert pci.pciDeviceId & 0xFFFF == 0x10DE, "the low half is NVIDIA's vendor id"
        bus_ids.add(pci.busId)
        assert pynvml.nvmlDeviceGetArchitecture(h) == arch
        for which, expected in zip(THRESHOLDS, thresholds, strict=True):
            if expected is None:
                with pytest.raises(pynvml.NVMLError_NotSupported):
                    pynvml.nvmlDeviceGetTemperatureThreshold(h, which)
            else:
                assert pynvml.nvmlDeviceGetTemperatureThreshold(h, which) == expected
        default, low, high = power
        assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == default
        assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [low, high]
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == default
        # nvml.h: the enforced limit takes every limiter into account, so it is the lower of the two.
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == min(default, POWER_CAPS_MW.get((profile, index), default))
        assert [pynvml.nvmlDeviceGetMaxClockInfo(h, kind) for kind in CLOCK_TYPES] == list(clocks)
        assert pynvml.nvmlDeviceGetEccMode(h) == [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED]
        support = pynvml.nvmlGpmQueryDeviceSupport(h)
        assert support.isSupportedDevice == (arch >= pynvml.NVML_DEVICE_ARCH_HOPPER)
        for query in (pynvml.nvmlDeviceGetNumFans, pynvml.nvmlDeviceGetFanSpeed):
            with pytest.raises(pynvml.NVMLError_NotSupported):
                query(h)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed_v2(h, 0)
    assert len(bus_ids) == len(locations)


def test_bad_enum_arguments(install: Install) -> None:
    install("dgx-h100")
    h = handle(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_COUNT)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)
    for query in (pynvml.nvmlDeviceGetMaxClockInfo, pynvml.nvmlDeviceGetClockInfo):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            query(h, pynvml.NVML_CLOCK_COUNT)
    for args in ((2, VOLATILE), (CORRECTED, 2)):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetTotalEccErrors(h, *args)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, pynvml.NVML_NVLINK_ERROR_COUNT)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkCapability(h, 0, pynvml.NVML_NVLINK_CAP_COUNT)


def test_fans_where_a_board_has_them(install: Install, clock: FakeClock) -> None:
    install(dataclasses.replace(PROFILES["a100-pcie-2"], name="a100-pcie-fans", fan_count=2))
    h = handle(0)
    assert pynvml.nvmlDeviceGetNumFans(h) == 2
    for step in range(20):
        clock.at(step * 7.0)
        speed = pynvml.nvmlDeviceGetFanSpeed(h)
        assert 0 <= speed <= 100, "percent of the fan's maximum"
        assert pynvml.nvmlDeviceGetFanSpeed_v2(h, 1) == speed
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetFanSpeed_v2(h, 2)


# Topology and NVLink


def test_pcie_topology_levels(install: Install) -> None:
    socket, system, pxb = pynvml.NVML_TOPOLOGY_NODE, pynvml.NVML_TOPOLOGY_SYSTEM, pynvml.NVML_TOPOLOGY_MULTIPLE
    install("dgx-h100")
    level = pynvml.nvmlDeviceGetTopologyCommonAncestor
    handles = [handle(i) for i in range(8)]
    for i in range(8):
        assert level(handles[i], handles[i]) == pynvml.NVML_TOPOLOGY_INTERNAL
        for j in range(8):
            if i != j:
                assert level(handles[i], handles[j]) == (socket if i // 4 == j // 4 else system)
    install("dgx-a100")
    handles = [handle(i) for i in range(8)]
    assert level(handles[0], handles[1]) == pxb, "GPUs 0 and 1 share a PCIe switch"
    assert level(handles[6], handles[7]) == pxb
    assert level(handles[1], handles[2]) == socket
    assert level(handles[3], handles[4]) == system
    install("a100-pcie-2")
    assert level(handle(0), handle(1)) == system
    other = FakeNvmlLibrary("a100-pcie-2", latency_scale=0)
    other.nvmlInit_v2()
    foreign = ctypes.c_void_p()
    other.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(foreign))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        level(handle(0), ctypes.cast(foreign, pynvml.c_nvmlDevice_t))


@pytest.mark.parametrize(
    "case",
    [
        # nvidia-smi nvlink -s: 25.781 GB/s (A100), 26.562 GB/s (H100), 53.125 GB/s (B200) per link
        ("dgx-a100", 12, pynvml.NVML_NVLINK_VERSION_3_1, 6, 0x1AF110DE, 25_781),
        ("dgx-h100", 18, pynvml.NVML_NVLINK_VERSION_4_0, 4, 0x22A310DE, 26_562),
        ("dgx-b200", 18, pynvml.NVML_NVLINK_VERSION_5_0, 2, None, 53_125),
    ],
)
def test_nvlink_through_nvswitch(install: Install, case: tuple[str, int, int, int, int | None, int]) -> None:
    profile, links, enum, switches, switch_id, speed_mbps = case
    install(profile)
    h = handle(0)
    remote_buses = set()
    ids = [(pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, link) for link in range(links)]
    speeds = pynvml.nvmlDeviceGetFieldValues(h, [*ids, pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert speeds[-1].value.uiVal == links
    for link in range(links):
        assert pynvml.nvmlDeviceGetNvLinkVersion(h, link) == enum
        assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
        assert remote.pciDeviceId & 0xFFFF == 0x10DE
        if switch_id is not None:
            assert remote.pciDeviceId == switch_id
        assert remote.busId == f"00000000:{remote.bus:02X}:00.0"
        remote_buses.add(remote.busId)
        assert pynvml.nvmlDeviceGetNvLinkCapability(h, link, pynvml.NVML_NVLINK_CAP_P2P_SUPPORTED) == 1
        assert pynvml.nvmlDeviceGetNvLinkCapability(h, link, pynvml.NVML_NVLINK_CAP_VALID) == 1
        speed = speeds[link]
        assert (speed.nvmlReturn, speed.valueType) == (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
        assert speed.value.uiVal == speed_mbps, "MBps per link, per direction"
    assert len(remote_buses) == switches, "the links fan out over every NVSwitch chip"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, links)
    (outside,) = pynvml.nvmlDeviceGetFieldValues(h, [(pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, links)])
    assert outside.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_nvlink_faults_on_dgx_h100(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    gpu5, gpu7 = handle(5), handle(7)
    assert pynvml.nvmlDeviceGetNvLinkState(gpu7, 3) == 0
    (speed,) = pynvml.nvmlDeviceGetFieldValues(gpu7, [(pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, 3)])
    assert (speed.nvmlReturn, speed.value.uiVal) == (pynvml.NVML_SUCCESS, 0), "an inactive link has no speed"
    crc = []
    for step in range(13):
        clock.at(step * 10.0)
        crc.append(pynvml.nvmlDeviceGetNvLinkErrorCounter(gpu5, 11, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT))
        data = pynvml.nvmlDeviceGetNvLinkErrorCounter(gpu5, 11, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
        assert data <= crc[-1], "data-flit CRC errors are some of the CRC errors"
        replays = pynvml.nvmlDeviceGetNvLinkErrorCounter(gpu5, 11, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
        assert replays == crc[-1] + data, "the receiver asks for a replay after each CRC error"
        assert pynvml.nvmlDeviceGetNvLinkErrorCounter(gpu5, 10, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 0
        assert pynvml.nvmlDeviceGetNvLinkErrorCounter(gpu7, 3, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY) > 0
    assert crc == sorted(crc), "error counters never go back"
    assert 10 <= crc[-1] - crc[0] <= 60, "a couple of dozen CRC errors over two minutes"


def test_features_missing_from_the_hardware(install: Install) -> None:
    install("a100-pcie-2")
    h = handle(0)
    for query in (pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, pynvml.nvmlDeviceGetNvLinkRemotePciInfo):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            query(h, 0)
    (speed,) = pynvml.nvmlDeviceGetFieldValues(h, [(pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, 0)])
    assert speed.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    for query in (pynvml.nvmlDeviceGetRetiredPagesPendingStatus, lambda d: pynvml.nvmlDeviceGetRetiredPages(d, 0)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            query(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc())
    install("t4")
    h = handle(0)
    (memory_temperature,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert memory_temperature.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED, "GDDR6 has no memory sensor"
    for query in (pynvml.nvmlDeviceGetTotalEnergyConsumption, pynvml.nvmlDeviceGetRemappedRows):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            query(h)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetPowerManagementMode(h)


# Power, energy, clocks, reasons


@pytest.mark.parametrize(("profile", "gpu"), [("dgx-h100", 0), ("dgx-h100", 6), ("dgx-b200", 3)])
def test_energy_is_the_integral_of_reported_power(install: Install, clock: FakeClock, profile: str, gpu: int) -> None:
    install(profile)
    h = handle(gpu)
    t1, t2 = 80.0, 112.0  # spans GPU 0's first thermal episode (90 s to 104 s) on dgx-h100
    clock.at(t1)
    before = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    integral_mj = 0.0
    for slot in range(round((t2 - t1) / SLOT)):
        clock.at(t1 + (slot + 0.5) * SLOT)
        integral_mj += pynvml.nvmlDeviceGetPowerUsage(h) * SLOT  # mW x s = mJ
    clock.at(t2)
    after = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert before > 0, "the counter starts at driver load, before the library was opened"
    assert after - before == pytest.approx(integral_mj, abs=1.5)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == after, "a counter, not a rate"


def test_throttle_reasons_agree_with_clocks_power_and_pstate(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    seen: dict[int, set[int]] = {0: set(), 1: set(), 6: set()}
    limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle(0))
    max_graphics = pynvml.nvmlDeviceGetMaxClockInfo(handle(0), pynvml.NVML_CLOCK_GRAPHICS)
    thresholds = pynvml.nvmlDeviceGetTemperatureThreshold
    slowdown = thresholds(handle(0), pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    gpu_max = thresholds(handle(0), pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)
    for step in range(1300):
        clock.at(step * 0.1 + 0.003)
        for gpu, bits in seen.items():
            h = handle(gpu)
            reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == reasons, "the same bitmask, older name"
            graphics, sm, memory, video = (pynvml.nvmlDeviceGetClockInfo(h, kind) for kind in CLOCK_TYPES)
            power = pynvml.nvmlDeviceGetPowerUsage(h)
            pstate = pynvml.nvmlDeviceGetPerformanceState(h)
            temperature = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            bits.add(reasons)
            assert sm == graphics
            assert memory == 2619, "HBM3 runs at its one clock"
            assert power <= limit
            if gpu == 6:
                assert (reasons, pstate, graphics, video) == (GPU_IDLE, pynvml.NVML_PSTATE_8, 345, 765)
                continue
            assert pstate == pynvml.NVML_PSTATE_0
            assert not reasons & GPU_IDLE
            if reasons == 0:
                assert graphics == max_graphics, "nothing holds the clock below its boost"
            if reasons & SW_POWER_CAP:
                assert graphics < max_graphics
                assert power >= 0.98 * limit, "held at the power limit"
            if reasons & HW_SLOWDOWN:
                assert reasons & HW_THERMAL
                assert graphics <= max_graphics / 2, "HW slowdown halves the clocks or more"
                assert slowdown - 1 <= temperature <= slowdown + 1
            if reasons & SW_THERMAL:
                assert temperature > gpu_max
            if temperature > gpu_max:
                assert reasons & SW_THERMAL
    assert SW_POWER_CAP in seen[1], "busy GPUs reach the power cap now and then"
    assert 0 in seen[1]
    assert {r for r in seen[0] if r & HW_SLOWDOWN}, "GPU 0 has its HW thermal slowdown episode"
    assert all(not r & (HW_SLOWDOWN | SW_THERMAL) for r in seen[1])


def test_thermal_episode_timing_on_gpu_0(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    h = handle(0)
    hot = []
    for step in range(2500):
        clock.at(step * 0.1)
        if pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & HW_THERMAL:
            hot.append(round(step * 0.1, 1))
    assert hot[0] == pytest.approx(92.0, abs=0.15), "HW slowdown 2 s into the episode that starts at 90 s"
    first = [t for t in hot if t < 150]
    assert first[-1] - first[0] == pytest.approx(10.0, abs=0.2)
    second = [t for t in hot if t >= 150]
    assert 100 <= second[0] - first[0] <= 140, "about every two minutes"


def test_memory_temperature_on_hbm(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    for step in range(60):
        clock.at(step * 3.0)
        for gpu in (0, 6):
            (value,) = pynvml.nvmlDeviceGetFieldValues(handle(gpu), [pynvml.NVML_FI_DEV_MEMORY_TEMP])
            gpu_c = pynvml.nvmlDeviceGetTemperature(handle(gpu), pynvml.NVML_TEMPERATURE_GPU)
            assert value.nvmlReturn == pynvml.NVML_SUCCESS
            assert gpu_c <= value.value.uiVal < 95, "HBM runs warmer than the die, below its 95 C maximum"


# PCIe and memory errors


def test_pcie_link_health(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    gpu3 = handle(3)
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(gpu3) == 16
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(gpu3) == 8, "downtrained"
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(gpu3) == pynvml.nvmlDeviceGetMaxPcieLinkGeneration(gpu3) == 5
    replays = []
    for second in range(181):
        clock.at(second)
        replays.append(pynvml.nvmlDeviceGetPcieReplayCounter(handle(2)))
        assert pynvml.nvmlDeviceGetPcieReplayCounter(handle(1)) == 0
    assert replays[0] == 0
    assert replays == sorted(replays)
    assert 6 <= replays[-1] <= 12, "a few replays per minute"


def ecc(h: Any) -> list[int]:
    return [pynvml.nvmlDeviceGetTotalEccErrors(h, kind, counter) for kind in (CORRECTED, UNCORRECTED)
            for counter in (VOLATILE, AGGREGATE)]  # fmt: skip


def test_ecc_and_row_remap_timeline(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    gpu1, gpu4 = handle(1), handle(4)
    expected_gpu1 = {0.0: 0, 29.9: 0, 30.0: 1, 49.9: 1, 50.0: 2, 110.0: 5}
    for t, corrected in expected_gpu1.items():
        clock.at(t)
        assert ecc(gpu1) == [corrected, corrected + 4, 0, 0], "aggregate = 4 from before + volatile"
    clock.at(59.99)
    assert ecc(gpu4) == [0, 0, 0, 0]
    assert pynvml.nvmlDeviceGetRemappedRows(gpu4) == (0, 0, 0, 0)
    clock.at(60.0)
    assert ecc(gpu4) == [0, 0, 1, 1]
    for t in (60.01, 500.0):
        clock.at(t)
        assert pynvml.nvmlDeviceGetRemappedRows(gpu4) == (0, 1, 1, 0), "one row remapped, pending until reset"
    for gpu in (0, 2, 3, 5, 6, 7):
        assert ecc(handle(gpu)) == [0, 0, 0, 0]
        assert pynvml.nvmlDeviceGetRemappedRows(handle(gpu)) == (0, 0, 0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages_v2(gpu4, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)


def test_t4_retires_pages_instead_of_remapping_rows(install: Install, clock: FakeClock) -> None:
    install("t4")
    h = handle(0)
    clock.at(100.0)
    sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    pages = pynvml.nvmlDeviceGetRetiredPages(h, sbe)
    assert len(pages) == 2
    detailed = pynvml.nvmlDeviceGetRetiredPages_v2(h, sbe)
    assert [page["address"] for page in detailed] == pages
    assert all(0 < page["timestamp"] < START for page in detailed), "retired before this run"
    assert pynvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == pynvml.NVML_FEATURE_DISABLED
    assert ecc(h) == [0, 37, 0, 0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetRetiredPages(h, 2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(h)


# GPM


def gpm_metrics(sample1: Any, sample2: Any, ids: list[int], version: int = 1) -> Any:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = version
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = sample1, sample2
    for i, metric in enumerate(ids):
        request.metrics[i].metricId = metric
    return pynvml.nvmlGpmMetricsGet(request)


PERCENT_METRICS = [
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    pynvml.NVML_GPM_METRIC_SM_UTIL,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
]


def test_gpm_metrics_between_two_samples(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    busy, idle = handle(0), handle(7)
    samples = {gpu: (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()) for gpu in (0, 7)}
    t1, t2 = 40.0, 41.0
    clock.at(t1)
    for gpu, h in ((0, busy), (7, idle)):
        pynvml.nvmlGpmSampleGet(h, samples[gpu][0])
    (rx_before,) = pynvml.nvmlDeviceGetFieldValues(busy, [pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES])
    utilization = []
    for slot in range(round((t2 - t1) / SLOT)):
        clock.at(t1 + (slot + 0.5) * SLOT)
        utilization.append(pynvml.nvmlDeviceGetUtilizationRates(busy).gpu)
    clock.at(t2)
    for gpu, h in ((0, busy), (7, idle)):
        pynvml.nvmlGpmSampleGet(h, samples[gpu][1])
    (rx_after,) = pynvml.nvmlDeviceGetFieldValues(busy, [pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES])

    ids = [*PERCENT_METRICS, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, pynvml.NVML_GPM_METRIC_INTEGER_UTIL]
    result = gpm_metrics(*samples[0], ids)
    values = {result.metrics[i].metricId: result.metrics[i] for i in range(len(ids))}
    assert values[pynvml.NVML_GPM_METRIC_INTEGER_UTIL].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    for metric in ids[:-1]:
        assert values[metric].nvmlReturn == pynvml.NVML_SUCCESS
    for metric in PERCENT_METRICS:
        assert 0.0 <= values[metric].value <= 100.0
    graphics = values[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL].value
    assert graphics == pytest.approx(sum(utilization) / len(utilization), abs=1e-6)
    assert values[pynvml.NVML_GPM_METRIC_SM_UTIL].value <= graphics, "SMs busy <= time anything ran"
    rx_mib_per_s = (rx_after.value.ullVal - rx_before.value.ullVal) / (t2 - t1) / MIB
    assert values[pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC].value == pytest.approx(rx_mib_per_s, rel=1e-6)
    idle_result = gpm_metrics(*samples[7], PERCENT_METRICS)
    assert [idle_result.metrics[i].value for i in range(len(PERCENT_METRICS))] == [0.0] * len(PERCENT_METRICS)

    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        gpm_metrics(*samples[0], ids, version=2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        gpm_metrics(samples[0][0], samples[7][1], ids)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        gpm_metrics(samples[0][1], samples[0][0], ids)
    support = pynvml.c_nvmlGpmSupport_t()
    support.version = 2
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        raw("nvmlGpmQueryDeviceSupport", busy, ctypes.byref(support))
    for sample in (*samples[0], *samples[7]):
        pynvml.nvmlGpmSampleFree(sample)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleFree(samples[0][0])


@pytest.mark.parametrize("profile", ["dgx-a100", "a100-pcie-2", "t4"])
def test_gpm_is_hopper_and_later(install: Install, profile: str) -> None:
    install(profile)
    h = handle(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc())


# Events


def register(gpu: int, types: int) -> Any:
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(handle(gpu), types, event_set)
    return event_set


def drain(event_set: Any) -> list[tuple[int, int, int]]:
    """Every due event as (GPU index, type, data), without waiting."""
    out = []
    while True:
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, 0)
        except pynvml.NVMLError_Timeout:
            return out
        assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF), "not MIG"
        out.append((KNOWN_HANDLES[address(data.device)], data.eventType, data.eventData))


def test_scenario_xids_reach_registered_sets_once(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    assert pynvml.nvmlDeviceGetSupportedEventTypes(handle(4)) & (XID | SBE | DBE) == XID | SBE | DBE
    errors = register(4, XID | DBE)
    also = register(4, XID)
    correctable = register(1, SBE)
    clock.at(59.0)
    assert drain(errors) == []
    clock.at(60.1)
    assert drain(errors) == [(4, DBE, 0), (4, XID, 48), (4, XID, 94), (4, XID, 63)]
    assert drain(errors) == [], "each event is delivered once per set"
    assert drain(also) == [(4, XID, 48), (4, XID, 94), (4, XID, 63)]
    assert drain(correctable) == [(1, SBE, 0), (1, SBE, 0)], "at 30 s and 50 s"
    late = register(4, XID)
    clock.at(200.0)
    assert drain(late) == [], "a set only records what happens after registration"
    for event_set in (errors, also, correctable, late):
        pynvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(errors, 0)


def test_registering_unsupported_event_types(install: Install) -> None:
    install("dgx-h100")
    event_set = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(handle(0), pynvml.nvmlEventTypeClock | XID, event_set)
    pynvml.nvmlEventSetFree(event_set)


def test_wait_blocks_until_its_timeout(install: Install) -> None:
    fake = install("dgx-h100")
    event_set = register(0, XID)
    fake.reset_counts()
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 200)
    waited = time.monotonic() - started
    assert 0.19 <= waited < 2.0
    assert fake.call_counts() == {"nvmlEventSetWait_v2": 1}, "a wait costs one call however long it sleeps"


def wait_in_thread(
    fake: FakeNvmlLibrary, event_set: Any, timeout_ms: int
) -> tuple[threading.Thread, list[Any]]:
    """Start a thread blocked in ``nvmlEventSetWait_v2``; returns once that call has reached the library."""
    result: list[Any] = []
    calls_before = fake.call_counts().get("nvmlEventSetWait_v2", 0)

    def run() -> None:
        try:
            result.append(pynvml.nvmlEventSetWait_v2(event_set, timeout_ms))
        except pynvml.NVMLError as error:
            result.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5.0
    while fake.call_counts().get("nvmlEventSetWait_v2", 0) <= calls_before:
        assert time.monotonic() < deadline, "the waiting thread never called nvmlEventSetWait_v2"
        time.sleep(0.005)
    return thread, result


@pytest.mark.parametrize("how", ["injected now", "scheduled, clock moves"])
def test_wait_returns_an_event_that_happens_while_it_waits(install: Install, clock: FakeClock, how: str) -> None:
    fake = install("dgx-h100")
    event_set = register(2, XID)
    if how == "scheduled, clock moves":
        fake.apply_faults("xid:31:2@5")
    thread, result = wait_in_thread(fake, event_set, 10_000)
    assert thread.is_alive(), "nothing is due yet"
    started = time.monotonic()
    if how == "injected now":
        fake.xid(13, 2)
    else:
        clock.at(5.0)
    thread.join(timeout=5.0)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2.0
    (data,) = result
    assert (data.eventType, data.eventData) == (XID, 13 if how == "injected now" else 31)
    assert address(data.device) == address(handle(2))


def test_real_time_wait_sleeps_until_a_scheduled_event(install: Install) -> None:
    fake = install("dgx-h100", clock=time.time)
    event_set = register(1, XID)
    fake.apply_faults("xid:13:1@0.3")
    started = time.monotonic()
    data = pynvml.nvmlEventSetWait_v2(event_set, 5_000)
    waited = time.monotonic() - started
    assert (data.eventType, data.eventData) == (XID, 13)
    assert 0.2 <= waited < 2.0, "woken when the event is due, not at the timeout"


def test_free_wakes_a_waiting_thread(install: Install) -> None:
    fake = install("dgx-h100")
    event_set = register(0, XID)
    thread, result = wait_in_thread(fake, event_set, 30_000)
    started = time.monotonic()
    pynvml.nvmlEventSetFree(event_set)
    thread.join(timeout=5.0)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2.0
    (error,) = result
    assert isinstance(error, pynvml.NVMLError_InvalidArgument)


def test_injected_xids_change_the_counters_a_real_driver_changes(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    watcher = register(6, XID | DBE)
    clock.at(10.0)
    fake.apply_faults("xid:48:6; xid:63:6@20; xid:64:6@30; xid:95:6@40")
    assert ecc(handle(6)) == [0, 0, 1, 1]
    assert pynvml.nvmlDeviceGetRemappedRows(handle(6)) == (0, 0, 0, 0)
    clock.at(20.0)
    assert pynvml.nvmlDeviceGetRemappedRows(handle(6)) == (0, 1, 1, 0)
    clock.at(30.0)
    assert pynvml.nvmlDeviceGetRemappedRows(handle(6)) == (0, 1, 1, 1)
    clock.at(40.0)
    assert ecc(handle(6)) == [0, 0, 2, 2]
    assert drain(watcher) == [(6, XID, 48), (6, DBE, 0), (6, XID, 63), (6, XID, 64), (6, XID, 95), (6, DBE, 0)]
    clock.at(0.0)
    fake = install("t4")
    clock.at(1.0)
    fake.apply_faults("xid:48:0; xid:63:0")
    assert ecc(handle(0)) == [0, 37, 1, 1]
    dbe_pages = pynvml.nvmlDeviceGetRetiredPages(handle(0), pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    assert len(dbe_pages) == 1
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle(0)) == pynvml.NVML_FEATURE_ENABLED


def test_losing_a_gpu_sends_xid_79_when_it_happens(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    gpu3 = handle(3)
    lost, other, later = register(3, XID), register(2, XID), register(1, XID)
    fake.apply_faults("lose:3@5")
    clock.at(4.9)
    assert drain(lost) == []
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu3).gpu >= 0
    clock.at(5.0)
    assert drain(lost) == [(3, XID, 79)]
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUtilizationRates(gpu3)
    assert drain(other) == []
    clock.at(6.0)
    fake.lose_gpu(1)
    assert drain(later) == [(1, XID, 79)]


@pytest.mark.parametrize(
    "item",
    ["xid", "xid:48", "xid:x:1", "xid:48:8", "xid:0:1", "xid:1000:1", "xid:48:1:2", "xid:48:1@soon", "xid:48:-1"],
)
def test_bad_xid_fault_items_name_themselves(install: Install, item: str) -> None:
    fake = install("dgx-h100")
    with pytest.raises(ValueError, match="bad NVML fault") as caught:
        fake.apply_faults(f"xid:13:0; {item}")
    message = str(caught.value)
    assert repr(item) in message
    assert "\n" not in message
    assert "xid:CODE:DEVICE" in message, "the syntax is spelled out"
    event_set = register(0, XID)
    assert drain(event_set) == [], "nothing of a rejected spec is applied"


def test_good_xid_fault_items(install: Install, clock: FakeClock) -> None:
    fake = install("dgx-h100")
    event_set = register(7, XID)
    fake.apply_faults(" xid:43:7 ; xid:31:7@2.5 ;; ")
    assert drain(event_set) == [(7, XID, 43)]
    clock.at(2.5)
    assert drain(event_set) == [(7, XID, 31)]


# Per-sweep readings of every profile


@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-b200", "a100-pcie-2", "t4"])
def test_other_profiles_are_plausible_over_two_minutes(install: Install, clock: FakeClock, profile: str) -> None:
    install(profile)
    count = pynvml.nvmlDeviceGetCount()
    idle = PROFILES[profile].idle_gpus
    for step in range(60):
        clock.at(step * 2.0 + 0.005)
        for gpu in range(count):
            h = handle(gpu)
            pstate = pynvml.nvmlDeviceGetPerformanceState(h)
            reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            assert pstate == (pynvml.NVML_PSTATE_8 if gpu in idle else pynvml.NVML_PSTATE_0)
            assert bool(reasons & GPU_IDLE) == (gpu in idle)
            assert not reasons & (HW_SLOWDOWN | SW_THERMAL), "no thermal trouble outside dgx-h100"
            graphics = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS)
            assert 0 < graphics <= pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS)
            if profile != "t4":
                assert 0 < pynvml.nvmlDeviceGetPowerUsage(h) <= pynvml.nvmlDeviceGetEnforcedPowerLimit(h)
            assert ecc(h)[2:] == [0, 0], "no uncorrectable errors"
            assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 0
            assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
    if profile == "dgx-b200":
        clock.at(130.0)
        assert ecc(handle(2))[:2] == [3, 3], "correctable errors at 40, 85 and 130 s"


def test_latency_is_modelled_for_the_new_calls() -> None:
    fake = FakeNvmlLibrary("dgx-h100", latency_scale=1.0)
    fake.nvmlInit_v2()
    device = ctypes.c_void_p()
    fake.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device))
    value = ctypes.c_uint()
    started = time.perf_counter()
    for _ in range(100):
        assert fake.nvmlDeviceGetPerformanceState(device, ctypes.byref(value)) == pynvml.NVML_SUCCESS
    assert time.perf_counter() - started >= 100 * 25e-6, "about 30 us per getter"
    assert value.value == pynvml.NVML_PSTATE_0
