"""OK / Warning / Critical per GPU with the reasons in words, the way ``dcgmi health`` reports.

Levels come from the newest snapshot (temperature, throttling, ECC, row remapping, PCIe, NVLink, lost);
what happened recently (XIDs, counters that rose) comes from the event log; the accounting's allocations idle
for long enough (``--idle-after``) are a warning on their GPU. ``None`` means unknown or unsupported and never
gives a finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from nvdash.accounting.attribution import UNKNOWN, Owner
from nvdash.accounting.idle import MEMORY_AT_ZERO, IdleAllocation
from nvdash.health.clock_events import (
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_THERMAL_SLOWDOWN,
    THERMAL,
    is_set,
    throttling_reasons,
)
from nvdash.health.events import BUSY_UTIL_PCT, increment_subject
from nvdash.health.xid import xid_info
from nvdash.sampling.records import GpuEvent, GpuInfo, GpuSample, Inventory, Snapshot
from nvdash.units import format_bytes

RECENT_S = 600.0
"""How far back an XID or a rising counter still counts."""
NEAR_LIMIT_C = 5.0
"""A temperature this close to the slowdown threshold (or the memory maximum) is a warning."""
NEAR_SHUTDOWN_C = 2.0
"""A temperature this close to the shutdown threshold is critical (slowdown is often only 3-5 °C below it)."""
IDLE_ACTION = "end the job or release the GPU"
"""What to do about an allocation idle for long enough."""


class Status(str, Enum):
    """A GPU's overall state, ordered from OK to Critical."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 for OK, 1 for Warning, 2 for Critical."""
        return _RANKS[self]

    @property
    def label(self) -> str:
        """``OK``, ``Warning`` or ``Critical``."""
        return "OK" if self is Status.OK else self.value.capitalize()


_RANKS = {Status.OK: 0, Status.WARNING: 1, Status.CRITICAL: 2}


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason a GPU is not OK: how serious, in words, which rule (``kind``), and what to do if known."""

    status: Status
    text: str
    kind: str
    action: str = ""


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """A GPU's status (the worst of its findings) and the findings, worst first."""

    index: int
    status: Status
    findings: tuple[Finding, ...]


def worst(statuses: Iterable[Status]) -> Status:
    """The most serious of ``statuses`` (OK when there is none)."""
    return max(statuses, key=lambda status: status.rank, default=Status.OK)


def format_age(seconds: float) -> str:
    """``"just now"``, ``"40 s ago"``, ``"2 min ago"``, ``"3 h ago"``.

    Seconds are counted in tens, so a live page's text (and what it sends to browsers) changes every 10 s,
    not every sweep.
    """
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{int(seconds // 10) * 10} s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    return f"{int(seconds // 3600)} h ago"


def format_duration(seconds: float) -> str:
    """``"40 s"``, ``"47 min"``, ``"3 h 5 min"``: how long, to the minute once it is a minute or more."""
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60} min" if rest >= 60 else f"{hours} h"


def owner_text(owner: Owner) -> str:
    """``Slurm job 555 (alice)``, ``pod ml/trainer (alice)``, ``container 0123456789ab (bob)``, ``user carol``."""
    names = {"slurm": "Slurm job", "pod": "pod", "container": "container"}
    if owner.kind not in names:
        return f"user {owner.job}"
    user = f" ({owner.user})" if owner.user and owner.user != UNKNOWN else ""
    return f"{names[owner.kind]} {owner.job}{user}"


def _sample(snapshot: Snapshot | None, index: int) -> GpuSample | None:
    if snapshot is None:
        return None
    return next((sample for sample in snapshot.gpus if sample.index == index), None)


def _temperature(info: GpuInfo, sample: GpuSample) -> list[Finding]:
    temp = sample.temperature_c
    reasons = sample.clock_event_reasons
    slowdown, shutdown = info.temperature_slowdown_c, info.temperature_shutdown_c
    found: list[Finding] = []
    at = "" if temp is None else f" at {temp:.0f} °C"
    limit = "" if slowdown is None else f" (slowdown at {slowdown:.0f} °C)"
    if temp is not None and shutdown is not None and temp >= shutdown - NEAR_SHUTDOWN_C:
        found.append(Finding(Status.CRITICAL, f"{temp:.0f} °C, within {NEAR_SHUTDOWN_C:.0f} °C of shutdown at "
                             f"{shutdown:.0f} °C", "thermal", "check cooling and airflow now"))
    if is_set(reasons, THERMAL):
        which = " and ".join(name for bit, name in ((HW_THERMAL_SLOWDOWN, "HW"), (SW_THERMAL_SLOWDOWN, "SW"))
                             if is_set(reasons, bit))
        found.append(Finding(Status.WARNING, f"thermal slowdown now ({which}){at}{limit}", "thermal",
                             "check cooling and airflow"))
    elif temp is not None and slowdown is not None and temp >= slowdown - NEAR_LIMIT_C:
        where = "at or above" if temp >= slowdown else f"within {NEAR_LIMIT_C:.0f} °C of"
        found.append(Finding(Status.WARNING, f"{temp:.0f} °C, {where} the slowdown threshold ({slowdown:.0f} °C)",
                             "thermal", "check cooling and airflow"))
    memory_temp, memory_max = sample.memory_temperature_c, info.temperature_memory_max_c
    if memory_temp is not None and memory_max is not None and memory_temp >= memory_max - NEAR_LIMIT_C:
        where = "at or above" if memory_temp >= memory_max else f"within {NEAR_LIMIT_C:.0f} °C of"
        found.append(Finding(Status.WARNING, f"memory at {memory_temp:.0f} °C, {where} its maximum "
                             f"({memory_max:.0f} °C)", "thermal", "check cooling and airflow"))
    return found


def _slowdown(sample: GpuSample) -> list[Finding]:
    bits = {reason.bit for reason in throttling_reasons(sample.clock_event_reasons)}
    found: list[Finding] = []
    if HW_SLOWDOWN in bits:
        found.append(Finding(Status.WARNING, "HW slowdown active: the hardware is holding the clocks down",
                             "clocks", "check power supply and cooling"))
    if HW_POWER_BRAKE_SLOWDOWN in bits:
        found.append(Finding(Status.WARNING, "HW power brake active: an external signal is holding the clocks down",
                             "clocks", "check the chassis power budget"))
    return found


def _memory_errors(info: GpuInfo, sample: GpuSample) -> list[Finding]:
    found: list[Finding] = []
    uncorrected = sample.ecc_uncorrected_volatile
    has_uncorrected = uncorrected is not None and uncorrected > 0
    if sample.remap_pending:
        text = "row remapping pending: reset the GPU"
        if has_uncorrected:
            text = "uncorrectable ECC error, " + text
        found.append(Finding(Status.CRITICAL, text, "remap", "drain the GPU and reset it"))
    elif has_uncorrected:
        plural = "s" if uncorrected != 1 else ""
        found.append(Finding(Status.CRITICAL, f"{uncorrected} uncorrectable ECC error{plural} since the driver "
                             "loaded", "ecc", "drain the GPU and reset it"))
    if sample.remap_failure:
        found.append(Finding(Status.CRITICAL, "row remapping failed: the GPU needs service", "remap",
                             "take the GPU out of service"))
    if sample.retired_pages_pending:
        found.append(Finding(Status.WARNING, "retired pages pending: reset the GPU to retire them", "ecc",
                             "reset the GPU or reload the driver"))
    return found


def _pcie(info: GpuInfo, sample: GpuSample) -> list[Finding]:
    gen, width = sample.pcie_generation_current, sample.pcie_width_current
    max_gen, max_width = info.pcie_generation, info.pcie_width
    busy = (sample.utilization_pct is not None and sample.utilization_pct >= BUSY_UTIL_PCT
            and not is_set(sample.clock_event_reasons, GPU_IDLE))
    narrow = width is not None and max_width is not None and width < max_width
    # An idle GPU lowers its link generation to save power: only a busy one is downtrained.
    slow = busy and gen is not None and max_gen is not None and gen < max_gen
    if not (narrow or slow):
        return []
    nominal = " ".join(part for part in (
        None if max_gen is None else f"Gen{max_gen}", None if max_width is None else f"x{max_width}") if part)
    running = " ".join(part for part in (f"Gen{gen}" if slow else None, f"x{width}" if narrow else None) if part)
    return [Finding(Status.WARNING, f"PCIe {nominal} running at {running}", "pcie",
                    "reseat the GPU or its riser; check the slot's BIOS settings")]


def _nvlink(info: GpuInfo, sample: GpuSample) -> list[Finding]:
    """Links that should be up and are down.

    On NVSwitch systems every link NVML knows should be up; elsewhere (bridged PCIe cards) only the links that
    were up at start, since unbridged links read as down by design. A GPU with no link up at start (a PCIe card
    without bridges) has nothing to report.
    """
    if info.nvlink_links <= 0:
        return []
    expected = {link.link for link in sample.nvlinks} if info.nvlink_to_switch else set(info.nvlink_active_links)
    down = [str(link.link) for link in sample.nvlinks if link.active is False and link.link in expected]
    if not down:
        return []
    known = sum(1 for link in sample.nvlinks if link.active is not None and link.link in expected)
    which = f" (link{'s' if len(down) > 1 else ''} {', '.join(down)})" if len(down) <= 8 else ""
    return [Finding(Status.WARNING, f"NVLink: {len(down)} of {known} links down{which}", "nvlink",
                    "check the NVLink bridges or the NVSwitch fabric; reset the GPU")]


def _recent(index: int, events: Iterable[GpuEvent], now_s: float, window_s: float) -> list[Finding]:
    """XIDs and rising counters of the last ``window_s``, one finding per XID code or counter (the newest)."""
    newest: dict[tuple[str, object], tuple[GpuEvent, int]] = {}
    for event in events:
        if event.gpu_index != index or not (now_s - window_s <= event.time_s):
            continue
        if event.kind == "xid":
            key: tuple[str, object] = ("xid", event.code)
        else:
            subject = increment_subject(event)
            if subject is None or event.severity not in ("warning", "critical"):
                continue
            key = ("count", subject)
        seen = newest.get(key)
        count = 1 if seen is None else seen[1] + 1
        newest[key] = (event if seen is None or event.time_s >= seen[0].time_s else seen[0], count)
    found: list[Finding] = []
    for event, count in newest.values():
        age = format_age(now_s - event.time_s)
        if event.kind == "xid":
            info = xid_info(event.code)
            times = f" ({count} times)" if count > 1 else ""
            found.append(Finding(Status(info.severity), f"XID {event.code}: {info.meaning}, {age}{times}", "xid",
                                 info.action))
        else:
            times = f" ({count} increases in {int(window_s // 60)} min)" if count > 1 else ""
            found.append(Finding(Status(event.severity), f"{event.message}, {age}{times}", event.kind))
    return found


def _idle(index: int, idle: Iterable[IdleAllocation], now_s: float) -> list[Finding]:
    """The GPU's allocations idle for long enough, one warning each: who, for how long, and why."""
    found: list[Finding] = []
    for allocation in idle:
        if allocation.gpu_index != index:
            continue
        reason = allocation.reason
        if reason == MEMORY_AT_ZERO and allocation.memory_bytes:
            reason = f"{reason} ({format_bytes(allocation.memory_bytes)})"
        where = f" on {allocation.unit}" if allocation.unit.startswith("MIG-") else ""
        found.append(Finding(Status.WARNING, f"allocated but idle for {format_duration(allocation.idle_s(now_s))}: "
                             f"{owner_text(allocation.owner)}{where}, {reason}", "idle", IDLE_ACTION))
    return found


def evaluate_gpu(
    info: GpuInfo, sample: GpuSample | None, events: Iterable[GpuEvent], now_s: float, window_s: float = RECENT_S,
    *, idle: Iterable[IdleAllocation] = (),
) -> GpuHealth:
    """One GPU's health from its newest sample (``None``: no reading yet), the event log and the allocations of it
    idle for long enough (``idle``: the accountant's, at ``now_s``)."""
    findings: list[Finding] = []
    if sample is not None and sample.lost:
        findings.append(Finding(Status.CRITICAL, "GPU lost: it stopped answering (fallen off the bus?)", "lost",
                                "drain the node and reboot it; check power and PCIe seating"))
    elif sample is not None:
        if sample.error is not None:
            findings.append(Finding(Status.WARNING, f"no reading this sweep: {sample.error}", "error"))
        findings += _memory_errors(info, sample)
        findings += _temperature(info, sample)
        findings += _slowdown(sample)
        findings += _pcie(info, sample)
        findings += _nvlink(info, sample)
    findings += _recent(info.index, events, now_s, window_s)
    if sample is None or not sample.lost:
        findings += _idle(info.index, idle, now_s)
    findings.sort(key=lambda finding: -finding.status.rank)
    return GpuHealth(info.index, worst(finding.status for finding in findings), tuple(findings))


def evaluate(
    inventory: Inventory,
    snapshot: Snapshot | None,
    events: Sequence[GpuEvent],
    now_s: float,
    window_s: float = RECENT_S,
    *,
    idle: Sequence[IdleAllocation] = (),
) -> tuple[GpuHealth, ...]:
    """The health of every GPU of ``inventory``, in inventory order.

    ``idle`` are the allocations idle for long enough (``AccountingBook.idle()``); how long each has been idle is
    counted to ``now_s``."""
    recent = [event for event in events if event.time_s >= now_s - window_s]
    return tuple(evaluate_gpu(info, _sample(snapshot, info.index), recent, now_s, window_s, idle=idle)
                 for info in inventory.gpus)
