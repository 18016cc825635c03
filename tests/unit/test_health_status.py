"""Health rules, like ``dcgmi health``: one status per GPU with reasons; unknown readings give no finding."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from nvdash.accounting.attribution import Owner
from nvdash.accounting.idle import MEMORY_AT_ZERO, NO_PROCESS, IdleAllocation
from nvdash.health.clock_events import (
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
)
from nvdash.health.status import (
    IDLE_ACTION,
    Finding,
    GpuHealth,
    Status,
    evaluate,
    evaluate_gpu,
    format_age,
    format_duration,
    owner_text,
    worst,
)
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

GiB = 1024**3
NOW = 10_000.0

H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 80 * GiB, 5, 16, 63e9, 18, 450e9,
               pci_bus_id="00000000:18:00.0", temperature_slowdown_c=87.0, temperature_shutdown_c=92.0,
               temperature_memory_max_c=95.0, ecc_enabled=True, memory_error_mechanism="row remapping")
L4 = GpuInfo(1, "NVIDIA L4", "GPU-1", 24 * GiB, 4, 16, 31.5e9, 0, None)
INVENTORY = Inventory(host=HostInfo("node", 16, 64 * GiB), gpus=(H100, L4))


def healthy(index: int = 0, **changes: Any) -> GpuSample:
    """A busy GPU with every reading known and nothing wrong."""
    base = GpuSample(
        index, utilization_pct=90.0, temperature_c=60.0, memory_temperature_c=70.0, clock_event_reasons=SW_POWER_CAP,
        ecc_corrected_volatile=3, ecc_uncorrected_volatile=0, remap_pending=False, remap_failure=False,
        retired_pages_pending=False, pcie_generation_current=5 if index == 0 else 4, pcie_width_current=16,
        pcie_replay_count=0, nvlinks=tuple(NvLinkSample(link, active=True) for link in range(18)) if index == 0 else (),
    )
    return replace(base, **changes)


def health_of(sample: GpuSample, info: GpuInfo = H100, events: tuple[GpuEvent, ...] = ()) -> GpuHealth:
    return evaluate_gpu(info, sample, events, NOW)


def texts(health: GpuHealth) -> list[str]:
    return [finding.text for finding in health.findings]


def test_a_healthy_gpu_is_ok_with_no_reasons() -> None:
    result = evaluate(INVENTORY, Snapshot(NOW, (healthy(0), healthy(1)), HostSample()), [], NOW)
    assert result == (GpuHealth(0, Status.OK, ()), GpuHealth(1, Status.OK, ()))


def test_status_values_order_and_labels() -> None:
    assert [status.value for status in Status] == ["ok", "warning", "critical"]
    assert Status("critical") is Status.CRITICAL
    assert worst([Status.WARNING, Status.OK]) is Status.WARNING
    assert worst([]) is Status.OK
    assert Status.WARNING.label == "Warning"
    assert Status.OK.label == "OK"


def test_every_reading_unknown_gives_no_finding_and_no_crash() -> None:
    unknown = GpuSample(0)
    assert health_of(unknown) == GpuHealth(0, Status.OK, ())
    bare_info = GpuInfo(0, "GPU", "GPU-0", None, None, None, None, 0, None)
    assert health_of(unknown, bare_info) == GpuHealth(0, Status.OK, ())
    with_all_none_links = GpuSample(0, nvlinks=(NvLinkSample(0), NvLinkSample(1)))
    assert health_of(with_all_none_links).findings == ()


def test_no_snapshot_yet_or_gpu_missing_from_it_is_ok() -> None:
    assert evaluate(INVENTORY, None, [], NOW) == (GpuHealth(0, Status.OK, ()), GpuHealth(1, Status.OK, ()))
    partial = Snapshot(NOW, (healthy(1),), HostSample())
    assert [h.status for h in evaluate(INVENTORY, partial, [], NOW)] == [Status.OK, Status.OK]
    assert evaluate(Inventory(host=INVENTORY.host), None, [], NOW) == ()


def test_a_lost_gpu_is_critical_and_the_others_keep_their_own_status() -> None:
    snapshot = Snapshot(NOW, (GpuSample(0, lost=True), healthy(1)), HostSample())
    lost, other = evaluate(INVENTORY, snapshot, [], NOW)
    assert lost.status is Status.CRITICAL
    assert lost.findings[0].kind == "lost"
    assert "GPU lost" in lost.findings[0].text
    assert other == GpuHealth(1, Status.OK, ())


def test_a_reading_error_is_a_warning() -> None:
    result = health_of(GpuSample(0, error="NVMLError_Unknown"))
    assert result.status is Status.WARNING
    assert texts(result) == ["no reading this sweep: NVMLError_Unknown"]


# --- memory errors ----------------------------------------------------------------------------------------


def test_uncorrectable_ecc_with_remap_pending_says_reset_the_gpu() -> None:
    result = health_of(healthy(ecc_uncorrected_volatile=1, remap_pending=True))
    assert result.status is Status.CRITICAL
    assert texts(result) == ["uncorrectable ECC error, row remapping pending: reset the GPU"]
    assert result.findings[0].action


def test_uncorrectable_ecc_alone_remap_pending_alone_and_remap_failure_are_critical() -> None:
    assert texts(health_of(healthy(ecc_uncorrected_volatile=2))) == [
        "2 uncorrectable ECC errors since the driver loaded"]
    assert texts(health_of(healthy(remap_pending=True))) == ["row remapping pending: reset the GPU"]
    failed = health_of(healthy(remap_failure=True))
    assert failed.status is Status.CRITICAL
    assert texts(failed) == ["row remapping failed: the GPU needs service"]


def test_retired_pages_pending_is_a_warning() -> None:
    result = health_of(healthy(retired_pages_pending=True))
    assert result.status is Status.WARNING
    assert texts(result) == ["retired pages pending: reset the GPU to retire them"]


def test_corrected_ecc_count_alone_is_not_a_finding() -> None:
    assert health_of(healthy(ecc_corrected_volatile=1_000)).findings == ()


# --- temperature and clocks -------------------------------------------------------------------------------


def test_thermal_bit_means_thermal_slowdown_now() -> None:
    result = health_of(healthy(temperature_c=88.0, clock_event_reasons=HW_THERMAL_SLOWDOWN | HW_SLOWDOWN))
    assert result.status is Status.WARNING
    assert texts(result) == ["thermal slowdown now (HW) at 88 °C (slowdown at 87 °C)"]
    software = health_of(healthy(temperature_c=None, clock_event_reasons=SW_THERMAL_SLOWDOWN))
    assert texts(software) == ["thermal slowdown now (SW) (slowdown at 87 °C)"]


@pytest.mark.parametrize(("temp", "expected"), [
    (81.9, []),
    (82.0, ["82 °C, within 5 °C of the slowdown threshold (87 °C)"]),
    (87.0, ["87 °C, at or above the slowdown threshold (87 °C)"]),
])
def test_temperature_near_slowdown_is_a_warning(temp: float, expected: list[str]) -> None:
    result = health_of(healthy(temperature_c=temp))
    assert texts(result) == expected
    assert result.status is (Status.WARNING if expected else Status.OK)


def test_temperature_near_shutdown_is_critical() -> None:
    assert health_of(healthy(temperature_c=89.0)).status is Status.WARNING
    result = health_of(healthy(temperature_c=90.0))
    assert result.status is Status.CRITICAL
    assert texts(result) == ["90 °C, within 2 °C of shutdown at 92 °C",
                             "90 °C, at or above the slowdown threshold (87 °C)"]


def test_temperature_without_thresholds_gives_no_finding() -> None:
    assert health_of(healthy(temperature_c=99.0), L4).findings == ()


def test_memory_temperature_near_its_maximum_is_a_warning() -> None:
    assert texts(health_of(healthy(memory_temperature_c=91.0))) == [
        "memory at 91 °C, within 5 °C of its maximum (95 °C)"]


def test_hw_slowdown_and_power_brake_are_warnings_sw_power_cap_is_not() -> None:
    assert texts(health_of(healthy(clock_event_reasons=HW_SLOWDOWN))) == [
        "HW slowdown active: the hardware is holding the clocks down"]
    brake = health_of(healthy(clock_event_reasons=HW_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN))
    assert texts(brake) == ["HW power brake active: an external signal is holding the clocks down"]
    assert health_of(healthy(clock_event_reasons=SW_POWER_CAP | GPU_IDLE)).findings == ()


# --- PCIe and NVLink --------------------------------------------------------------------------------------


def test_pcie_narrower_than_its_maximum_is_downtrained() -> None:
    result = health_of(healthy(pcie_width_current=8))
    assert result.status is Status.WARNING
    assert texts(result) == ["PCIe Gen5 x16 running at x8"]


def test_pcie_lower_generation_counts_only_while_busy() -> None:
    assert texts(health_of(healthy(pcie_generation_current=3))) == ["PCIe Gen5 x16 running at Gen3"]
    assert texts(health_of(healthy(pcie_generation_current=3, pcie_width_current=4))) == [
        "PCIe Gen5 x16 running at Gen3 x4"]
    # Idle GPUs lower the link generation to save power.
    assert health_of(healthy(pcie_generation_current=1, utilization_pct=0.0)).findings == ()
    assert health_of(healthy(pcie_generation_current=1, clock_event_reasons=GPU_IDLE)).findings == ()
    assert health_of(healthy(pcie_generation_current=1, utilization_pct=None)).findings == ()


def test_pcie_unknown_maximum_or_current_gives_no_finding() -> None:
    no_max = replace(H100, pcie_generation=None, pcie_width=None)
    assert health_of(healthy(pcie_generation_current=1, pcie_width_current=1), no_max).findings == ()
    assert health_of(healthy(pcie_generation_current=None, pcie_width_current=None)).findings == ()


def test_nvlink_links_down_on_an_nvlink_gpu_are_a_warning() -> None:
    links = tuple(NvLinkSample(link, active=link not in (3, 7)) for link in range(18))
    up_at_start = replace(H100, nvlink_active_links=tuple(range(18)))
    result = health_of(healthy(nvlinks=links), up_at_start)
    assert result.status is Status.WARNING
    assert texts(result) == ["NVLink: 2 of 18 links down (links 3, 7)"]


def test_a_link_down_from_the_start_on_an_nvswitch_system_is_a_warning() -> None:
    links = tuple(NvLinkSample(link, active=link != 3) for link in range(18))
    switched = replace(H100, nvlink_links=17, nvlink_active_links=tuple(i for i in range(18) if i != 3),
                       nvlink_to_switch=True)
    assert texts(health_of(healthy(nvlinks=links), switched)) == ["NVLink: 1 of 18 links down (link 3)"]
    bridged = replace(switched, nvlink_to_switch=False)
    assert health_of(healthy(nvlinks=links), bridged).findings == (), "an unbridged link of a PCIe card"


def test_nvlink_down_on_a_pcie_card_without_bridges_is_not_a_finding() -> None:
    links = tuple(NvLinkSample(link, active=False) for link in range(4))
    assert health_of(healthy(1, nvlinks=links), L4).findings == ()


def test_nvlink_entries_beyond_the_wired_links_are_not_a_finding() -> None:
    twelve = replace(H100, nvlink_links=12, nvlink_active_links=tuple(range(12)))
    links = tuple(NvLinkSample(link, active=link < 12) for link in range(18))
    assert health_of(healthy(nvlinks=links), twelve).findings == ()


# --- recent events ----------------------------------------------------------------------------------------


def xid(code: int, age_s: float, gpu: int | None = 0) -> GpuEvent:
    return GpuEvent(NOW - age_s, gpu, "xid", f"Xid {code}", "critical", code)


def test_a_recent_xid_is_reported_with_the_catalog_meaning_and_its_age() -> None:
    result = health_of(healthy(), events=(xid(79, 125.0),))
    assert result.status is Status.CRITICAL
    assert texts(result) == ["XID 79: GPU fell off the bus, 2 min ago"]
    assert result.findings[0].kind == "xid"
    assert "reboot" in result.findings[0].action


def test_xid_severity_comes_from_the_catalog_and_repeats_are_counted() -> None:
    result = health_of(healthy(), events=(xid(13, 50.0), xid(13, 20.0), xid(13, 30.0)))
    assert result.status is Status.WARNING
    assert texts(result) == ["XID 13: graphics engine exception (often an out-of-bounds access in a kernel), "
                             "20 s ago (3 times)"]


def test_old_xids_other_gpus_xids_and_unknown_codes() -> None:
    assert health_of(healthy(), events=(xid(79, 601.0), xid(79, 5.0, gpu=1), xid(79, 5.0, gpu=None))).findings == ()
    unknown = health_of(healthy(), events=(xid(999, 0.0),))
    assert unknown.status is Status.WARNING
    assert texts(unknown) == ["XID 999: XID 999, not in nvdash's catalog, just now"]


def test_rising_counters_from_the_event_log_are_findings_level_changes_are_not() -> None:
    events = (
        GpuEvent(NOW - 90, 0, "ecc", "corrected ECC errors rose by 2 (now 5)", "warning",
                 counter="corrected ECC errors"),
        GpuEvent(NOW - 30, 0, "ecc", "corrected ECC errors rose by 4 (now 9)", "warning",
                 counter="corrected ECC errors"),
        GpuEvent(NOW - 10, 0, "link", "NVLink link 2 CRC errors rose by 7 (now 7)", "warning",
                 counter="NVLink link 2 CRC errors"),
        GpuEvent(NOW - 10, 0, "link", "NVLink link 2 went down", "warning"),
        GpuEvent(NOW - 10, 0, "throttle", "HW thermal throttling started", "warning"),
        GpuEvent(NOW - 10, 0, "pcie", "PCIe replays rose by 1 (now 1)", "info", counter="PCIe replays"),
    )
    result = health_of(healthy(), events=events)
    assert result.status is Status.WARNING
    assert texts(result) == [
        "corrected ECC errors rose by 4 (now 9), 30 s ago (2 increases in 10 min)",
        "NVLink link 2 CRC errors rose by 7 (now 7), 10 s ago",
    ]


def test_findings_are_sorted_worst_first() -> None:
    result = health_of(healthy(pcie_width_current=8, remap_pending=True))
    assert [finding.status for finding in result.findings] == [Status.CRITICAL, Status.WARNING]


def test_age_reads_like_a_person_would_say_it() -> None:
    assert format_age(0.2) == "just now"
    assert format_age(-5) == "just now"
    assert format_age(42) == "40 s ago", "tens of seconds: a live page's text changes every 10 s, not every sweep"
    assert format_age(9.9) == "just now"
    assert format_age(10) == "10 s ago"
    assert format_age(150) == "2 min ago"
    assert format_age(7300) == "2 h ago"


def test_records_are_frozen_and_shaped_as_documented() -> None:
    assert [f.name for f in fields(Finding)] == ["status", "text", "kind", "action"]
    assert [f.name for f in fields(GpuHealth)] == ["index", "status", "findings"]
    finding = Finding(Status.OK, "x", "y")
    with pytest.raises(AttributeError):
        finding.text = "z"  # type: ignore[misc]


def test_importing_health_loads_no_bokeh_and_no_hardware_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, threading, nvdash.health\n"
        "loaded = [m for m in ('bokeh', 'pynvml', 'psutil') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert threading.active_count() == 1\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr


# --- allocated but idle (the accounting's flagged allocations) ----------------------------------------------

ALICE_JOB = Owner("slurm", "555", "alice", "physics")


def test_an_allocation_idle_long_enough_is_a_warning_on_its_gpu() -> None:
    idle = [IdleAllocation(0, "GPU-0", ALICE_JOB, NOW - 47 * 60 - 5, NO_PROCESS, None)]
    snapshot = Snapshot(NOW, (healthy(0), healthy(1)), HostSample())
    result = evaluate(INVENTORY, snapshot, [], NOW, idle=idle)
    assert result[0].status is Status.WARNING
    assert result[0].findings == (
        Finding(Status.WARNING, "allocated but idle for 47 min: Slurm job 555 (alice), no process", "idle",
                IDLE_ACTION),)
    assert IDLE_ACTION == "end the job or release the GPU"
    assert result[1] == GpuHealth(1, Status.OK, ())
    assert evaluate(INVENTORY, snapshot, [], NOW) == (GpuHealth(0, Status.OK, ()), GpuHealth(1, Status.OK, ()))


def test_idle_findings_name_the_owner_the_mig_instance_and_the_memory_held() -> None:
    pod = Owner("pod", "ml/trainer-0", "bob", "ml")
    idle = [IdleAllocation(1, "MIG-abc", pod, NOW - 2 * 3600 - 5 * 60, MEMORY_AT_ZERO, 12 * GiB),
            IdleAllocation(1, "GPU-1", Owner("user", "carol", "carol", "unknown"), NOW - 40, "utilization 0", None)]
    health = evaluate_gpu(L4, healthy(1), (), NOW, idle=idle)
    assert health.status is Status.WARNING
    assert texts(health) == [
        "allocated but idle for 2 h 5 min: pod ml/trainer-0 (bob) on MIG-abc, memory held at 0 % compute (12.0 GiB)",
        "allocated but idle for 40 s: user carol, utilization 0",
    ]


def test_idle_findings_rank_below_worse_ones_and_skip_a_lost_gpu() -> None:
    idle = [IdleAllocation(0, "GPU-0", ALICE_JOB, NOW - 3600, NO_PROCESS, None)]
    critical = evaluate_gpu(H100, healthy(0, remap_failure=True), (), NOW, idle=idle)
    assert [finding.kind for finding in critical.findings] == ["remap", "idle"]
    assert critical.status is Status.CRITICAL
    lost = evaluate_gpu(H100, GpuSample(0, lost=True), (), NOW, idle=idle)
    assert [finding.kind for finding in lost.findings] == ["lost"]


def test_durations_and_owners_read_like_a_person_would_say_them() -> None:
    assert format_duration(5.7) == "5 s"
    assert format_duration(59.9) == "59 s"
    assert format_duration(60) == "1 min"
    assert format_duration(47 * 60 + 59) == "47 min"
    assert format_duration(3600) == "1 h"
    assert format_duration(3 * 3600 + 5 * 60 + 30) == "3 h 5 min"
    assert owner_text(ALICE_JOB) == "Slurm job 555 (alice)"
    assert owner_text(Owner("slurm", "556", "unknown", "unknown")) == "Slurm job 556"
    assert owner_text(Owner("container", "0123456789ab", "bob", "bob")) == "container 0123456789ab (bob)"
