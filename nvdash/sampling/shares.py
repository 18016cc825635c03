"""How each GPU (or MIG instance) divides among the pods, containers and processes on it: the :class:`UnitShares`
of every snapshot.

SM shares come from the latest process reading (:class:`~nvdash.sampling.usage_records.Usage`): an owner's
``sm_pct`` is the sum of its processes' time-weighted per-process utilization. The unit's utilization is the mean
of the GPU's ``utilization_pct`` over the snapshots since the previous process reading, so both cover the same
window; where the owners' shares add up to more (MPS clients run at the same time, sampling granularity) they are
scaled down in proportion until they add up to the unit's utilization. What no owner explains is unattributed,
never spread over the owners. An owner's ``fraction`` is ``sm_pct / utilization_pct``; power, GPM SM activity and
energy follow it. Energy is apportioned at every snapshot: the GPU's energy-counter delta (a reset or a missing
reading restarts the count, the interval without a valid delta is apportioned to nobody) times each owner's
fraction, and the rest to the unit's unattributed energy, so that owners plus unattributed add up to the counted
deltas exactly.

A MIG instance's utilization is its own SM activity (``MigInstance.sm_active_pct``, from GPM where available).
NVML has no per-process utilization under MIG: a single owner in an instance gets all of it, several owners get
memory only (their SM time is unattributed and the unit is not ``measured``). Its power and energy are its compute
slices' part of the GPU's (``3g.20gb``: 3/7).

An owner that is gone (no process of it in the latest reading) stays listed with no SM share and its energy frozen
for :data:`PRUNE_AFTER_S`, so that a scrape sees its final count, then is forgotten (a counter that comes back
starts over from 0, as a Prometheus counter may). Lost GPUs have no shares.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nvdash.sampling.records import GpuSample
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.sampling.usage_records import GpuProcess, GpuUsage, MigInstance, PodDevice, Usage

PRUNE_AFTER_S = 600.0
"""How long an owner stays listed (with its final energy) after its last process left the unit."""
MIG_SLICES = 7
"""Compute slices of a whole MIG-capable GPU."""
_SHARING_PREFERENCE = ("mps", "shared", "vgpu", "mig", "whole")
"""When pods hold one unit in different ways, the kind named first wins."""
_SLICES = re.compile(r"(?:\d+c\.)?(\d+)g\.")


def owner_of(process: GpuProcess) -> ShareOwner:
    """The pod's container the process is attributed to; else its container (id, 12 hex digits); else its PID."""
    if process.pod_namespace is not None and process.pod_name is not None:
        return ShareOwner("pod", process.pod_namespace, process.pod_name, process.container_name)
    container_id = process.host.cgroup.container_id if process.host is not None else None
    if container_id:
        return ShareOwner("container", container=container_id[:12])
    return ShareOwner("process", pid=process.pid)


def scale_to(utilization_pct: float | None, sm_pct: Mapping[ShareOwner, float]) -> dict[ShareOwner, float]:
    """The owners' SM shares, scaled down in proportion when they add up to more than ``utilization_pct``."""
    total = sum(sm_pct.values())
    if utilization_pct is None or total <= utilization_pct or total <= 0:
        return dict(sm_pct)
    factor = max(utilization_pct, 0.0) / total
    return {owner: value * factor for owner, value in sm_pct.items()}


def sharing_of(unit: str, devices: Iterable[PodDevice], unheld: str = "whole") -> str:
    """How the pods hold ``unit`` (a GPU or MIG UUID): the kind of their allocations, ``unheld`` when none does
    (``whole`` for a GPU, ``mig`` for a MIG instance)."""
    kinds = {device.sharing for device in devices if device.uuid == unit}
    for kind in _SHARING_PREFERENCE:
        if kind in kinds:
            return kind
    return min(kinds) if kinds else unheld


def mig_part(profile: str) -> float | None:
    """The part of the GPU a MIG profile's compute slices are (``3g.20gb``: 3/7); ``None`` when the name says not."""
    found = _SLICES.match(profile)
    if found is None:
        return None
    return min(int(found.group(1)), MIG_SLICES) / MIG_SLICES


def _sum_known(values: Iterable[float | int | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


@dataclass(frozen=True, slots=True)
class OwnerSplit:
    """One owner's part of a unit over a window (before power and energy)."""

    sm_pct: float | None
    fraction: float | None
    memory_bytes: int | None
    processes: int


@dataclass(frozen=True, slots=True)
class UnitSplit:
    """How a unit divides over one process window; power and energy are applied per snapshot."""

    gpu_index: int
    gpu_uuid: str
    unit: str
    sharing: str
    window_s: float
    utilization_pct: float | None
    owners: Mapping[ShareOwner, OwnerSplit]
    unattributed_sm_pct: float | None
    measured: bool
    part: float | None
    """The unit's part of the GPU's power and energy: 1 for a whole GPU, the compute slices for a MIG instance."""
    instance: MigInstance | None = None


def _fraction(sm_pct: float | None, utilization_pct: float | None) -> float | None:
    if sm_pct is None or utilization_pct is None:
        return None
    if utilization_pct <= 0:
        return 0.0
    return min(1.0, sm_pct / utilization_pct)


def split_unit(
    gpu: GpuUsage,
    unit: str,
    processes: list[GpuProcess],
    utilization_pct: float | None,
    *,
    sharing: str,
    window_s: float,
    measured: bool,
    instance: MigInstance | None = None,
) -> UnitSplit:
    """The owners' SM shares of one unit from its processes' per-process utilization (see the module docstring).

    ``measured`` says whether the processes' ``sm_pct`` are per-process samples (a whole GPU that reports them);
    a MIG instance with one owner gives it the instance's utilization.
    """
    grouped: dict[ShareOwner, list[GpuProcess]] = {}
    for process in processes:
        grouped.setdefault(owner_of(process), []).append(process)
    sm: dict[ShareOwner, float] = {}
    if instance is not None:
        measured = len(grouped) <= 1 and utilization_pct is not None
        if measured and grouped:
            sm = {next(iter(grouped)): float(utilization_pct or 0.0)}
    elif measured:
        sm = {owner: sum(p.sm_pct or 0.0 for p in owned) for owner, owned in grouped.items()}
    sm = scale_to(utilization_pct, sm)
    owners = {
        owner: OwnerSplit(
            sm_pct=sm.get(owner) if measured else None,
            fraction=_fraction(sm.get(owner), utilization_pct) if measured else None,
            memory_bytes=None if (memory := _sum_known(p.gpu_memory_bytes for p in owned)) is None else int(memory),
            processes=len(owned),
        )
        for owner, owned in grouped.items()
    }
    unattributed = None if utilization_pct is None else max(0.0, utilization_pct - sum(sm.values()))
    part = 1.0 if instance is None else mig_part(instance.profile)
    return UnitSplit(gpu.index, gpu.uuid, unit, sharing, window_s, utilization_pct, owners, unattributed,
                     measured, part, instance)


def split_usage(
    usage: Usage, utilization_pct: Mapping[int, float | None], window_s: float, lost: frozenset[int] = frozenset()
) -> list[UnitSplit]:
    """Every unit of every GPU the reading lists (not the lost ones): a whole GPU, or each MIG instance."""
    by_unit: dict[str, list[GpuProcess]] = {}
    for process in usage.processes:
        by_unit.setdefault(process.mig_uuid or process.gpu_uuid, []).append(process)
    splits: list[UnitSplit] = []
    for gpu in usage.gpus:
        if gpu.index in lost:
            continue
        if gpu.mig_enabled:
            for instance in gpu.instances:
                splits.append(split_unit(
                    gpu, instance.uuid, by_unit.get(instance.uuid, []), instance.sm_active_pct,
                    sharing=sharing_of(instance.uuid, usage.pods.devices, "mig"), window_s=window_s, measured=False,
                    instance=instance,
                ))
            continue
        splits.append(split_unit(
            gpu, gpu.uuid, by_unit.get(gpu.uuid, []), utilization_pct.get(gpu.index),
            sharing=sharing_of(gpu.uuid, usage.pods.devices), window_s=window_s, measured=gpu.process_utilization,
        ))
    return splits


@dataclass(slots=True)
class _Energy:
    """A unit's cumulative energy, per owner and unattributed, and when each owner was last seen."""

    owners: dict[ShareOwner, float] = field(default_factory=dict)
    seen_s: dict[ShareOwner, float] = field(default_factory=dict)
    unattributed_j: float = 0.0


class ShareTracker:
    """Turns each snapshot's GPU samples and the latest process reading into :class:`UnitShares`.

    Stateful: it averages the GPUs' utilization between process readings, keeps the split of the latest reading,
    and counts energy per owner from snapshot to snapshot. Call :meth:`update` once per snapshot, in order.
    """

    def __init__(self, prune_after_s: float = PRUNE_AFTER_S) -> None:
        self._prune_after_s = prune_after_s
        self._usage: Usage | None = None
        self._splits: list[UnitSplit] = []
        self._util_sums: dict[int, list[float]] = {}
        self._window_start_s: float | None = None
        self._energy_mj: dict[int, int] = {}
        self._energy: dict[str, _Energy] = {}

    def update(self, time_s: float, gpus: tuple[GpuSample, ...], usage: Usage | None) -> tuple[UnitShares, ...]:
        """The shares as of this snapshot; empty before the first process reading."""
        for sample in gpus:
            if sample.utilization_pct is not None and not sample.lost:
                sums = self._util_sums.setdefault(sample.index, [0.0, 0.0])
                sums[0] += sample.utilization_pct
                sums[1] += 1
        if self._window_start_s is None:
            self._window_start_s = time_s
        lost = frozenset(sample.index for sample in gpus if sample.lost)
        if usage is not None and usage is not self._usage:
            self._new_reading(time_s, usage, lost)
        if self._usage is None:
            return ()
        deltas = self._energy_deltas(gpus)
        samples = {sample.index: sample for sample in gpus}
        shares = [
            self._unit_shares(split, samples.get(split.gpu_index), deltas.get(split.gpu_index), time_s)
            for split in self._splits
            if split.gpu_index not in lost
        ]
        return tuple(shares)

    def _new_reading(self, time_s: float, usage: Usage, lost: frozenset[int]) -> None:
        previous = self._usage
        start = previous.time_s if previous is not None else self._window_start_s
        window_s = max(0.0, usage.time_s - start) if start is not None else 0.0
        utilization = {index: sums[0] / sums[1] for index, sums in self._util_sums.items() if sums[1]}
        self._splits = split_usage(usage, utilization, window_s, lost)
        self._util_sums = {}
        self._usage = usage
        self._window_start_s = time_s

    def _energy_deltas(self, gpus: tuple[GpuSample, ...]) -> dict[int, float]:
        """Joules per GPU since the previous snapshot; a GPU without a valid delta is left out (its count restarts)."""
        deltas: dict[int, float] = {}
        for sample in gpus:
            now = None if sample.lost else sample.energy_mj
            before = self._energy_mj.pop(sample.index, None)
            if now is None:
                continue
            self._energy_mj[sample.index] = now
            if before is not None and now >= before:
                deltas[sample.index] = (now - before) / 1000.0
        return deltas

    def _unit_shares(
        self, split: UnitSplit, sample: GpuSample | None, delta_j: float | None, time_s: float
    ) -> UnitShares:
        energy = self._energy.setdefault(split.unit, _Energy())
        part = split.part
        unit_delta = None if delta_j is None or part is None else delta_j * part
        unit_power = None if sample is None or sample.power_w is None or part is None else sample.power_w * part
        if split.instance is not None:
            gpm, used = split.instance.sm_active_pct, split.instance.memory_used_bytes
        else:
            gpm = None if sample is None else sample.gpm_sm_active_pct
            used = None if sample is None else sample.memory_used_bytes
        owners: list[OwnerShare] = []
        attributed_j = 0.0
        for owner, part_of in split.owners.items():
            fraction = part_of.fraction
            if unit_delta is not None and fraction:
                energy.owners[owner] = energy.owners.get(owner, 0.0) + unit_delta * fraction
                attributed_j += unit_delta * fraction
            energy.seen_s[owner] = time_s
            owners.append(OwnerShare(
                owner=owner,
                sm_pct=part_of.sm_pct,
                fraction=fraction,
                memory_bytes=part_of.memory_bytes,
                power_w=None if unit_power is None or fraction is None else unit_power * fraction,
                energy_j=energy.owners.get(owner, 0.0),
                gpm_sm_active_pct=None if gpm is None or fraction is None else gpm * fraction,
                processes=part_of.processes,
            ))
        if unit_delta is not None:
            energy.unattributed_j += max(0.0, unit_delta - attributed_j)
        owners.extend(self._gone(energy, split, time_s))
        held = _sum_known(o.memory_bytes for o in owners)
        attributed_power = sum(o.power_w or 0.0 for o in owners)
        return UnitShares(
            gpu_index=split.gpu_index,
            gpu_uuid=split.gpu_uuid,
            unit=split.unit,
            sharing=split.sharing,
            window_s=split.window_s,
            utilization_pct=split.utilization_pct,
            owners=tuple(sorted(owners, key=lambda o: o.owner.sort_key)),
            unattributed_sm_pct=split.unattributed_sm_pct,
            unattributed_memory_bytes=None if used is None else max(0, used - int(held or 0)),
            unattributed_power_w=None if unit_power is None else max(0.0, unit_power - attributed_power),
            unattributed_energy_j=energy.unattributed_j,
            measured=split.measured,
        )

    def _gone(self, energy: _Energy, split: UnitSplit, time_s: float) -> list[OwnerShare]:
        """Owners no longer on the unit, listed with their final energy until they are pruned."""
        gone: list[OwnerShare] = []
        for owner, seen in list(energy.seen_s.items()):
            if owner in split.owners:
                continue
            if time_s - seen > self._prune_after_s:
                del energy.seen_s[owner]
                energy.owners.pop(owner, None)
                continue
            gone.append(OwnerShare(owner, 0.0 if split.measured else None, 0.0, 0, 0.0, energy.owners.get(owner, 0.0),
                                   None, 0))
        return gone
