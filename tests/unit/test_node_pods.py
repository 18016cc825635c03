"""This node's pods as the pods page lists them without Prometheus: allocations with their pod's share, quotas and
quota findings from the newest snapshot, a pod's use of a GPU nobody was allocated, and pods only the history saw."""

from __future__ import annotations

from nvdash.apps.cluster_pods import flag_text, pod_rows, quota_text
from nvdash.cluster.model import UNALLOCATED
from nvdash.cluster.node_pods import node_pods
from nvdash.history.share_table import PodUnit
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.sampling.usage_records import GpuUsage, MigInstance, PodDevice, PodResources, Usage
from tests.unit.test_quotas import GPU0, GPU1, GPU2, MIB, hami, proc

MIG = "MIG-11111111-2222-3333-4444-555555555555"


def _snapshot() -> Snapshot:
    gpus = (GpuUsage(0, GPU0), GpuUsage(1, GPU1),
            GpuUsage(2, GPU2, mig_enabled=True, instances=(MigInstance(2, MIG, 2, 0, "3g.40gb",
                                                                       memory_used_bytes=900 * MIB),)))
    devices = (PodDevice("ml", "a", "main", "nvidia.com/gpu", GPU0, "vgpu"),
               PodDevice("ml", "b", "main", "nvidia.com/mig-3g.40gb", MIG, "mig"))
    processes = (proc(1, GPU0, "a", 3000, 70.0), proc(2, GPU1, "sneaky", 700))
    usage = Usage(time_s=100.0, gpus=gpus, processes=processes, grants=(hami("a", GPU0, 2048, 30.0),),
                  pods=PodResources(devices=devices, available=True))
    share = OwnerShare(ShareOwner("pod", "ml", "a", "main"), sm_pct=70.0, fraction=70.0 / 80.0,
                       memory_bytes=3000 * MIB, power_w=None, energy_j=0.0, gpm_sm_active_pct=None, processes=(1,))
    shares = (UnitShares(0, GPU0, GPU0, "vgpu", 1.0, 80.0, (share,), 10.0, 0, None, 0.0, True),)
    samples = (GpuSample(0, utilization_pct=80.0, memory_used_bytes=5000 * MIB), GpuSample(1), GpuSample(2))
    return Snapshot(time_s=100.0, gpus=samples, host=HostSample(), usage=usage, shares=shares)


def test_allocations_carry_their_share_quota_and_findings_and_history_adds_pods_gone() -> None:
    recorded = [PodUnit("ml", "a", "main", GPU0, 0, "vgpu"), PodUnit("old", "gone", "c", GPU1, 1, "shared")]
    rows = {row.pod: row for row in node_pods(_snapshot(), "node-1", recorded)}
    assert sorted(rows) == ["a", "b", "gone", "sneaky"]
    a = rows["a"]
    assert (a.hostname, a.gpu, a.sharing, a.utilization_pct, a.memory_used_bytes) == (
        "node-1", 0, "vgpu", 80.0, 5000 * MIB)
    assert (a.sm_share_pct, a.pod_memory_bytes, a.core_quota_pct, a.memory_quota_bytes) == (
        70.0, 3000 * MIB, 30.0, 2048 * MIB)
    assert a.findings == ("memory_over_quota", "compute_over_quota")
    b = rows["b"]
    assert (b.device, b.memory_used_bytes, b.idle, b.findings, b.sm_share_pct) == (
        "GPU 2 · 3g.40gb #2", 900 * MIB, True, (), None)
    sneaky = rows["sneaky"]
    assert (sneaky.gpu, sneaky.uuid, sneaky.sharing, sneaky.findings) == (1, GPU1, UNALLOCATED, ("unallocated_use",))
    gone = rows["gone"]
    assert (gone.namespace, gone.gpu, gone.sharing, gone.utilization_pct, gone.sm_share_pct, gone.findings) == (
        "old", 1, "shared", None, None, ())
    table = pod_rows([a, sneaky, gone], [1.0, 1.0, 1.0])
    assert table["flags"] == ["\u2691 memory over quota, \u2691 compute above the core quota",
                              "\u2691 use on a GPU nobody was allocated", ""]
    assert table["quota"] == ["30 % · 2.0 GiB", "", ""]
    assert table["kind"] == ["vGPU (GPU-Manager, HAMi)", "not allocated", "time-sliced"]
    assert (quota_text(b), flag_text(b)) == ("", "")


def test_before_the_first_process_reading_only_the_history_lists_pods() -> None:
    recorded = [PodUnit("ml", "a", "main", GPU0, 0, "vgpu")]
    (row,) = node_pods(None, "node-1", recorded)
    assert (row.pod, row.gpu, row.device, row.utilization_pct) == ("a", 0, "GPU 0", None)
    assert node_pods(None, "node-1") == ()
