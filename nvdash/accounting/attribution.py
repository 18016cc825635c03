"""Who owns each GPU, or each MIG instance of it, at one moment: a job or pod, a user and a project.

A GPU's time is shared out so that it is counted once. The unit is the whole GPU, or with MIG each compute
instance, worth its compute slices out of the GPU's seven (``3g.20gb``: 3/7; ``1c.3g.20gb``, a compute
instance of one slice in a 3-slice GPU instance: 1/7). A unit's owners are, first, what allocated it:

1. the Slurm jobs a prolog wrote into the job-mapping directory for it (by UUID, else by the GPU's index),
2. else the Kubernetes pods the kubelet allocated it to;

each gets an equal part of the unit. A unit nothing allocated is owned by the processes on it, grouped by their
owner (Slurm job from the cgroup, pod, container, else the user), each group's part in proportion to the GPU
memory its processes hold (equal parts when NVML cannot say). A unit with neither is not owned: its time is
unallocated.

A unit the sampler measured as shared (:class:`~nvdash.sampling.share_records.UnitShares`: several owners, or given
out time-sliced, through MPS or as vGPU slices) and busy over its window is shared out by what each owner used: an
owner's part is its ``fraction`` of the unit (its SM time over the unit's utilization), so its GPU-seconds and
energy are its share, not the whole GPU's. The part no owner's samples explain is owned by no one: like a unit
nothing holds, it is unallocated (it appears in no owner's row; owners plus unallocated add up to the GPU). Allocated
owners that used nothing in the window keep a share of 0 (their idleness is still followed). A shared unit idle over
its window (utilization 0 or unknown) keeps the equal parts above, so an allocation that is held but idle still
counts as waste. Users are names (``uid 1234`` when the system cannot name the UID); the project is the pod's
namespace, else the user's primary group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from nvdash.sampling.job_mapping import JobMapping, MappedJob
from nvdash.sampling.records import GpuSample
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.sampling.usage_records import GpuProcess, GpuUsage, MigInstance, Usage
from nvdash.sampling.user_names import system_group_of, system_user

MIG_COMPUTE_SLICES = 7
"""Compute slices of a MIG-capable GPU (A100, H100): ``7g`` is the whole GPU."""
UNKNOWN = "unknown"
"""A user or project nvdash cannot tell."""

_GI_SLICES = re.compile(r"(?:^|\.)(\d+)g\.")
_CI_SLICES = re.compile(r"^(\d+)c\.")

KINDS = ("slurm", "pod", "container", "user")
"""What an owner's ``job`` names: a Slurm job ID, ``namespace/pod``, a container (12 hex digits), or, for plain
processes, their user."""


@dataclass(frozen=True, slots=True, order=True)
class Owner:
    """Who a share of a GPU's time belongs to, at each level of accounting."""

    kind: str
    """One of :data:`KINDS`."""
    job: str
    user: str
    project: str


@dataclass(frozen=True, slots=True)
class Share:
    """Part of one GPU's time owned by one owner, with the readings of the unit it is on."""

    gpu_index: int
    unit: str
    """The UUID of the GPU, or of the MIG instance."""
    fraction: float
    """The part of the physical GPU's time (and energy) this share is, 0-1."""
    owner: Owner
    memory_bytes: int | None
    """GPU memory the owner holds on the unit (the unit's whole use when it has one owner)."""
    utilization_pct: float | None
    """The unit's utilization: the GPU's, or a MIG instance's SM activity."""
    sm_active_pct: float | None
    """SM activity where GPM (or MIG) reports it."""
    allocated: bool = False
    """Whether the owner was allocated the unit (a job-mapping file, the kubelet) rather than found running on it."""
    processes: int = 0
    """The owner's processes on the unit, counting those nvdash cannot attribute (they may be the owner's)."""


class Names(Protocol):
    """The system's names for users and their primary groups."""

    def user(self, uid: int) -> str | None: ...

    def group_of(self, user: str) -> str | None: ...


class SystemNames:
    """Names from the password and group databases, each looked up once, on the caller's thread (it may wait for
    NSS: offline reports only; a server's accountant uses a :class:`~nvdash.sampling.user_names.NameResolver`)."""

    @staticmethod
    @lru_cache(maxsize=4096)
    def user(uid: int) -> str | None:
        """The name of ``uid``, or ``None`` when the system has none."""
        return system_user(uid)

    @staticmethod
    @lru_cache(maxsize=4096)
    def group_of(user: str) -> str | None:
        """The name of ``user``'s primary group, or ``None``."""
        return system_group_of(user)


@dataclass(frozen=True, slots=True)
class _Unit:
    gpu: GpuSample
    gpu_uuid: str
    uuid: str
    fraction: float
    instance: MigInstance | None


def mig_fraction(profile: str) -> float | None:
    """The part of a GPU a MIG instance's profile computes on (``3g.20gb``: 3/7); ``None`` when unparseable."""
    compute = _CI_SLICES.match(profile)
    instance = _GI_SLICES.search(profile)
    slices = compute or instance
    if slices is None:
        return None
    return min(1.0, int(slices.group(1)) / MIG_COMPUTE_SLICES)


def _units(sample: GpuSample, uuid: str, usage: GpuUsage | None) -> list[_Unit]:
    if usage is None or not usage.mig_enabled or not usage.instances:
        return [_Unit(sample, uuid, uuid, 1.0, None)]
    fractions = [mig_fraction(instance.profile) for instance in usage.instances]
    if any(fraction is None for fraction in fractions) or sum(f or 0.0 for f in fractions) > 1.0 + 1e-9:
        fractions = [1.0 / len(usage.instances)] * len(usage.instances)
    return [_Unit(sample, uuid, instance.uuid, fraction or 0.0, instance)
            for instance, fraction in zip(usage.instances, fractions, strict=True)]


def _user_of(process: GpuProcess) -> str:
    host = process.host
    return host.user if host is not None and host.user else UNKNOWN


def _project(user: str, names: Names) -> str:
    if user == UNKNOWN or user.startswith("uid "):
        return UNKNOWN
    return names.group_of(user) or UNKNOWN


def process_owner(process: GpuProcess, names: Names) -> Owner:
    """The owner of one process: its Slurm job, pod, container, or else its user."""
    user = _user_of(process)
    cgroup = process.host.cgroup if process.host is not None else None
    if cgroup is not None and cgroup.slurm_job is not None:
        return Owner("slurm", cgroup.slurm_job, user, _project(user, names))
    if process.pod_name is not None and process.pod_namespace is not None:
        return Owner("pod", f"{process.pod_namespace}/{process.pod_name}", user, process.pod_namespace)
    if cgroup is not None and cgroup.container_id is not None:
        return Owner("container", cgroup.container_id[:12], user, _project(user, names))
    return Owner("user", user, user, _project(user, names))


def _common_user(processes: Iterable[GpuProcess]) -> str:
    """The user most of ``processes`` run as (ties: the first in name order); unknown without any."""
    counts: dict[str, int] = {}
    for process in processes:
        user = _user_of(process)
        if user != UNKNOWN:
            counts[user] = counts.get(user, 0) + 1
    if not counts:
        return UNKNOWN
    return min(counts, key=lambda user: (-counts[user], user))


def _process_memory(processes: Iterable[GpuProcess]) -> int | None:
    total = 0
    for process in processes:
        if process.gpu_memory_bytes is None:
            return None
        total += process.gpu_memory_bytes
    return total


def _unit_memory(unit: _Unit) -> int | None:
    return unit.instance.memory_used_bytes if unit.instance is not None else unit.gpu.memory_used_bytes


def _unit_activity(unit: _Unit) -> tuple[float | None, float | None]:
    """The unit's utilization and SM activity."""
    if unit.instance is not None:
        return unit.instance.sm_active_pct, unit.instance.sm_active_pct
    return unit.gpu.utilization_pct, unit.gpu.gpm_sm_active_pct


def _mapped_jobs(mapping: JobMapping, unit: _Unit) -> tuple[MappedJob, ...]:
    """The jobs a mapping file names for the unit: the MIG instance's, else its GPU's (by UUID, then index)."""
    for uuid in dict.fromkeys((unit.uuid, unit.gpu_uuid)):
        if uuid in mapping.by_uuid:
            return mapping.by_uuid[uuid]
    return mapping.by_index.get(unit.gpu.index, ())


def _allocated_owners(unit: _Unit, usage: Usage | None, mapping: JobMapping | None, on_unit: list[GpuProcess],
                      names: Names) -> list[tuple[Owner, list[GpuProcess]]]:
    """The owners that allocated the unit, each with its processes on it; empty when nothing did."""
    if mapping is not None:
        owners = []
        for job in _mapped_jobs(mapping, unit):
            mine = [p for p in on_unit if p.host is not None and p.host.cgroup.slurm_job == job.job_id]
            named = names.user(job.uid) if job.uid is not None else None
            user = named or (f"uid {job.uid}" if job.uid is not None else _common_user(mine))
            owners.append((Owner("slurm", job.job_id, user, _project(user, names)), mine))
        if owners:
            return owners
    pods: dict[tuple[str, str], list[GpuProcess]] = {}
    for device in usage.pods.devices if usage is not None else ():
        if device.uuid == unit.uuid:
            pods.setdefault((device.namespace, device.pod), [])
    for process in on_unit:
        key = (process.pod_namespace or "", process.pod_name or "")
        if key in pods:
            pods[key].append(process)
    return [(Owner("pod", f"{namespace}/{pod}", _common_user(mine), namespace), mine)
            for (namespace, pod), mine in sorted(pods.items())]


SHARED_KINDS = frozenset(("shared", "mps", "vgpu"))
"""Ways of giving a unit out by which its owners divide it by use, not by allocation."""


def measured_split(unit_shares: UnitShares | None) -> bool:
    """Whether a unit's time is divided by its owners' measured use: shared (several owners, or a shared kind),
    measured, and busy over the window."""
    if unit_shares is None or not unit_shares.measured or not unit_shares.utilization_pct:
        return False
    return len(unit_shares.owners) > 1 or unit_shares.sharing in SHARED_KINDS


def _owner_of_share(owner: ShareOwner, on_unit: list[GpuProcess], names: Names) -> tuple[Owner, list[GpuProcess]]:
    """The accounting owner of a share's owner, with its processes on the unit."""
    if owner.kind == "pod":
        mine = [p for p in on_unit if (p.pod_namespace, p.pod_name) == (owner.namespace, owner.pod)]
        namespace = owner.namespace or ""
        return Owner("pod", f"{namespace}/{owner.pod or ''}", _common_user(mine), namespace), mine
    if owner.kind == "container":
        mine = [p for p in on_unit if p.host is not None and p.host.cgroup.container_id is not None
                and p.host.cgroup.container_id[:12] == owner.container]
        fallback = Owner("container", owner.container or UNKNOWN, UNKNOWN, UNKNOWN)
    else:
        mine = [p for p in on_unit if p.pid == owner.pid]
        fallback = Owner("user", UNKNOWN, UNKNOWN, UNKNOWN)
    return (process_owner(mine[0], names) if mine else fallback), mine


def _measured_parts(unit_shares: UnitShares, allocated: list[tuple[Owner, list[GpuProcess]]],
                    on_unit: list[GpuProcess], names: Names) -> list[tuple[Owner, float, int | None, int, bool]]:
    """Each owner's part of a measured shared unit: the sum of its share owners' fractions (an allocated owner that
    used nothing: 0); what no owner explains is left out (unallocated)."""
    known = {(owner.kind, owner.job): owner for owner, _ in allocated}
    parts: dict[Owner, tuple[float, int | None, int]] = {owner: (0.0, 0, len(mine)) for owner, mine in allocated}
    counted: dict[Owner, list[OwnerShare]] = {}
    for share in unit_shares.owners:
        owner, _ = _owner_of_share(share.owner, on_unit, names)
        owner = known.get((owner.kind, owner.job), owner)
        counted.setdefault(owner, []).append(share)
    for owner, shares in counted.items():
        memories = [share.memory_bytes for share in shares]
        memory = None if any(m is None for m in memories) else sum(m or 0 for m in memories)
        parts[owner] = (sum(share.fraction or 0.0 for share in shares), memory,
                        sum(share.processes for share in shares))
    allocated_owners = set(known.values())
    return [(owner, part, memory if owner in counted else None, count, owner in allocated_owners)
            for owner, (part, memory, count) in sorted(parts.items())]


def _shares_of(unit: _Unit, usage: Usage | None, mapping: JobMapping | None, names: Names,
               unit_shares: UnitShares | None = None) -> list[Share]:
    processes = usage.processes if usage is not None else ()
    on_unit = [p for p in processes if p.gpu_index == unit.gpu.index and (
        p.mig_uuid == unit.uuid if unit.instance is not None else True)]
    utilization, sm_active = _unit_activity(unit)
    allocated = _allocated_owners(unit, usage, mapping, on_unit, names)
    if unit_shares is not None and measured_split(unit_shares):
        return [Share(unit.gpu.index, unit.uuid, unit.fraction * part, owner, memory, utilization, sm_active,
                      allocated=is_allocated, processes=count)
                for owner, part, memory, count, is_allocated in _measured_parts(unit_shares, allocated,
                                                                                on_unit, names)]
    parts: list[tuple[Owner, float, int | None, int]] = []
    if allocated:
        part = 1.0 / len(allocated)
        claimed = {id(process) for _, mine in allocated for process in mine}
        unknown = sum(1 for process in on_unit if id(process) not in claimed)
        for owner, mine in allocated:
            memory = _unit_memory(unit) if len(allocated) == 1 else _process_memory(mine) if mine else None
            parts.append((owner, part, memory, len(mine) + unknown))
    elif on_unit:
        groups: dict[Owner, list[GpuProcess]] = {}
        for process in on_unit:
            groups.setdefault(process_owner(process, names), []).append(process)
        memories = {owner: _process_memory(mine) for owner, mine in groups.items()}
        known = [memory for memory in memories.values() if memory is not None]
        total = sum(known)
        by_memory = len(known) == len(memories) and total > 0
        for owner in sorted(groups):
            memory = memories[owner]
            part = (memory or 0) / total if by_memory else 1.0 / len(groups)
            parts.append((owner, part, _unit_memory(unit) if len(groups) == 1 else memory, len(groups[owner])))
    return [Share(unit.gpu.index, unit.uuid, unit.fraction * part, owner, memory, utilization, sm_active,
                  allocated=bool(allocated), processes=count)
            for owner, part, memory, count in parts]


def attribute(gpus: Sequence[GpuSample], uuids: dict[int, str], usage: Usage | None,
              mapping: JobMapping | None = None, names: Names | None = None, *,
              unit_shares: Sequence[UnitShares] = ()) -> list[Share]:
    """The owned shares of each GPU at one moment; a GPU (or its part) no one owns has no share.

    ``uuids`` maps GPU index to UUID (the inventory's); a lost GPU has no share. ``unit_shares`` (the snapshot's
    measured shares; none: allocation alone decides) divide a shared, busy unit by its owners' use.
    """
    resolved: Names = names if names is not None else SystemNames()
    measured = {shares.unit: shares for shares in unit_shares}
    by_index = {gpu.index: gpu for gpu in usage.gpus} if usage is not None else {}
    shares: list[Share] = []
    for sample in gpus:
        uuid = uuids.get(sample.index)
        if sample.lost or uuid is None:
            continue
        for unit in _units(sample, uuid, by_index.get(sample.index)):
            shares.extend(_shares_of(unit, usage, mapping, resolved, measured.get(unit.uuid)))
    return shares
