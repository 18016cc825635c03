"""Level changes between readings become events: counters, flags, throttling episodes, links, PCIe, lost GPUs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nvdash.health.clock_events import GPU_IDLE, HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, SW_POWER_CAP
from nvdash.health.events import EventDetector, detect_events, format_duration, increment_subject
from nvdash.sampling.records import (
    EVENT_KINDS,
    GpuEvent,
    GpuInfo,
    GpuSample,
    HostInfo,
    HostSample,
    Inventory,
    NvLinkSample,
    Snapshot,
)

GiB = 1024**3
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 80 * GiB, 5, 16, 63e9, 4, 100e9)
L4 = GpuInfo(1, "NVIDIA L4", "GPU-1", 24 * GiB, 4, 16, 31.5e9, 0, None)
INVENTORY = Inventory(host=HostInfo("node", 16, 64 * GiB), gpus=(H100, L4))


def gpu0(**changes: Any) -> GpuSample:
    base = GpuSample(0, utilization_pct=90.0, temperature_c=70.0, clock_event_reasons=0,
                     ecc_corrected_volatile=0, ecc_uncorrected_volatile=0, remap_pending=False, remap_failure=False,
                     retired_pages_pending=False, pcie_generation_current=5, pcie_width_current=16,
                     pcie_replay_count=0,
                     nvlinks=tuple(NvLinkSample(link, active=True, crc_flit_errors=0) for link in range(4)))
    return replace(base, **changes)


def snap(time_s: float, *gpus: GpuSample) -> Snapshot:
    return Snapshot(time_s, gpus, HostSample())


def between(before: GpuSample, after: GpuSample) -> list[tuple[str, str, str]]:
    """``(kind, severity, message)`` of the events from ``before`` to ``after`` (one second apart)."""
    return [(e.kind, e.severity, e.message) for e in detect_events(INVENTORY, snap(1.0, before), snap(2.0, after))]


def test_no_previous_snapshot_and_no_change_give_no_events() -> None:
    assert detect_events(INVENTORY, None, snap(1.0, gpu0())) == []
    assert between(gpu0(), gpu0()) == []


def test_events_carry_time_gpu_and_a_known_kind() -> None:
    (event,) = detect_events(INVENTORY, snap(1.0, gpu0()), snap(2.0, gpu0(ecc_uncorrected_volatile=1)))
    assert event == GpuEvent(2.0, 0, "ecc", "uncorrectable ECC errors rose by 1 (now 1)", "critical",
                             counter="uncorrectable ECC errors")
    assert event.kind in EVENT_KINDS


def test_ecc_counter_increments_are_events_with_severity() -> None:
    assert between(gpu0(), gpu0(ecc_corrected_volatile=3)) == [
        ("ecc", "warning", "corrected ECC errors rose by 3 (now 3)")]
    assert between(gpu0(ecc_corrected_volatile=5), gpu0(ecc_corrected_volatile=2)) == []  # reset counters
    assert between(gpu0(retired_pages_dbe=0), gpu0(retired_pages_dbe=1)) == [
        ("ecc", "critical", "pages retired for double-bit errors rose by 1 (now 1)")]
    assert between(gpu0(remapped_rows_corrected=1), gpu0(remapped_rows_corrected=2)) == [
        ("remap", "warning", "rows remapped for corrected errors rose by 1 (now 2)")]


def test_aggregate_ecc_counts_only_where_volatile_is_not_reported() -> None:
    assert between(gpu0(ecc_corrected_aggregate=10), gpu0(ecc_corrected_volatile=1, ecc_corrected_aggregate=11)) == [
        ("ecc", "warning", "corrected ECC errors rose by 1 (now 1)")]
    only_aggregate = {"ecc_corrected_volatile": None, "ecc_uncorrected_volatile": None}
    assert between(gpu0(**only_aggregate, ecc_uncorrected_aggregate=4),
                   gpu0(**only_aggregate, ecc_uncorrected_aggregate=6)) == [
        ("ecc", "critical", "uncorrectable ECC errors rose by 2 (now 6)")]


def test_unknown_readings_give_no_events_and_no_crash() -> None:
    assert between(gpu0(), GpuSample(0)) == []
    assert between(GpuSample(0), gpu0()) == []
    assert between(GpuSample(0), GpuSample(0)) == []


def test_remap_pending_set_and_cleared() -> None:
    assert between(gpu0(), gpu0(remap_pending=True)) == [
        ("remap", "critical", "row remapping pending: reset the GPU")]
    assert between(gpu0(remap_pending=True), gpu0()) == [("remap", "info", "row remapping no longer pending")]
    assert between(gpu0(), gpu0(remap_failure=True))[0][1] == "critical"
    assert between(gpu0(), gpu0(retired_pages_pending=True))[0][:2] == ("ecc", "warning")


def test_throttling_episodes_start_and_end() -> None:
    assert between(gpu0(), gpu0(clock_event_reasons=HW_THERMAL_SLOWDOWN | HW_SLOWDOWN, temperature_c=91.0)) == [
        ("throttle", "warning", "HW thermal throttling started at 91 °C")]
    assert between(gpu0(clock_event_reasons=HW_SLOWDOWN), gpu0()) == [
        ("throttle", "info", "HW slowdown throttling ended after 1 s")]
    assert between(gpu0(), gpu0(clock_event_reasons=SW_POWER_CAP)) == [
        ("throttle", "info", "SW power cap throttling started")]
    assert between(gpu0(), gpu0(clock_event_reasons=GPU_IDLE)) == []
    assert between(gpu0(clock_event_reasons=SW_POWER_CAP), gpu0(clock_event_reasons=None)) == []


def test_nvlink_link_down_and_up_on_an_nvlink_gpu() -> None:
    down = tuple(NvLinkSample(link, active=link != 2) for link in range(4))
    assert between(gpu0(), gpu0(nvlinks=down)) == [("link", "warning", "NVLink link 2 went down")]
    assert between(gpu0(nvlinks=down), gpu0()) == [("link", "info", "NVLink link 2 is up again")]


def test_nvlink_reading_down_on_a_card_without_nvlink_is_not_an_event() -> None:
    flapping = (GpuSample(1, nvlinks=(NvLinkSample(0, active=True),)), GpuSample(1, nvlinks=(NvLinkSample(0, False),)))
    assert detect_events(INVENTORY, snap(1.0, flapping[1]), snap(2.0, flapping[0])) == []
    detector = EventDetector(INVENTORY)
    detector.observe(snap(1.0, flapping[1]))
    detector.observe(snap(2.0, flapping[1]))
    assert [e.message for e in detector.observe(snap(3.0, flapping[0]))] == []
    # Once a link was seen active, its going down matters even where the inventory found no NVLink.
    assert [e.message for e in detector.observe(snap(4.0, flapping[1]))] == ["NVLink link 0 went down"]


def test_nvlink_crc_errors_rising_is_an_event() -> None:
    crc = tuple(NvLinkSample(link, active=True, crc_flit_errors=5 if link == 1 else 0, crc_data_errors=2 if link == 1
                             else None) for link in range(4))
    assert between(gpu0(), gpu0(nvlinks=crc)) == [("link", "warning", "NVLink link 1 CRC errors rose by 7 (now 7)")]


def test_pcie_width_change_and_generation_drop_while_busy() -> None:
    assert between(gpu0(), gpu0(pcie_width_current=8)) == [
        ("pcie", "warning", "PCIe link width dropped from x16 to x8 (max x16)")]
    assert between(gpu0(pcie_width_current=8), gpu0()) == [("pcie", "info", "PCIe link width back up from x8 to x16")]
    assert between(gpu0(), gpu0(pcie_generation_current=3)) == [
        ("pcie", "warning", "PCIe link running at Gen3 while busy (max Gen5)")]
    assert between(gpu0(pcie_generation_current=3), gpu0()) == [("pcie", "info", "PCIe link back at Gen5")]


def test_pcie_generation_drop_of_an_idle_gpu_is_not_an_event() -> None:
    idle = gpu0(utilization_pct=0.0, pcie_generation_current=1, clock_event_reasons=GPU_IDLE)
    assert between(gpu0(), idle) == []
    assert between(idle, gpu0()) == []


def test_replay_counter_increase_is_a_pcie_event() -> None:
    assert between(gpu0(), gpu0(pcie_replay_count=4)) == [("pcie", "warning", "PCIe replays rose by 4 (now 4)")]


def test_gpu_lost_and_back() -> None:
    assert between(gpu0(), GpuSample(0, lost=True)) == [
        ("lost", "critical", "GPU lost: it stopped answering (fallen off the bus?)")]
    assert between(GpuSample(0, lost=True), GpuSample(0, lost=True)) == []
    assert between(GpuSample(0, lost=True), gpu0()) == [("lost", "info", "GPU answers again")]


def test_a_reading_error_is_reported_once_when_it_starts() -> None:
    assert between(gpu0(), GpuSample(0, error="timeout")) == [("health", "warning", "reading failed: timeout")]
    assert between(GpuSample(0, error="timeout"), GpuSample(0, error="timeout")) == []


def test_only_the_gpu_that_changed_reports_and_the_first_reading_is_a_baseline() -> None:
    detector = EventDetector(INVENTORY)
    assert detector.observe(snap(1.0, gpu0(remap_pending=True, clock_event_reasons=HW_SLOWDOWN),
                                 GpuSample(1, lost=True))) == []
    events = detector.observe(snap(2.0, gpu0(remap_pending=True, clock_event_reasons=HW_SLOWDOWN), GpuSample(1)))
    assert [(e.gpu_index, e.message) for e in events] == [(1, "GPU answers again")]


# --- debouncing -------------------------------------------------------------------------------------------


def test_a_flapping_throttle_bit_is_one_episode_until_it_stays_clear() -> None:
    detector = EventDetector(INVENTORY, settle_s=5.0)
    detector.observe(snap(0.0, gpu0()))
    messages = []
    for second, mask in enumerate([SW_POWER_CAP, 0, SW_POWER_CAP, 0, 0, SW_POWER_CAP, 0, 0, 0, 0, 0, 0, 0], 1):
        messages += [e.message for e in detector.observe(snap(float(second), gpu0(clock_event_reasons=mask)))]
    assert messages == ["SW power cap throttling started", "SW power cap throttling ended after 6 s"]


def test_a_counter_that_keeps_rising_gives_one_event_per_coalescing_window() -> None:
    detector = EventDetector(INVENTORY, coalesce_s=60.0)
    detector.observe(snap(0.0, gpu0()))
    found: list[tuple[float, str]] = []
    for second in range(1, 131):
        found += [(e.time_s, e.message) for e in detector.observe(snap(float(second), gpu0(pcie_replay_count=second)))]
    assert found == [
        (1.0, "PCIe replays rose by 1 (now 1)"),
        (61.0, "PCIe replays rose by 60 (now 61)"),
        (121.0, "PCIe replays rose by 60 (now 121)"),
    ]
    # The increments held back are reported once the counter goes quiet.
    quiet = [e.message for t in range(131, 200) for e in detector.observe(snap(float(t), gpu0(pcie_replay_count=130)))]
    assert quiet == ["PCIe replays rose by 9 (now 130)"]


def test_the_detector_has_the_samplers_deriver_shape() -> None:
    detector = EventDetector(INVENTORY)
    assert detector(None, snap(1.0, gpu0())) == []
    assert [e.message for e in detector(None, snap(2.0, gpu0(remap_pending=True)))] == [
        "row remapping pending: reset the GPU"]


def test_increment_subject_and_durations() -> None:
    assert increment_subject(GpuEvent(1.0, 0, "pcie", "PCIe replays rose by 4 (now 4)", "warning",
                                      counter="PCIe replays")) == "PCIe replays"
    assert increment_subject(GpuEvent(1.0, 0, "link", "NVLink link 2 went down", "warning")) is None
    assert format_duration(12.4) == "12 s"
    assert format_duration(185) == "3 min 5 s"
    assert format_duration(7800) == "2 h 10 min"
    assert format_duration(3600) == "1 h"
