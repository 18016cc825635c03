"""The quota families of ``/metrics``: each container's granted compute and memory, and the quota findings.

Labels: the GPU's device labels when the grant names a GPU of this node (else the node's ``Hostname`` only, e.g. a
GPU-Manager grant), plus ``namespace``, ``pod``, ``container`` and ``scheme``; a finding has ``finding`` instead of
``scheme`` (see :mod:`nvdash.health.quotas`), and is 1 while it holds (absent otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.metrics_core import Metric

from nvdash.health.quotas import QuotaFinding, quota_findings
from nvdash.metrics.fields import QUOTA_FAMILIES
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.usage_records import Usage

CORE_FAMILY, MEMORY_FAMILY, FINDING_FAMILY = QUOTA_FAMILIES

Labels = dict[str, str]


def quota_families(usage: Usage | None, shares: Sequence[UnitShares], devices: Mapping[str, Labels],
                   fallback: Labels, findings: Sequence[QuotaFinding] | None = None) -> dict[str, Metric]:
    """The three families for ``usage`` (empty without one); ``devices`` maps a GPU UUID to its labels;
    ``findings``: the judged findings of ``usage`` (see :mod:`nvdash.health.quota_judge`; default: one reading's)."""
    core = Metric(CORE_FAMILY, "", "gauge")
    memory = Metric(MEMORY_FAMILY, "", "gauge")
    finding = Metric(FINDING_FAMILY, "", "gauge")
    if usage is not None:
        for grant in usage.grants:
            base = devices.get(grant.gpu_uuid, fallback) if grant.gpu_uuid else fallback
            labels = {**base, "namespace": grant.namespace, "pod": grant.pod, "container": grant.container,
                      "scheme": grant.scheme}
            if grant.core_pct is not None:
                core.add_sample(CORE_FAMILY, labels, grant.core_pct / 100.0)
            if grant.memory_bytes is not None:
                memory.add_sample(MEMORY_FAMILY, labels, float(grant.memory_bytes))
        seen: set[tuple[tuple[str, str], ...]] = set()
        for found in quota_findings(usage, shares) if findings is None else findings:
            base = devices.get(found.gpu_uuid, fallback) if found.gpu_uuid else fallback
            labels = {**base, "namespace": found.namespace, "pod": found.pod, "container": found.container,
                      "finding": found.kind}
            key = tuple(sorted(labels.items()))
            if key not in seen:
                seen.add(key)
                finding.add_sample(FINDING_FAMILY, labels, 1.0)
    return {CORE_FAMILY: core, MEMORY_FAMILY: memory, FINDING_FAMILY: finding}
