"""The quotas table of GPU Processes: rows built from hand-made usage and shares, and the page showing them."""

from __future__ import annotations

import math
from dataclasses import replace

from bokeh.models import ColumnDataSource
from bokeh.models.widgets import DataTable, Div

from nvdash.apps.quota_table import FLAG, FLAG_COLOR, PENDING, quota_columns
from nvdash.health.quota_judge import watch
from nvdash.health.quotas import QuotaFinding, quota_findings
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.sampling.usage_records import GpuProcess, Grant, HostProcess, ProcessLimits, Usage
from tests.unit.test_apps import tick
from tests.unit.test_apps_processes import Page, make_ctx, snapshot
from tests.unit.test_quotas import GPU0, GPU1, GPU2, GPUS, MIB, hami, proc

BUSY = hami("busy", GPU0, 1000, core=30.0)
IDLE = Grant("ml", "idle", "main", "gpu-manager", "pod-resources", None, core_pct=50.0, memory_bytes=4 << 30)
MPS_POD = Grant("ml", "mps-pod", "", "mps", "environment", GPU1, core_pct=40.0, memory_bytes=1 << 30)
LONE = GpuProcess(1, GPU1, 4, ("mps",), 300 * MIB, sm_pct=12.0,
                  host=HostProcess(4, limits=ProcessLimits(mps_thread_pct=25.0,
                                                           mps_pinned_memory_bytes=((0, 256 * MIB),))))
PROCESSES = (proc(1, GPU0, "busy", 1200, sm=20.0), proc(2, GPU0, "busy", 300, sm=20.0),
             proc(3, GPU1, "mps-pod", 512, sm=10.0, container=None), LONE, proc(5, GPU2, None, 700, sm=15.0))
USAGE = Usage(time_s=0.0, gpus=GPUS, processes=PROCESSES, grants=(BUSY, IDLE, MPS_POD))
BUSY_SHARE = OwnerShare(ShareOwner("pod", "ml", "busy", "main"), sm_pct=42.0, fraction=0.5, memory_bytes=None,
                        power_w=None, energy_j=0.0, gpm_sm_active_pct=None, processes=2)
LONE_SHARE = OwnerShare(ShareOwner("process", pid=4), sm_pct=9.5, fraction=0.5, memory_bytes=None, power_w=None,
                        energy_j=0.0, gpm_sm_active_pct=None, processes=1)
SHARES = (UnitShares(0, GPU0, GPU0, "vgpu", 2.0, 84.0, (BUSY_SHARE,), 42.0, 0, None, 0.0, True),
          UnitShares(1, GPU1, GPU1, "mps", 2.0, 19.0, (LONE_SHARE,), 9.5, 0, None, 0.0, True))
UNALLOCATED = QuotaFinding("", "", "", GPU2, "unallocated_use", 700.0 * MIB, None,
                           "GPU 2 runs 1 process of a process outside any pod (700 MiB), but the kubelet allocated "
                           "it to no pod")


def test_each_grant_against_its_use_then_mps_clients_by_pid_then_unallocated_use() -> None:
    # An unattributed process may be the idle pod's: one reading alone does not call its quota unused; the judge
    # (after 10 minutes) and unallocated use are handed in as they would come.
    unused = QuotaFinding("ml", "idle", "main", None, "quota_unused", 0.0, float(4 << 30), "ml/idle/main idles",
                          "gpu-manager")
    findings = (*quota_findings(USAGE, SHARES), unused, UNALLOCATED)
    assert [f.kind for f in findings] == ["memory_over_quota", "compute_over_quota", "quota_unused",
                                          "unallocated_use"]
    data = quota_columns(USAGE, SHARES, findings)
    assert data["owner"] == ["ml/busy/main", "ml/idle/main", "ml/mps-pod", "pid 4 (no pod)", "outside any pod"]
    assert data["scheme"] == ["HAMi", "GPU-Manager", "MPS", "MPS", "no allocation"]
    assert data["source"] == ["environment", "pod-resources", "environment", "environment", ""]
    assert data["gpu"] == ["GPU 0", "not named", "GPU 1", "GPU 1", "GPU 2"]
    assert data["core"] == ["30 %", "50 %", "40 %", "25 %", "none"]
    # The pod's time-weighted share (42 %) wins over its processes' sum (40 %); a PID's share over its own 12 %.
    assert data["sm"] == ["42.0 %", "n/a", "10.0 %", "9.5 %", "15.0 %"]
    assert data["memory_quota"] == ["1000.0 MiB", "4.0 GiB", "1.0 GiB", "256.0 MiB", "none"]
    assert data["memory"] == ["1.5 GiB", "0 B", "512.0 MiB", "300.0 MiB", "700.0 MiB"]
    assert data["finding"] == [FLAG + "memory over quota, compute above quota", FLAG + "quota unused", "",
                               FLAG + "memory over quota", FLAG + "use without allocation"]
    assert data["flag_color"] == [FLAG_COLOR, FLAG_COLOR, "", FLAG_COLOR, FLAG_COLOR]
    assert data["finding_text"][0] == (
        "ml/busy/main holds 1.5 GiB of GPU memory on GPU 0, over its HAMi quota of 1000 MiB. ml/busy/main keeps 42 % "
        "of GPU 0's SM time busy, above its HAMi core quota of 30 % (+5 tolerated).")
    assert data["finding_text"][3] == "pid 4 holds 300.0 MiB, over its pinned memory limit of 256.0 MiB."
    assert data["core_pct"][:4] == [30.0, 50.0, 40.0, 25.0]
    assert math.isnan(data["core_pct"][4])
    assert data["memory_bytes"] == [1500.0 * MIB, 0.0, 512.0 * MIB, 300.0 * MIB, 700.0 * MIB]
    assert math.isnan(data["sm_pct"][1])


def test_no_grant_and_no_finding_no_rows() -> None:
    plain = Usage(time_s=0.0, gpus=GPUS, processes=(proc(1, GPU0, None, 100),))
    assert quota_columns(plain, (), ())["owner"] == []
    assert quota_columns(None, (), ())["owner"] == []
    # A PID outside any pod whose environment sets no MPS limit is no row either.
    unlimited = replace(LONE, host=HostProcess(4, limits=ProcessLimits()))
    assert quota_columns(replace(plain, processes=(unlimited,)), (), ())["owner"] == []


def test_the_page_shows_the_judged_quotas_and_hides_them_without_any() -> None:
    first = replace(snapshot(1.0, replace(USAGE, time_s=1.0, grants=(BUSY,))), shares=SHARES)
    ctx = make_ctx(snapshot(0.5, None))
    watch(ctx.store)
    ctx.store.append(first)
    page = Page(ctx)
    source = page.named("quotas", ColumnDataSource)
    table = page.named("quota-table", DataTable)
    assert table.visible
    assert page.named("quota-title", Div).visible
    assert list(source.data["owner"]) == ["ml/busy/main", "pid 4 (no pod)"]
    assert list(source.data["finding"]) == [FLAG + "memory over quota"] * 2, "compute above quota: one reading only"
    alone = replace(BUSY, memory_bytes=None)
    assert quota_columns(replace(USAGE, grants=(alone,)), SHARES, ())["finding"][0] == PENDING
    for seq in (2, 3):
        ctx.store.append(replace(snapshot(float(seq), replace(USAGE, time_s=float(seq), grants=(BUSY,))),
                                 shares=SHARES))
        tick(page.doc)
    assert list(source.data["finding"]) == [FLAG + "memory over quota, compute above quota", FLAG + "memory over quota"]
    assert tick(page.doc) == [], "nothing new, nothing sent"
    ctx.store.append(snapshot(4.0, Usage(time_s=4.0, gpus=GPUS)))
    tick(page.doc)
    assert list(source.data["owner"]) == []
    assert not table.visible
    assert not page.named("quota-title", Div).visible
