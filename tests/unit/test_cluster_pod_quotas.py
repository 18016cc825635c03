"""The pods' quotas and quota findings read back from Prometheus into the cluster model: each container's core and
memory quota, the findings holding now matched to its allocation, and a pod using a GPU nobody was allocated."""

from __future__ import annotations

from nvdash.cluster.model import POD_VALUES_QUERY, UNALLOCATED, build_pods
from tests.unit.test_cluster import MIB, labels

VGPU = {"namespace": "tenants", "pod": "vjob", "container": "main"}
MPS = {"namespace": "serving", "pod": "infer", "container": "server"}


def _allocated() -> list[dict[str, str]]:
    return [labels("node-2", 2, "nvdash_pod_gpu_allocated", resource="nvidia.com/vgpu", sharing="vgpu", **VGPU),
            labels("node-2", 0, "nvdash_pod_gpu_allocated", resource="nvidia.com/gpu", sharing="mps", **MPS),
            labels("node-2", 1, "nvdash_pod_gpu_allocated", resource="nvidia.com/gpu", sharing="mps", **MPS)]


def test_a_containers_quota_and_its_findings_land_on_its_allocation() -> None:
    for family in ("nvdash_pod_gpu_core_quota_ratio", "nvdash_pod_gpu_memory_quota_bytes",
                   "nvdash_pod_gpu_quota_finding"):
        assert family in POD_VALUES_QUERY
    values = [
        (labels("node-2", 2, "nvdash_pod_gpu_core_quota_ratio", scheme="hami", **VGPU), 0.3),
        (labels("node-2", 2, "nvdash_pod_gpu_memory_quota_bytes", scheme="hami", **VGPU), 4096.0 * MIB),
        (labels("node-2", 2, "nvdash_pod_gpu_quota_finding", finding="memory_over_quota", **VGPU), 1.0),
        (labels("node-2", 2, "nvdash_pod_gpu_quota_finding", finding="compute_over_quota", **VGPU), 1.0),
        # A finding this version does not know, and a stale 0: neither is shown.
        (labels("node-2", 2, "nvdash_pod_gpu_quota_finding", finding="from_the_future", **VGPU), 1.0),
        (labels("node-2", 0, "nvdash_pod_gpu_quota_finding", finding="quota_unused", **MPS), 0.0),
        # An MPS quota on GPU 1 only.
        (labels("node-2", 1, "nvdash_pod_gpu_core_quota_ratio", scheme="mps", **MPS), 0.25),
        (labels("node-2", 1, "nvdash_pod_gpu_quota_finding", finding="quota_unused", **MPS), 1.0),
    ]
    rows = {(row.pod, row.gpu): row for row in build_pods(_allocated(), values, [])}
    vjob = rows[("vjob", 2)]
    assert (vjob.core_quota_pct, vjob.memory_quota_bytes) == (30.0, 4096 * MIB)
    assert vjob.findings == ("memory_over_quota", "compute_over_quota")  # FINDING_KINDS' order
    assert (rows[("infer", 0)].core_quota_pct, rows[("infer", 0)].findings) == (None, ())
    assert (rows[("infer", 1)].core_quota_pct, rows[("infer", 1)].findings) == (25.0, ("quota_unused",))


def test_a_quota_naming_no_gpu_holds_on_every_gpu_of_its_container() -> None:
    # A GPU-Manager grant names no GPU: its series carry the node's Hostname only.
    host_only = {"Hostname": "node-2", "__name__": "nvdash_pod_gpu_memory_quota_bytes", "scheme": "gpu-manager",
                 **MPS}
    rows = build_pods(_allocated(), [(host_only, 2048.0 * MIB)], [])
    assert {(row.pod, row.gpu): row.memory_quota_bytes for row in rows} == {
        ("vjob", 2): None, ("infer", 0): 2048 * MIB, ("infer", 1): 2048 * MIB}


def test_use_of_a_gpu_nobody_was_allocated_is_a_row_of_its_own() -> None:
    rogue = {"namespace": "research", "pod": "stray", "container": "main"}
    values = [(labels("node-2", 3, "nvdash_pod_gpu_quota_finding", finding="unallocated_use", **rogue), 1.0),
              (labels("node-2", 3, "nvdash_pod_gpu_quota_finding", finding="unallocated_use", **rogue), 1.0)]
    rows = build_pods(_allocated(), values, [])
    stray = [row for row in rows if row.pod == "stray"]
    assert [(row.hostname, row.namespace, row.gpu, row.uuid, row.sharing, row.findings) for row in stray] == [
        ("node-2", "research", 3, "GPU-node-2-3", UNALLOCATED, ("unallocated_use",))]
    assert len(rows) == 4
