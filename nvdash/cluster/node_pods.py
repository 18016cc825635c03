"""This node's pods as the cluster pages' rows, for a single node without Prometheus: the kubelet's allocations and
the pods' shares in the newest snapshot, their quotas and quota findings, and the pods the history recorded over a
range that hold nothing now.

The rows carry what :func:`nvdash.cluster.model.build_pods` reads back from Prometheus, from the same records that
``/metrics`` exports them from, so a pod reads the same on a single node as across the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from nvdash.cluster.model import UNALLOCATED, ClusterPod
from nvdash.health.quotas import FINDING_KINDS, QuotaFinding, quota_findings
from nvdash.history.share_table import PodUnit
from nvdash.sampling.records import Snapshot
from nvdash.sampling.share_records import OwnerShare, UnitShares
from nvdash.sampling.usage_records import Grant, Usage

Where = tuple[int, str, str, float | None]
"""A unit's GPU index, MIG profile, MIG instance id and used memory."""
Who = tuple[str, str, str, str]
"""(namespace, pod, container, unit UUID)."""


def _units(snapshot: Snapshot) -> dict[str, Where]:
    """Every GPU and MIG instance of the snapshot by UUID."""
    found: dict[str, Where] = {}
    usage = snapshot.usage
    memory = {gpu.index: gpu.memory_used_bytes for gpu in snapshot.gpus}
    for gpu in usage.gpus if usage is not None else ():
        found[gpu.uuid] = (gpu.index, "", "", memory.get(gpu.index))
        for instance in gpu.instances:
            used = None if instance.memory_used_bytes is None else float(instance.memory_used_bytes)
            found[instance.uuid] = (gpu.index, instance.profile, str(instance.gpu_instance_id), used)
    return found


def _owner_shares(shares: Iterable[UnitShares]) -> dict[Who, tuple[UnitShares, OwnerShare]]:
    return {(share.owner.namespace or "", share.owner.pod or "", share.owner.container or "", unit.unit): (unit, share)
            for unit in shares for share in unit.owners if share.owner.kind == "pod" and share.owner.pod}


def _row(hostname: str, who: Who, where: Where | None, sharing: str, *, resource: str = "",
         unit: UnitShares | None = None, share: OwnerShare | None = None, utilization: float | None = None,
         idle: bool = False) -> ClusterPod:
    gpu, profile, instance, memory = where if where is not None else (-1, "", "", None)
    if unit is not None:
        gpu = unit.gpu_index
        utilization = unit.utilization_pct
    return ClusterPod(
        hostname=hostname, namespace=who[0], pod=who[1], container=who[2], gpu=gpu, uuid=who[3], resource=resource,
        sharing=sharing, mig_profile=profile, mig_instance=instance, utilization_pct=utilization,
        memory_used_bytes=memory, idle=idle,
        sm_share_pct=None if share is None else share.sm_pct,
        pod_memory_bytes=None if share is None or share.memory_bytes is None else float(share.memory_bytes))


def _about(row: ClusterPod, about: Grant | QuotaFinding, parents: dict[str, str]) -> bool:
    """Whether a grant or finding (naming no GPU: about every GPU of its pod) is about ``row``."""
    return ((row.namespace, row.pod) == (about.namespace, about.pod) and about.container in ("", row.container)
            and (about.gpu_uuid is None or about.gpu_uuid in (row.uuid, parents.get(row.uuid))))


def _with_quotas(rows: list[ClusterPod], usage: Usage, findings: Sequence[QuotaFinding], hostname: str,
                 units: dict[str, Where]) -> list[ClusterPod]:
    """``rows`` with the grants' quotas and the findings (an unallocated use not on a row: a row of its own)."""
    parents = {instance.uuid: gpu.uuid for gpu in usage.gpus for instance in gpu.instances}
    for grant in usage.grants:
        for i, row in enumerate(rows):
            if _about(row, grant, parents):
                rows[i] = replace(row, core_quota_pct=grant.core_pct if grant.core_pct is not None else
                                  row.core_quota_pct,
                                  memory_quota_bytes=float(grant.memory_bytes) if grant.memory_bytes is not None
                                  else row.memory_quota_bytes)
    for finding in findings:
        hits = [i for i, row in enumerate(rows)
                if _about(row, finding, parents)]
        if not hits and finding.kind == "unallocated_use" and finding.gpu_uuid is not None and finding.pod:
            who = (finding.namespace, finding.pod, finding.container, finding.gpu_uuid)
            rows.append(_row(hostname, who, units.get(finding.gpu_uuid), UNALLOCATED))
            hits = [len(rows) - 1]
        for i in hits:
            kinds = (*rows[i].findings, finding.kind)
            rows[i] = replace(rows[i], findings=tuple(kind for kind in FINDING_KINDS if kind in kinds))
    return rows


def node_pods(snapshot: Snapshot | None, hostname: str, recorded: Iterable[PodUnit] = ()) -> tuple[ClusterPod, ...]:
    """One row per pod container and unit: the kubelet's allocations (with the pod's share where it has one), pods
    holding a share of a unit the kubelet did not list, a row per pod's use of a GPU nobody was allocated, then
    ``recorded`` ones (from the history) that hold nothing now, without readings; sorted as
    :func:`~nvdash.cluster.model.build_pods` sorts."""
    rows: list[ClusterPod] = []
    listed: set[Who] = set()
    units: dict[str, Where] = {}
    usage = snapshot.usage if snapshot is not None else None
    if snapshot is not None and usage is not None:
        units = _units(snapshot)
        utilization = {gpu.index: gpu.utilization_pct for gpu in snapshot.gpus}
        owned = _owner_shares(snapshot.shares)
        idle = set(usage.idle_allocations())
        for device in usage.pods.devices:
            who = (device.namespace, device.pod, device.container, device.uuid)
            if who in listed:
                continue
            listed.add(who)
            unit, share = owned.get(who, (None, None))
            where = units.get(device.uuid)
            rows.append(_row(hostname, who, where, device.sharing, resource=device.resource_name, unit=unit,
                             share=share, utilization=None if where is None else utilization.get(where[0]),
                             idle=device in idle))
        for who, (unit, share) in owned.items():
            if who not in listed:
                listed.add(who)
                rows.append(_row(hostname, who, units.get(who[3]), unit.sharing, unit=unit, share=share))
        rows = _with_quotas(rows, usage, quota_findings(usage, snapshot.shares), hostname, units)
        listed |= {(row.namespace, row.pod, row.container, row.uuid) for row in rows}
    for seen in recorded:
        who = (seen.namespace, seen.pod, seen.container, seen.unit)
        if who not in listed:
            listed.add(who)
            _gpu, profile, instance, _memory = units.get(seen.unit, (seen.gpu, "", "", None))
            rows.append(_row(hostname, who, (seen.gpu, profile, instance, None), seen.sharing))
    return tuple(sorted(rows, key=lambda row: (row.namespace, row.pod, row.container, row.hostname, row.gpu,
                                               row.mig_instance)))
