"""A real Prometheus holding a week of pods' GPU shares, backfilled with ``promtool tsdb create-blocks-from
openmetrics``: the pod view's 7-day timelines read real range queries over it.

Every pod part (a container on a GPU unit) has an SM share and a memory sample every 5 minutes over the last 7 days,
stamped half-way between 5-minute marks so that no sample sits on a step's window boundary; the allocations
(``nvdash_pod_gpu_allocated``) run every minute from an hour ago to half an hour ahead, so the cluster poller's
instant queries list the pods however long the test takes; so do the vGPU pod's quota (30 % of its GPU, 4 GiB) and
its quota finding (memory over quota), the only pod with either.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.prometheus_cluster import run_prometheus

STEP_S = 300.0
DAYS = 7
GIB = 1 << 30


@dataclass(frozen=True)
class Part:
    """One series of a pod: a container on one unit of one node's GPU."""

    hostname: str
    gpu: int
    container: str
    mig_id: str = ""


@dataclass(frozen=True)
class BackfilledPod:
    namespace: str
    pod: str
    sharing: str
    parts: tuple[Part, ...]


PODS = (
    BackfilledPod("research", "trainer", "whole", (Part("node-1", 0, "main"),)),
    BackfilledPod("research", "notebook", "shared", (Part("node-1", 1, "lab"),)),
    BackfilledPod("serving", "infer", "mps", (Part("node-2", 0, "server"), Part("node-2", 0, "sidecar"),
                                              Part("node-2", 1, "server"))),
    BackfilledPod("serving", "ranker", "mps", (Part("node-2", 0, "server"),)),
    BackfilledPod("tenants", "vjob", "vgpu", (Part("node-2", 2, "main"),)),
    BackfilledPod("batch", "mig-job", "mig", (Part("node-3", 0, "worker", "1"),)),
)
QUOTA_POD = next(index for index, pod in enumerate(PODS) if pod.pod == "vjob")
"""The pod with a quota, over it."""


def uuid(part: Part) -> str:
    return f"GPU-{part.hostname[-1]}{part.gpu:07d}-0000-0000-0000-000000000000"


def sm_share(pod_index: int, part_index: int, time_s: float) -> float:
    """A share that moves over the day (0-1 of the unit), different per pod and part."""
    phase = 2 * math.pi * (time_s / 86_400.0) + pod_index
    return round(0.05 + 0.1 * part_index + 0.3 * (1 + math.sin(phase)) / 2, 4)


def memory_bytes(pod_index: int, part_index: int, time_s: float) -> float:
    """Memory stepping every hour."""
    return float((1 + pod_index + part_index) * GIB + int(time_s // 3600) % 5 * 256 * 1024 * 1024)


def sample_times(end_s: float) -> list[float]:
    """Every 5 minutes over the week before ``end_s``, half-way between 5-minute marks."""
    last = math.floor(end_s / STEP_S) * STEP_S - STEP_S / 2
    count = int(DAYS * 86_400 / STEP_S)
    return [last - k * STEP_S for k in range(count, -1, -1)]


def _labels(pod: BackfilledPod, part: Part) -> str:
    mig = f',GPU_I_ID="{part.mig_id}",GPU_I_PROFILE="1g.10gb"' if part.mig_id else ""
    return (f'Hostname="{part.hostname}",gpu="{part.gpu}",UUID="{uuid(part)}",device="nvidia{part.gpu}"{mig},'
            f'namespace="{pod.namespace}",pod="{pod.pod}",container="{part.container}",sharing="{pod.sharing}"')


def openmetrics(now_s: float) -> str:
    """The whole file: shares and memory for a week, allocations around now, then ``# EOF``."""
    times = sample_times(now_s)
    lines = ["# TYPE nvdash_pod_gpu_sm_share_ratio gauge"]
    for p, pod in enumerate(PODS):
        for q, part in enumerate(pod.parts):
            labels = _labels(pod, part)
            lines += [f"nvdash_pod_gpu_sm_share_ratio{{{labels}}} {sm_share(p, q, t)} {t:.0f}" for t in times]
    lines.append("# TYPE nvdash_pod_gpu_memory_bytes gauge")
    for p, pod in enumerate(PODS):
        for q, part in enumerate(pod.parts):
            labels = _labels(pod, part)
            lines += [f"nvdash_pod_gpu_memory_bytes{{{labels}}} {memory_bytes(p, q, t):.0f} {t:.0f}" for t in times]
    lines.append("# TYPE nvdash_pod_gpu_allocated gauge")
    minute = math.floor(now_s / 60) * 60
    for pod in PODS:
        for part in {(item.hostname, item.gpu, item.mig_id): item for item in pod.parts}.values():
            labels = _labels(pod, part) + ',resource="nvidia.com/gpu"'
            lines += [f"nvdash_pod_gpu_allocated{{{labels}}} 1 {minute + 60 * k:.0f}" for k in range(-60, 31)]
    quota = PODS[QUOTA_POD]
    labels = _labels(quota, quota.parts[0])
    for family, extra, value in (("nvdash_pod_gpu_core_quota_ratio", ',scheme="hami"', "0.3"),
                                 ("nvdash_pod_gpu_memory_quota_bytes", ',scheme="hami"', str(4 * GIB)),
                                 ("nvdash_pod_gpu_quota_finding", ',finding="memory_over_quota"', "1")):
        lines.append(f"# TYPE {family} gauge")
        lines += [f"{family}{{{labels}{extra}}} {value} {minute + 60 * k:.0f}" for k in range(-60, 31)]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def expected(pod_index: int, start_s: float, end_s: float, now_s: float) -> tuple[float, float]:
    """The pod's SM share (GPUs) and memory over ``(start_s, end_s]``: the sum over its parts of each part's mean,
    as ``sum(avg_over_time(...))`` gives them; NaN when no sample falls there."""
    times = [t for t in sample_times(now_s) if start_s < t <= end_s]
    if not times:
        return math.nan, math.nan
    pod = PODS[pod_index]
    sm = sum(sum(sm_share(pod_index, q, t) for t in times) / len(times) for q in range(len(pod.parts)))
    memory = sum(sum(memory_bytes(pod_index, q, t) for t in times) / len(times) for q in range(len(pod.parts)))
    return sm, memory


@contextmanager
def backfilled_prometheus(root: Path, now_s: float) -> Iterator[str]:
    """A Prometheus (scraping nothing) over a week of :data:`PODS`' shares ending at ``now_s``; yields its URL."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    source = root / "pods.om.txt"
    source.write_text(openmetrics(now_s))
    data = root / "data"
    data.mkdir()
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with run_prometheus(root, [], rules=False) as url:
        yield url
