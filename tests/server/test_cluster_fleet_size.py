"""The cluster poller over a real Prometheus holding more GPU series than the old 20,000-series bound: 1,104 GPUs x
the overview's 21 families, backfilled with ``promtool``. Every GPU is read, none cut off, and the overview's answer
carries only the labels it reads. At this size the poller summarizes the nodes by aggregation: the same numbers as
from every GPU's readings, with the GPUs read only of the nodes that need a closer look."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nvdash.cluster.model import GAUGES, SEEN_QUERY, ClusterState, GpuClass, cluster_queries
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


VERDICT_CRITICAL = (0, 1)
"""node-000's GPU 1: its node's own health rules say critical (nothing in its readings does)."""
XID_GPU = (1, 2)
"""node-001's GPU 2: last XID 79 (fallen off the bus), a critical XID."""
NO_VERDICT_NODE = 2
"""node-002 exports no verdict (a plain dcgm-exporter): its GPUs are judged from their readings."""
SILENT_GPU = (3, 5)
"""node-003's GPU 5: readings until 10 minutes ago only (seen within the hour, not reporting now)."""
NAMING_4_9_NODE = 4
"""node-004 exports dcgm-exporter 4.9's names, units and host label."""
TOTAL_MIB = 1024 + 80_000


def rack(node: int) -> str:
    """40 nodes to a rack, as a relabelling would add it to every series of a node."""
    return f"rack-{node // 40}"


def value_of(family: str, node: int, gpu: int) -> float:
    """A GPU's reading in dcgm-exporter 4.8's unit."""
    if family == "DCGM_FI_DEV_GPU_UTIL":
        return utilization(node, gpu)
    if family == "nvdash_gpu_health_status":
        return 2 if (node, gpu) == VERDICT_CRITICAL else 0
    if family == "DCGM_FI_DEV_XID_ERRORS":
        return 79 if (node, gpu) == XID_GPU else 0
    return HEALTHY.get(family, 0)


def series_4_9(family: str, value: float) -> tuple[str, float]:
    """dcgm-exporter 4.9's name and unit for the families that changed (its release notes): utilization as a ratio,
    framebuffer in bytes, temperature and XID renamed."""
    if family == "DCGM_FI_DEV_GPU_UTIL":
        return "DCGM_FI_DEV_GPU_UTIL_RATIO", value / 100.0
    if family in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"):
        return family + "_BYTES", value * 1024 * 1024
    renamed = {"DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
               "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
               "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
               "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
               "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS"}
    return renamed.get(family, family), value


def openmetrics(now_s: float) -> str:
    """Every overview family of every GPU, a sample a minute from 5 minutes ago to 30 minutes ahead; the GPUs
    held by a pod (every third) carry its labels and the driver version, as nvdash --metrics-pods exports them.
    The exceptions above: a verdict, an XID, a node without verdicts, a silent GPU, a node under 4.9's names."""
    stamps = [f" {round(now_s) + 60 * k}\n" for k in range(-5, 31)]
    silent = [f" {round(now_s) + 60 * k}\n" for k in range(-20, -9)]
    families: dict[str, list[str]] = {}
    for family in GAUGES:
        for node in range(NODES):
            if family == "nvdash_gpu_health_status" and node == NO_VERDICT_NODE:
                continue
            host = "hostname" if node == NAMING_4_9_NODE else "Hostname"
            for gpu in range(GPUS):
                pod = f',namespace="ml",pod="job-{node}",container="main"' if gpu % 3 == 0 else ""
                labels = (f'{host}="node-{node:03d}",gpu="{gpu}",UUID="GPU-{node:03d}-{gpu}",rack="{rack(node)}",'
                          f'modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="570.86.15",'
                          f'pci_bus_id="00000000:{gpu + 24:02X}:00.0",device="nvidia{gpu}",job="nvdash"{pod}')
                name, value = family, value_of(family, node, gpu)
                if node == NAMING_4_9_NODE:
                    name, value = series_4_9(family, value)
                times = silent if (node, gpu) == SILENT_GPU else stamps
                families.setdefault(name, []).extend(f"{name}{{{labels}}} {value!r}{stamp}" for stamp in times)
    return "".join(f"# TYPE {name} gauge\n" + "".join(lines) for name, lines in families.items()) + "# EOF\n"


def backfilled(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    source = tmp_path / "fleet.om.txt"
    source.write_text(openmetrics(time.time()))
    (tmp_path / "data").mkdir()
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source),
                           str(tmp_path / "data")], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def per_node(state: ClusterState) -> dict[str, tuple[object, ...]]:
    return {node.hostname: (dict(node.counts), node.models, node.utilization_pct, node.memory_used_bytes,
                            node.memory_total_bytes, node.xid_now) for node in state.nodes}


def test_the_poller_reads_every_gpu_past_20000_series_with_only_the_labels_it_needs(tmp_path: Path) -> None:
    backfilled(tmp_path)
    with run_prometheus(tmp_path, [], rules=False) as url:
        client = PrometheusClient(url, timeout_s=60.0)
        answer = client.instant(cluster_queries(SeriesScope()).gpus)
        silent, no_verdict = len(GAUGES), GPUS
        assert len(answer.samples) == NODES * GPUS * len(GAUGES) - silent - no_verdict == 23_155
        assert not answer.truncated
        assert {tuple(sorted(sample.labels)) for sample in answer.samples} == {
            ("Hostname", "UUID", "__name__", "gpu", "modelName"), ("UUID", "__name__", "gpu", "hostname", "modelName")}
        assert len(client.instant(SEEN_QUERY).samples) == NODES * GPUS
        state = ClusterPoller(client, fleet_from_gpus=10**9).refresh()
        assert state.error is None
        assert not state.truncated
        assert not state.fleet
        assert len(state.gpus) == NODES * GPUS
        assert [(gpu.hostname, gpu.index) for gpu in state.gpus if not gpu.reporting] == [("node-003", 5)]
        assert {(gpu.hostname, gpu.index): gpu.utilization_pct for gpu in state.gpus if gpu.reporting} == {
            (f"node-{node:03d}", gpu): float(utilization(node, gpu)) for node in range(NODES) for gpu in range(GPUS)
            if (node, gpu) != SILENT_GPU}
        assert {(gpu.hostname, gpu.index): gpu.health.status.value for gpu in state.gpus
                if gpu.health.status.value != "ok"} == {
            ("node-000", 1): "critical", ("node-001", 2): "critical", ("node-003", 5): "warning"}


def test_at_fleet_size_the_nodes_are_aggregated_in_promql_and_equal_the_per_gpu_summary(tmp_path: Path) -> None:
    backfilled(tmp_path)
    with run_prometheus(tmp_path, [], rules=False) as url:
        client = PrometheusClient(url, timeout_s=60.0)
        every_gpu = ClusterPoller(client, fleet_from_gpus=10**9).refresh()
        poller = ClusterPoller(client)
        fleet = poller.refresh()
        assert fleet.error is None
        assert not fleet.truncated
        assert fleet.fleet
        assert not every_gpu.fleet
        # Only the nodes with a GPU not OK, not reporting, or without verdicts were read GPU by GPU.
        assert sorted({gpu.hostname for gpu in fleet.gpus}) == ["node-000", "node-001", "node-002", "node-003"]
        assert [node.hostname for node in fleet.nodes if node.detailed] == ["node-000", "node-001", "node-002",
                                                                           "node-003"]
        assert per_node(fleet) == per_node(every_gpu)
        assert fleet.gpu_count == every_gpu.gpu_count == NODES * GPUS
        node_004 = next(node for node in fleet.nodes if node.hostname == "node-004")
        utils = [utilization(NAMING_4_9_NODE, gpu) for gpu in range(GPUS)]
        assert node_004.utilization_pct == pytest.approx(sum(utils) / GPUS)
        assert node_004.memory_used_bytes == GPUS * 1024 * 1024 * 1024
        assert node_004.memory_total_bytes == GPUS * TOTAL_MIB * 1024 * 1024
        assert node_004.counts[GpuClass.OK] == GPUS
        assert not node_004.detailed
        critical = next(node for node in fleet.nodes if node.hostname == "node-000")
        assert critical.counts[GpuClass.CRITICAL] == 1
        assert critical.problems == (
            "GPU 1: Critical by its node's own health rules (its node's Health page says why)",)
        assert next(node for node in fleet.nodes if node.hostname == "node-001").xid_now == 1
        silent = next(node for node in fleet.nodes if node.hostname == "node-003")
        assert silent.counts[GpuClass.NOT_REPORTING] == 1
        assert silent.counts[GpuClass.OK] == GPUS - 1
        # A node a page shows is read GPU by GPU from the next refresh on.
        poller.want_node("node-100")
        chosen = poller.refresh()
        assert [(gpu.index, gpu.utilization_pct) for gpu in chosen.node("node-100")] == [
            (gpu, float(utilization(100, gpu))) for gpu in range(GPUS)]
        # At most detail_nodes_max nodes, the page's first, then the worst.
        capped = ClusterPoller(client, detail_nodes_max=2)
        capped.want_node("node-100")
        state = capped.refresh()
        assert sorted({gpu.hostname for gpu in state.gpus}) == ["node-000", "node-100"]
        assert per_node(state) == per_node(every_gpu)


def test_a_group_label_gives_each_node_its_group_on_both_paths(tmp_path: Path) -> None:
    backfilled(tmp_path)
    with run_prometheus(tmp_path, [], rules=False) as url:
        client = PrometheusClient(url, timeout_s=60.0)
        scope = SeriesScope(group_label="rack")
        for poller in (ClusterPoller(client, scope=scope), ClusterPoller(client, scope=scope, fleet_from_gpus=10**9)):
            state = poller.refresh()
            assert state.error is None
            assert {node.hostname: node.group for node in state.nodes} == {
                f"node-{node:03d}": rack(node) for node in range(NODES)}
            assert {gpu.group for gpu in state.gpus if gpu.hostname == "node-001"} == {"rack-0"}
