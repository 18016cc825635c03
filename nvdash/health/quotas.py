"""Quota against use: which pods use more than their vGPU or MPS quota, hold one they never use, or use a GPU that
nobody was allocated. Pure: everything comes from a :class:`~nvdash.sampling.usage_records.Usage` (and the
snapshot's shares when the sampler computed them).

A grant's use is that of its pod's processes on the grant's GPU, leaving out processes the kubelet says belong to
another container of the pod. SM use is the pod's time-weighted share of the GPU (``Snapshot.shares``) when present,
else the sum of its processes' ``sm_pct``; memory is the sum of its processes' GPU memory. A GPU-Manager grant names
no GPU: its use is its pod's on every GPU, and a finding names the GPU when the pod runs on one only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nvdash.sampling.records import Snapshot
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.usage_records import GpuProcess, Grant, Usage

FINDING_KINDS = ("memory_over_quota", "compute_over_quota", "quota_unused", "unallocated_use")
COMPUTE_TOLERANCE_PCT = 5.0
"""SM use up to this many points above the core quota is not flagged: limiters enforce a quota over a time slice,
and per-process utilization is sampled."""
SCHEME_NAMES = {"gpu-manager": "GPU-Manager", "hami": "HAMi", "mps": "MPS"}


@dataclass(frozen=True, slots=True)
class QuotaFinding:
    """One container's quota against its use on one GPU (or a GPU used without an allocation)."""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str | None
    kind: str
    """One of :data:`FINDING_KINDS`."""
    used: float | None
    """Bytes for memory, percent of the GPU's SM time for compute, 0 for an unused quota, bytes for unallocated use."""
    quota: float | None
    """The grant's bytes or core percent; ``None`` for unallocated use."""
    text: str
    scheme: str = ""


@dataclass(frozen=True, slots=True)
class GrantUse:
    """What a grant's pod (container) uses: memory held, SM % of the GPU, the GPUs it runs on, its processes."""

    memory_bytes: int | None
    sm_pct: float | None
    gpus: frozenset[str]
    processes: int


def quota_findings(usage: Usage, shares: Sequence[UnitShares] = ()) -> tuple[QuotaFinding, ...]:
    """Every finding now, in grant order, then unallocated use by GPU index."""
    index = {gpu.uuid: gpu.index for gpu in usage.gpus}
    unreadable = {gpu.uuid for gpu in usage.gpus if not gpu.processes_readable}
    unattributed = {p.gpu_uuid for p in usage.processes if p.pod_name is None}
    found: list[QuotaFinding] = []
    for grant in usage.grants:
        use = grant_use(usage.processes, grant, shares)
        gpu = grant.gpu_uuid or (next(iter(use.gpus)) if len(use.gpus) == 1 else None)
        where = _gpu_text(gpu, index)
        who = "/".join(part for part in (grant.namespace, grant.pod, grant.container) if part)
        scheme = SCHEME_NAMES.get(grant.scheme, grant.scheme)

        def finding(kind: str, used: float | None, quota: float | None, text: str, *,
                    grant: Grant = grant, gpu: str | None = gpu) -> QuotaFinding:
            return QuotaFinding(grant.namespace, grant.pod, grant.container, gpu, kind, used, quota, text,
                                grant.scheme)

        if use.processes == 0:
            checked = {grant.gpu_uuid} if grant.gpu_uuid else set(index)
            if not checked & (unreadable | unattributed):
                quota = grant.memory_bytes if grant.memory_bytes is not None else grant.core_pct
                found.append(finding("quota_unused", 0.0, None if quota is None else float(quota),
                                     f"{who} holds a {scheme} quota ({_quota_text(grant)}){_on(where)} but runs "
                                     "no process on it"))
            continue
        if grant.memory_bytes is not None and use.memory_bytes is not None and use.memory_bytes > grant.memory_bytes:
            found.append(finding("memory_over_quota", float(use.memory_bytes), float(grant.memory_bytes),
                                 f"{who} holds {_bytes(use.memory_bytes)} of GPU memory{_on(where)}, over its "
                                 f"{scheme} quota of {_bytes(grant.memory_bytes)}"))
        if (grant.core_pct is not None and grant.core_pct < 100 and use.sm_pct is not None and len(use.gpus) == 1
                and use.sm_pct > grant.core_pct + COMPUTE_TOLERANCE_PCT):
            found.append(finding("compute_over_quota", use.sm_pct, grant.core_pct,
                                 f"{who} keeps {use.sm_pct:.0f} % of{_of(where)} SM time busy, above its {scheme} "
                                 f"core quota of {grant.core_pct:g} % (+{COMPUTE_TOLERANCE_PCT:g} tolerated)"))
    found.extend(_unallocated(usage, index))
    return tuple(found)


def snapshot_findings(snapshot: Snapshot | None) -> tuple[QuotaFinding, ...]:
    """The findings of a snapshot's usage reading (none before the first)."""
    if snapshot is None or snapshot.usage is None:
        return ()
    return quota_findings(snapshot.usage, snapshot.shares)


def grant_use(processes: Iterable[GpuProcess], grant: Grant, shares: Sequence[UnitShares]) -> GrantUse:
    """The use a grant is held against (see the module docstring)."""
    mine = [p for p in processes
            if (p.pod_namespace, p.pod_name) == (grant.namespace, grant.pod)
            and (grant.gpu_uuid is None or p.gpu_uuid == grant.gpu_uuid)
            and (not grant.container or p.container_name in (None, grant.container))]
    memory = [p.gpu_memory_bytes for p in mine if p.gpu_memory_bytes is not None]
    gpus = frozenset(p.gpu_uuid for p in mine)
    sm = _shared_sm(shares, grant, gpus)
    if sm is None:
        sms = [p.sm_pct for p in mine if p.sm_pct is not None]
        sm = min(100.0, sum(sms)) if sms else None
    return GrantUse(sum(memory) if memory else None, sm, gpus, len(mine))


def _shared_sm(shares: Sequence[UnitShares], grant: Grant, gpus: frozenset[str]) -> float | None:
    """The pod's (container's) SM % of its GPU from the snapshot's shares; ``None`` when they do not say."""
    if len(gpus) != 1:
        return None
    gpu = next(iter(gpus))
    total: float | None = None
    for unit in shares:
        if unit.unit != gpu:
            continue
        for owner in unit.owners:
            who = owner.owner
            if (who.kind == "pod" and (who.namespace, who.pod) == (grant.namespace, grant.pod)
                    and (not grant.container or who.container in (None, grant.container))
                    and owner.sm_pct is not None):
                total = (total or 0.0) + owner.sm_pct
    return total


def _unallocated(usage: Usage, index: dict[str, int]) -> list[QuotaFinding]:
    """Processes on a GPU that no pod device names, while the kubelet answered and pods hold other GPUs.

    A process of a pod holding a GPU-Manager grant (which names no GPU) is not counted: its GPU may be the grant's;
    nor, while such grants exist, is a process nvdash could not attribute to a pod (it may be one of theirs).
    """
    pods = usage.pods
    if not pods.available or not pods.devices:
        return []
    parents = {instance.uuid: gpu.uuid for gpu in usage.gpus for instance in gpu.instances}
    allocated = {parents.get(device.uuid, device.uuid) for device in pods.devices}
    allocated |= {grant.gpu_uuid for grant in usage.grants if grant.gpu_uuid}
    floating = {(g.namespace, g.pod) for g in usage.grants if g.gpu_uuid is None}
    groups: dict[tuple[str, str, str, str], list[GpuProcess]] = {}
    for process in usage.processes:
        owner = (process.pod_namespace or "", process.pod_name or "")
        if process.gpu_uuid in allocated or owner in floating or (floating and process.pod_name is None):
            continue
        key = (process.gpu_uuid, *owner, process.container_name or "")
        groups.setdefault(key, []).append(process)
    found: list[QuotaFinding] = []
    for (gpu, namespace, pod, container), processes in sorted(groups.items(), key=lambda i: index.get(i[0][0], -1)):
        memory = sum(p.gpu_memory_bytes or 0 for p in processes)
        who = "/".join(part for part in (namespace, pod, container) if part) or "a process outside any pod"
        count = f"{len(processes)} process{'es' if len(processes) != 1 else ''}"
        found.append(QuotaFinding(namespace, pod, container, gpu, "unallocated_use", float(memory), None,
                                  f"{_gpu_text(gpu, index)} runs {count} of {who} ({_bytes(memory)}), but the kubelet "
                                  "allocated it to no pod"))
    return found


def _gpu_text(uuid: str | None, index: dict[str, int]) -> str:
    if uuid is None:
        return ""
    return f"GPU {index[uuid]}" if uuid in index else uuid


def _on(where: str) -> str:
    return f" on {where}" if where else ""


def _of(where: str) -> str:
    return f" {where}'s" if where else " its GPU's"


def _quota_text(grant: Grant) -> str:
    parts = []
    if grant.core_pct is not None:
        parts.append(f"{grant.core_pct:g} % of a GPU")
    if grant.memory_bytes is not None:
        parts.append(_bytes(grant.memory_bytes))
    return ", ".join(parts) or "no amount"


def _bytes(value: int) -> str:
    """``3.0 GiB``, ``512 MiB``."""
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return f"{value / (1 << 20):.0f} MiB"
