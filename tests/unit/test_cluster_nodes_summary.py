"""The nodes at fleet size from PromQL aggregations: the queries (within the scope, the host names quoted), which
nodes are read GPU by GPU, and each node's numbers from the answers."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from nvdash.cluster.model import GpuClass, build_gpus
from nvdash.cluster.nodes import NodeAnswers, detail_hosts, detail_queries, fleet_nodes, node_queries
from nvdash.cluster.selectors import SeriesScope
from tests.unit.test_cluster import HEALTHY, NOW, labels

MIB = 1024 * 1024
Series = list[tuple[Mapping[str, str], float]]


def answers(*, reporting: Series = (), seen: Series = (), sums: Series = (), counts: Series = (),
            verdict_nodes: Series = (), verdicts: Series = (), xids: Series = ()) -> NodeAnswers:
    return NodeAnswers(list(reporting), list(seen), list(sums), list(counts), list(verdict_nodes), list(verdicts),
                       list(xids))


def host(name: str, **extra: str) -> dict[str, str]:
    return {"Hostname": name, **extra}


def healthy_node(name: str, gpus: int = 8, *, verdicts: bool = True) -> dict[str, Series]:
    """A node's answers: ``gpus`` reporting, all with a verdict of 0 (not in the verdicts answer), or no verdict at
    all (a plain dcgm-exporter)."""
    return {"reporting": [(host(name, modelName="NVIDIA H100 80GB HBM3"), float(gpus))],
            "seen": [(host(name), float(gpus))], "verdict_nodes": [(host(name), float(gpus))] if verdicts else []}


def merged(*parts: Mapping[str, Series]) -> NodeAnswers:
    found: dict[str, Series] = {}
    for part in parts:
        for key, series in part.items():
            found.setdefault(key, []).extend(series)
    return answers(**found)


def test_the_queries_select_within_the_scope_and_aggregate_by_its_host_label() -> None:
    scoped = node_queries(SeriesScope(host_label="node", matchers=('cluster="a"',)))
    for query in scoped.all():
        assert 'cluster="a"' in query
        assert "Hostname" not in query
    assert scoped.verdicts == 'max by (node, gpu) (nvdash_gpu_health_status{cluster="a"}) > 0'
    assert scoped.reporting.startswith("count by (node, modelName) (group by (node, gpu, modelName) (")
    default = node_queries(SeriesScope())
    assert default.sums.startswith("sum by (__name__, Hostname, hostname) (max by (__name__, Hostname, hostname, gpu)")
    # Both namings of the summed families and of the XID code.
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_FB_USED_BYTES"):
        assert name in default.sums
    assert "DCGM_FI_DEV_XID_ERRORS" in default.xids
    assert "DCGM_FI_DEV_XID_ERROR{" in default.xids


def test_the_detail_queries_name_the_hosts_as_an_escaped_regex_under_either_host_label() -> None:
    readings, seen = detail_queries(SeriesScope(), ["gpu-1.rack(2)", "a"])
    pattern = '"a|gpu\\\\-1\\\\.rack\\\\(2\\\\)"'
    assert f"Hostname=~{pattern}" in readings
    assert f"hostname=~{pattern}" in readings
    assert f"Hostname=~{pattern}" in seen
    readings, _seen = detail_queries(SeriesScope(host_label="node"), ["a"])
    assert 'node=~"a"' in readings
    assert "Hostname" not in readings


def test_the_nodes_read_gpu_by_gpu_are_the_wanted_ones_then_the_worst_first() -> None:
    parts = [healthy_node(name) for name in ("ok-1", "ok-2", "warn", "crit", "silent", "xid", "wanted")]
    found = merged(*parts, healthy_node("plain", verdicts=False), {
        "verdicts": [(host("warn", gpu="1"), 1.0), (host("crit", gpu="2"), 2.0)],
        "seen": [(host("silent"), 1.0)],  # 9 seen within the hour, 8 reporting now
        "xids": [(host("xid", gpu="0"), 43.0)],
    })
    assert detail_hosts(found, ["wanted", "gone"]) == ["wanted", "crit", "silent", "xid", "warn", "plain"]
    assert detail_hosts(found, ["wanted"], limit=3) == ["wanted", "crit", "silent"]
    assert detail_hosts(found, [], limit=1) == ["crit"]


def test_a_node_from_the_aggregations_counts_its_gpus_by_verdict_and_xid_and_adds_no_naming_twice() -> None:
    found = merged(healthy_node("n"), {
        "seen": [(host("n"), 1.0)],
        "verdicts": [(host("n", gpu="1"), 1.0), (host("n", gpu="2"), 2.0)],
        "xids": [(host("n", gpu="1"), 79.0), (host("n", gpu="4"), 43.0)],
        # Utilization summed over 8 GPUs (4.8: %) and, the same readings, under 4.9 (a ratio): not added twice.
        "sums": [(host("n", __name__="DCGM_FI_DEV_GPU_UTIL"), 400.0),
                 (host("n", __name__="DCGM_FI_DEV_GPU_UTIL_RATIO"), 4.0),
                 (host("n", __name__="DCGM_FI_DEV_FB_USED"), 8 * 1024.0),
                 (host("n", __name__="DCGM_FI_DEV_FB_FREE_BYTES"), 8 * 3072.0 * MIB),
                 (host("n", __name__="DCGM_FI_DEV_FB_RESERVED"), 8 * 512.0)],
        "counts": [(host("n", __name__="DCGM_FI_DEV_GPU_UTIL"), 8.0),
                   (host("n", __name__="DCGM_FI_DEV_GPU_UTIL_RATIO"), 8.0)],
    })
    (node,) = fleet_nodes(found, (), ())
    assert not node.detailed
    # GPU 1: warning by verdict, critical by XID 79; GPU 2 critical by verdict; GPU 4: XID 43 (a warning).
    assert dict(node.counts) == {GpuClass.OK: 5, GpuClass.WARNING: 1, GpuClass.CRITICAL: 2, GpuClass.LOST: 0,
                                 GpuClass.NOT_REPORTING: 1}
    assert node.gpus == 9
    assert node.worst is GpuClass.CRITICAL
    assert node.problems[0] == "GPU 1: last XID 79: GPU fell off the bus"
    assert node.problems[1] == "GPU 2: Critical by its node's own health rules (its node's Health page says why)"
    assert node.problems[2].startswith("GPU 4: last XID 43: ")
    assert node.xid_now == 2
    assert node.utilization_pct == pytest.approx(50.0)
    assert node.memory_used_bytes == 8 * 1024 * MIB
    assert node.memory_total_bytes == 8 * (1024 + 3072 + 512) * MIB
    assert node.models == ("NVIDIA H100 80GB HBM3",)


def test_a_detailed_node_is_summarized_from_its_gpus_readings() -> None:
    current = [(labels("d", gpu, name), value) for gpu in range(2) for name, value in HEALTHY.items()]
    gpus = build_gpus(current, [labels("d", gpu) for gpu in range(2)], NOW)
    found = merged(healthy_node("d", 2), healthy_node("e", 2))
    nodes = fleet_nodes(found, gpus, ["d"])
    assert [(node.hostname, node.detailed) for node in nodes] == [("d", True), ("e", False)]
    assert nodes[0].utilization_pct == HEALTHY["DCGM_FI_DEV_GPU_UTIL"]
    assert nodes[0].memory_used_bytes == 2 * HEALTHY["DCGM_FI_DEV_FB_USED"] * MIB
    assert nodes[1].counts[GpuClass.OK] == 2
    assert nodes[1].utilization_pct is None


def test_a_node_exported_under_both_host_labels_is_counted_once_and_its_models_added() -> None:
    """nvdash (``Hostname``) beside a dcgm-exporter 4.8.3+ (``hostname``) on one node: the per-GPU path keys GPUs by
    host and index, so 8 GPUs; a node with two models has its GPUs of each added."""
    found = answers(
        reporting=[(host("both", modelName="NVIDIA H100 80GB HBM3"), 8.0),
                   ({"hostname": "both", "modelName": "NVIDIA H100 80GB HBM3"}, 8.0),
                   (host("mixed", modelName="NVIDIA H100 80GB HBM3"), 4.0),
                   (host("mixed", modelName="NVIDIA A100-SXM4-80GB"), 4.0)],
        seen=[(host("both"), 8.0), ({"hostname": "both"}, 8.0), (host("mixed"), 8.0)],
        verdict_nodes=[(host("both"), 8.0), (host("mixed"), 8.0)])
    both, mixed = fleet_nodes(found, (), ())
    assert (both.hostname, both.gpus, both.counts[GpuClass.OK], both.counts[GpuClass.NOT_REPORTING]) == (
        "both", 8, 8, 0)
    assert (mixed.gpus, mixed.models) == (8, ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"))
    assert detail_hosts(found, []) == []
