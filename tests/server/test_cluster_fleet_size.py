"""The cluster poller over a real Prometheus holding more GPU series than the old 20,000-series bound: 1,104 GPUs x
the overview's 20 families, backfilled with ``promtool``. Every GPU is read, none cut off, and the overview's answer
carries only the labels it reads."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nvdash.cluster.model import GAUGES, SEEN_QUERY, cluster_queries
from nvdash.cluster.poller import ClusterPoller
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.selectors import SeriesScope
from tests.prometheus_cluster import run_prometheus

NODES = 138
GPUS = 8
HEALTHY = {"DCGM_FI_DEV_FB_USED": 1024, "DCGM_FI_DEV_FB_FREE": 80_000, "DCGM_FI_DEV_GPU_TEMP": 50,
           "DCGM_FI_DEV_SLOWDOWN_TEMP": 87, "DCGM_FI_DEV_POWER_USAGE": 300, "DCGM_FI_DEV_PCIE_LINK_GEN": 5,
           "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16}


def utilization(node: int, gpu: int) -> int:
    return (node * GPUS + gpu) % 101


def openmetrics(now_s: float) -> str:
    """Every overview family of every GPU, a sample a minute from 5 minutes ago to 30 minutes ahead; the GPUs
    held by a pod (every third) carry its labels and the driver version, as nvdash --metrics-pods exports them."""
    stamps = [f" {round(now_s) + 60 * k}\n" for k in range(-5, 31)]
    lines = []
    for family in GAUGES:
        lines.append(f"# TYPE {family} gauge\n")
        for node in range(NODES):
            for gpu in range(GPUS):
                pod = f',namespace="ml",pod="job-{node}",container="main"' if gpu % 3 == 0 else ""
                labels = (f'Hostname="node-{node:03d}",gpu="{gpu}",UUID="GPU-{node:03d}-{gpu}",'
                          f'modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="570.86.15",'
                          f'pci_bus_id="00000000:{gpu + 24:02X}:00.0",device="nvidia{gpu}",job="nvdash"{pod}')
                value = utilization(node, gpu) if family == "DCGM_FI_DEV_GPU_UTIL" else HEALTHY.get(family, 0)
                lines += [f"{family}{{{labels}}} {value}{stamp}" for stamp in stamps]
    return "".join(lines) + "# EOF\n"


def test_the_poller_reads_every_gpu_past_20000_series_with_only_the_labels_it_needs(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    now = time.time()
    source = tmp_path / "fleet.om.txt"
    source.write_text(openmetrics(now))
    (tmp_path / "data").mkdir()
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source),
                           str(tmp_path / "data")], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with run_prometheus(tmp_path, [], rules=False) as url:
        client = PrometheusClient(url, timeout_s=60.0)
        answer = client.instant(cluster_queries(SeriesScope()).gpus)
        assert len(answer.samples) == NODES * GPUS * len(GAUGES) == 22_080
        assert not answer.truncated
        assert {tuple(sorted(sample.labels)) for sample in answer.samples} == {
            ("Hostname", "UUID", "__name__", "gpu", "modelName")}
        assert len(client.instant(SEEN_QUERY).samples) == NODES * GPUS
        state = ClusterPoller(client).refresh()
        assert state.error is None
        assert not state.truncated
        assert len(state.gpus) == NODES * GPUS
        assert all(gpu.reporting for gpu in state.gpus)
        assert {(gpu.hostname, gpu.index): gpu.utilization_pct for gpu in state.gpus} == {
            (f"node-{node:03d}", gpu): float(utilization(node, gpu)) for node in range(NODES) for gpu in range(GPUS)}
        assert {gpu.health.status.value for gpu in state.gpus} == {"ok"}
