"""Quota findings: memory over quota, compute above the core quota (with its tolerance), a quota never used, and use
of a GPU nobody was allocated, each with exact values and its sentence."""

from __future__ import annotations

from nvdash.apps.gpu_health import status_html
from nvdash.health.quotas import COMPUTE_TOLERANCE_PCT, QuotaFinding, quota_findings
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.sampling.usage_records import GpuProcess, GpuUsage, Grant, PodDevice, PodResources, Usage

GPU0 = "GPU-98e1c2a4-5b3d-4f6e-8a7b-1c2d3e4f5a6b"
GPU1 = "GPU-3f0b7d1e-9c2a-4e8b-b6d4-7a5e2c1f0d93"
GPU2 = "GPU-0a0b0c0d-1111-2222-3333-444455556666"
MIB = 1 << 20
GPUS = (GpuUsage(0, GPU0), GpuUsage(1, GPU1), GpuUsage(2, GPU2))


def proc(pid: int, gpu: str, pod: str | None, memory_mib: int, sm: float | None = None, *,
         container: str | None = "main") -> GpuProcess:
    return GpuProcess(gpu_index=[g.uuid for g in GPUS].index(gpu), gpu_uuid=gpu, pid=pid, kinds=("compute",),
                      gpu_memory_bytes=memory_mib * MIB, sm_pct=sm, pod_namespace=None if pod is None else "ml",
                      pod_name=pod, container_name=None if pod is None else container)


def hami(pod: str, gpu: str, memory_mib: int | None, core: float | None = None) -> Grant:
    return Grant("ml", pod, "main", "hami", "environment", gpu, core_pct=core,
                 memory_bytes=None if memory_mib is None else memory_mib * MIB)


def usage(processes: list[GpuProcess], grants: list[Grant], devices: tuple[PodDevice, ...] = (),
          available: bool = False) -> Usage:
    return Usage(time_s=0.0, gpus=GPUS, processes=tuple(processes), grants=tuple(grants),
                 pods=PodResources(devices=devices, available=available))


def test_memory_over_quota_is_flagged_and_under_or_at_it_is_not() -> None:
    found = quota_findings(usage(
        [proc(1, GPU0, "over", 3000), proc(2, GPU0, "over", 200), proc(3, GPU0, "under", 1000),
         proc(4, GPU0, "at", 2048)],
        [hami("over", GPU0, 3000), hami("under", GPU0, 2000), hami("at", GPU0, 2048)]))
    assert found == (QuotaFinding("ml", "over", "main", GPU0, "memory_over_quota", 3200.0 * MIB, 3000.0 * MIB,
                                  "ml/over/main holds 3.1 GiB of GPU memory on GPU 0, over its HAMi quota of 2.9 GiB",
                                  "hami"),)


def test_compute_above_the_core_quota_beyond_the_tolerance() -> None:
    limit = 30.0
    found = quota_findings(usage(
        [proc(1, GPU0, "busy", 10, sm=20.0), proc(2, GPU0, "busy", 10, sm=20.0),
         proc(3, GPU1, "edge", 10, sm=limit + COMPUTE_TOLERANCE_PCT)],
        [hami("busy", GPU0, None, core=limit), hami("edge", GPU1, None, core=limit)]))
    assert [(f.pod, f.kind, f.used, f.quota) for f in found] == [("busy", "compute_over_quota", 40.0, 30.0)]
    assert found[0].text == "ml/busy/main keeps 40 % of GPU 0's SM time busy, above its HAMi core quota of 30 % " \
                            "(+5 tolerated)"


def test_the_shares_time_weighted_sm_wins_over_the_process_sum() -> None:
    owner = OwnerShare(ShareOwner("pod", "ml", "busy", "main"), sm_pct=12.0, fraction=0.2, memory_bytes=None,
                       power_w=None, energy_j=0.0, gpm_sm_active_pct=None, processes=2)
    unit = UnitShares(0, GPU0, GPU0, "vgpu", 2.0, 60.0, (owner,), 48.0, 0, None, 0.0, True)
    data = usage([proc(1, GPU0, "busy", 10, sm=90.0)], [hami("busy", GPU0, None, core=30.0)])
    assert quota_findings(data, (unit,)) == ()
    assert [f.used for f in quota_findings(data)] == [90.0]


def test_a_gpu_manager_quota_never_used_and_one_used_on_one_gpu() -> None:
    idle = Grant("ml", "idle", "main", "gpu-manager", "pod-resources", None, core_pct=50.0, memory_bytes=4 << 30)
    used = Grant("ml", "busy", "main", "gpu-manager", "pod-resources", None, core_pct=25.0, memory_bytes=1 << 30)
    found = quota_findings(usage([proc(1, GPU1, "busy", 1500, sm=25.0)], [idle, used]))
    assert found == (
        QuotaFinding("ml", "idle", "main", None, "quota_unused", 0.0, float(4 << 30),
                     "ml/idle/main holds a GPU-Manager quota (50 % of a GPU, 4.0 GiB) but runs no process on it",
                     "gpu-manager"),
        QuotaFinding("ml", "busy", "main", GPU1, "memory_over_quota", 1500.0 * MIB, float(1 << 30),
                     "ml/busy/main holds 1.5 GiB of GPU memory on GPU 1, over its GPU-Manager quota of 1.0 GiB",
                     "gpu-manager"),
    )


def test_an_unattributed_process_on_the_gpu_means_the_quota_may_be_in_use() -> None:
    assert quota_findings(usage([proc(1, GPU0, None, 100)], [hami("quiet", GPU0, 1000)])) == ()


def test_use_of_a_gpu_nobody_was_allocated_while_pods_hold_others() -> None:
    devices = (PodDevice("ml", "a", "main", "nvidia.com/gpu", GPU0, "whole"),)
    processes = [proc(1, GPU0, "a", 100), proc(2, GPU2, None, 300), proc(3, GPU2, None, 200),
                 proc(4, GPU1, "sneaky", 700)]
    found = quota_findings(usage(processes, [], devices, available=True))
    assert [(f.gpu_uuid, f.pod, f.kind, f.used) for f in found] == [
        (GPU1, "sneaky", "unallocated_use", 700.0 * MIB), (GPU2, "", "unallocated_use", 500.0 * MIB)]
    assert found[1].text == ("GPU 2 runs 2 processes of a process outside any pod (500 MiB), but the kubelet "
                             "allocated it to no pod")
    # A GPU-Manager grant names no GPU: its pod's processes, and processes of no known pod, may be on its GPU.
    floating = Grant("ml", "sneaky", "main", "gpu-manager", "pod-resources", None, core_pct=50.0)
    assert quota_findings(usage(processes, [floating], devices, available=True)) == ()
    # No kubelet answer, or no pod holding any GPU: nothing to compare with.
    assert quota_findings(usage(processes, [], devices, available=False)) == ()
    assert quota_findings(usage(processes, [], (), available=True)) == ()


def test_gpu_health_flags_each_finding_on_its_gpu_row_and_one_without_a_gpu_below() -> None:
    hardware = open_hardware("vgpu")
    inventory = hardware.inventory
    hardware.close()
    gpu1 = inventory.gpus[1].uuid
    over = QuotaFinding("ml", "a", "main", gpu1, "memory_over_quota", 2.0, 1.0, "ml/a/main holds <3 GiB>", "hami")
    unused = QuotaFinding("ml", "b", "main", None, "quota_unused", 0.0, 1.0, "ml/b/main holds a quota", "gpu-manager")
    html = status_html(inventory, [], [over, unused])
    rows = html.split("<tr")[1:]
    assert "no problem found" in rows[0]
    assert 'data-quota="memory_over_quota"' in rows[1]
    assert "Quota: ml/a/main holds &lt;3 GiB&gt;</li>" in rows[1]
    assert "</table><ul" in html
    assert "Quota: ml/b/main holds a quota</li></ul>" in html
    assert status_html(inventory, []).count("no problem found") == 2
