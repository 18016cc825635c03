"""/Cluster-Nodes at fleet size: one overview cell per node above 256 GPUs, and every node's GPUs grouped in one
pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from bokeh.document import Document

from nvdash.apps.cluster_nodes import (
    GPU_CELLS_UP_TO,
    GPU_TITLE,
    NODE_COLUMNS,
    NODE_TITLE,
    _NodesPage,
    node_rows,
    overview_data,
    util_color,
)
from nvdash.apps.figures import LEVEL_PALETTE, LOST_COLOR, STATUS_COLORS
from nvdash.cluster import open_cluster
from nvdash.cluster.access import PrometheusAccess
from nvdash.cluster.model import GAUGES, ClusterState, _either, build_gpus, cluster_queries
from nvdash.cluster.selectors import SeriesScope
from tests.unit.test_apps import make_ctx
from tests.unit.test_cluster import HEALTHY, NOW, labels

MIB = 1024 * 1024


def fleet(nodes: int, gpus: int = 8, *, broken: tuple[tuple[int, int], ...] = (), silent: int | None = None,
          racks: Callable[[int], str] | None = None) -> ClusterState:
    """``nodes`` x ``gpus`` healthy GPUs, utilization 10 x the GPU's index + the node's number, except the GPUs
    ``broken`` ((node, GPU): XID 79) and every GPU of node ``silent`` (seen in the last hour, no reading now); each
    node's series labelled ``rack`` = ``racks(node)`` when given (and not empty)."""
    current = []
    seen = []
    for node in range(nodes):
        host = f"node-{node:02d}"
        rack = {"rack": racks(node)} if racks is not None and racks(node) else {}
        for gpu in range(gpus):
            seen.append(labels(host, gpu, **rack))
            if node == silent:
                continue
            values = {**HEALTHY, "DCGM_FI_DEV_GPU_UTIL": float(10 * gpu + node)}
            if (node, gpu) in broken:
                values["DCGM_FI_DEV_XID_ERRORS"] = 79.0
            current += [(labels(host, gpu, name, **rack), value) for name, value in values.items()]
    group_label = "rack" if racks is not None else ""
    return ClusterState(time_s=NOW, gpus=build_gpus(current, seen, NOW, group_label), ok_time_s=NOW)


def test_up_to_256_gpus_the_overview_has_a_cell_per_gpu() -> None:
    state = fleet(GPU_CELLS_UP_TO // 8)
    data = overview_data(state)
    assert len(data["x"]) == 256
    assert list(data["row"][:9]) == ["node-00"] * 8 + ["node-01"]
    assert list(data["x"][:9]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.0]
    assert list(data["label"][:2]) == ["0 %\nmem 50 %", "10 %\nmem 50 %"]


def test_above_256_gpus_the_overview_has_a_cell_per_node_by_worst_gpu_and_mean_utilization() -> None:
    state = fleet(40, broken=((3, 5), (3, 6)), silent=7)
    data = overview_data(state)
    assert len(data["node"]) == 40
    assert list(data["node"]) == [f"node-{n:02d}" for n in range(40)]
    # 25 nodes to a row, each row named by its first node.
    assert NODE_COLUMNS == 25
    assert list(data["row"]) == ["node-00"] * 25 + ["node-25"] * 15
    assert list(data["x"]) == [float(n) for n in range(25)] + [float(n) for n in range(15)]
    # node-03: utilization 3, 13, ... 73 %: mean 38 %; two GPUs critical, the first one's reason named.
    three = 3
    assert data["label"][three] == "38 %"
    assert data["util"][three] == "38 %"
    assert data["fill"][three] == util_color(38.0, True) == LEVEL_PALETTE[int(0.38 * (len(LEVEL_PALETTE) - 1))]
    assert data["outline"][three] == STATUS_COLORS["critical"]
    assert data["health"][three] == "Critical (2 of 8 GPUs not OK; GPU 5: last XID 79: GPU fell off the bus)"
    assert data["gpu"][three] == "8 GPUs"
    assert data["model"][three] == "NVIDIA H100 80GB HBM3"
    assert data["memory"][three] == f"{8 * 40960 * MIB / 2**30:.1f} / {8 * 81479 * MIB / 2**30:.1f} GiB"
    # node-02: all healthy, mean of 2, 12, ... 72 = 37 %.
    assert (data["label"][2], data["outline"][2], data["health"][2]) == ("37 %", STATUS_COLORS["ok"], "OK")
    # node-07 answers nothing now: grey, no data.
    assert (data["label"][7], data["fill"][7], data["util"][7], data["memory"][7]) == (
        "no data", LOST_COLOR, "n/a", "n/a")


def test_the_overview_threshold_can_be_raised() -> None:
    state = fleet(40)
    assert len(overview_data(state, gpu_cells_up_to=10_000)["x"]) == 320


def test_by_node_groups_every_gpu_once_as_node_does() -> None:
    state = fleet(30, gpus=3)
    grouped = state.by_node()
    assert list(grouped) == state.hostnames
    assert all(grouped[host] == state.node(host) for host in state.hostnames)
    rows = node_rows(state)
    assert rows["node"][:2] == ["node-00", "node-01"]
    assert rows["gpus"] == [3] * 30
    assert rows["util"][:2] == ["10 %", "11 %"]


def test_the_overview_query_keeps_only_the_labels_it_reads() -> None:
    families = '__name__=~"' + _either(GAUGES) + '"'
    assert cluster_queries(SeriesScope()).gpus == (
        f'max by (__name__, Hostname, hostname, gpu, UUID, modelName) ({{{families}, GPU_I_ID=""}})')
    scoped = SeriesScope(host_label="node", matchers=('job="nvdash"',))
    assert cluster_queries(scoped).gpus == (
        f'max by (__name__, node, gpu, UUID, modelName) ({{{families}, GPU_I_ID="", job="nvdash"}})')


def test_the_page_shows_node_cells_above_256_gpus_and_a_click_picks_the_node(closed_port: int) -> None:
    cluster = open_cluster(f"http://127.0.0.1:{closed_port}", timeout_s=1.0)
    try:
        doc = Document()
        page = _NodesPage(doc, replace(make_ctx(rows=()), cluster=cluster), cluster)
        page._on_state(fleet(40))
        assert page.overview.title.text == NODE_TITLE
        assert list(page.overview.nodes.factors) == ["node-25", "node-00"]
        assert page.overview.gpus.end == 24.5
        assert page.select.value == "node-00"
        page.overview.source.selected.indices = [27]
        assert page.select.value == "node-27"
        page._on_state(fleet(2))
        assert page.overview.title.text == GPU_TITLE
        assert list(page.overview.nodes.factors) == ["node-01", "node-00"]
        assert page.overview.gpus.end == 7.5
    finally:
        cluster.close()


def test_at_fleet_size_the_page_draws_the_aggregated_nodes_and_asks_for_the_chosen_nodes_gpus(
        closed_port: int) -> None:
    full = fleet(12)
    summarized = replace(full, gpus=(), fleet=True, nodes=tuple(replace(node, detailed=False) for node in full.nodes))
    cluster = open_cluster(f"http://127.0.0.1:{closed_port}", timeout_s=1.0)
    try:
        doc = Document()
        page = _NodesPage(doc, replace(make_ctx(rows=()), cluster=cluster), cluster)
        page._on_state(summarized)
        # 96 GPUs, yet one cell per node: the nodes' numbers are all the page has.
        assert page.overview.title.text == NODE_TITLE
        assert list(page.overview.source.data["node"]) == [f"node-{n:02d}" for n in range(12)]
        assert page.overview.source.data["label"][3] == "38 %"
        assert page.rows.data["gpus"] == [8] * 12
        assert "12 nodes, 96 GPUs" in page.status.text
        assert page.select.value == "node-00"
        assert cluster.poller.wanted_nodes() == ["node-00"]
        assert page.timelines.gpus == ()
        page.overview.source.selected.indices = [5]
        assert cluster.poller.wanted_nodes()[0] == "node-05"
        assert page.holder.children[0].text == "Reading the GPUs of node-05 from Prometheus …"
        # The next refresh brings node-05's GPUs: its timelines are drawn.
        page._on_state(replace(summarized, gpus=full.node("node-05"), generation=2))
        assert [index for index, _uuid in page.timelines.gpus] == list(range(8))
    finally:
        cluster.close()


def rack_of(node: int) -> str:
    """Nodes 0-29 in rack-a, 30-39 in rack-b, 40 and 41 in none."""
    return "rack-a" if node < 30 else "rack-b" if node < 40 else ""


def test_with_a_group_label_each_groups_nodes_have_rows_of_their_own() -> None:
    state = fleet(42, racks=rack_of)
    assert {node.hostname: node.group for node in state.nodes}["node-31"] == "rack-b"
    data = overview_data(state)
    assert list(data["row"]) == ["(none)"] * 2 + ["rack-a"] * 25 + ["rack-a (2)"] * 5 + ["rack-b"] * 10
    assert list(data["node"][:3]) == ["node-40", "node-41", "node-00"]
    assert list(data["x"][:3]) == [0.0, 1.0, 0.0]
    assert data["x"][2 + 25] == 0.0  # node-25 starts rack-a's second row
    assert node_rows(state)["group"][30:32] == ["rack-b", "rack-b"]
    only_b = state.in_group("rack-b")
    assert only_b.hostnames == [f"node-{n}" for n in range(30, 40)]
    assert {gpu.hostname for gpu in only_b.gpus} == set(only_b.hostnames)
    assert state.in_group("") is state
    assert state.groups() == ["rack-a", "rack-b"]


def test_the_page_filters_by_group(closed_port: int) -> None:
    access = PrometheusAccess(scope=SeriesScope(group_label="rack"))
    cluster = open_cluster(f"http://127.0.0.1:{closed_port}", timeout_s=1.0, access=access)
    try:
        doc = Document()
        page = _NodesPage(doc, replace(make_ctx(rows=()), cluster=cluster), cluster)
        state = fleet(42, racks=rack_of)
        page._on_state(state)
        assert page.group in doc.select({"type": type(page.group)})
        assert page.group.options == ["every group", "rack-a", "rack-b"]
        assert len(page.overview.source.data["node"]) == 42
        assert "42 nodes, 336 GPUs" in page.status.text
        page.group.value = "rack-b"
        # 80 GPUs: the group drills down to a cell per GPU.
        assert page.overview.title.text == GPU_TITLE
        assert list(page.overview.source.data["node"]) == [f"node-{n}" for n in range(30, 40) for _gpu in range(8)]
        assert page.rows.data["node"] == [f"node-{n}" for n in range(30, 40)]
        assert page.select.options == [f"node-{n}" for n in range(30, 40)]
        assert page.select.value == "node-30"
        assert "10 nodes, 80 GPUs" in page.status.text
        # A newer state keeps the group chosen.
        page._on_state(replace(state, generation=5))
        assert page.rows.data["node"] == [f"node-{n}" for n in range(30, 40)]
        page.group.value = "every group"
        assert len(page.rows.data["node"]) == 42
    finally:
        cluster.close()


def test_at_fleet_size_a_small_group_has_its_gpus_read_and_a_cell_each(closed_port: int) -> None:
    access = PrometheusAccess(scope=SeriesScope(group_label="rack"))
    cluster = open_cluster(f"http://127.0.0.1:{closed_port}", timeout_s=1.0, access=access)
    try:
        page = _NodesPage(Document(), replace(make_ctx(rows=()), cluster=cluster), cluster)
        full = fleet(42, racks=rack_of)
        summarized = replace(full, gpus=(), fleet=True,
                             nodes=tuple(replace(node, detailed=False) for node in full.nodes))
        page.group.value = "rack-b"
        page._on_state(summarized)
        assert page.overview.title.text == NODE_TITLE
        assert sorted(cluster.poller.wanted_nodes()) == [f"node-{n}" for n in range(30, 40)]
        rack_b = {f"node-{n}" for n in range(30, 40)}
        read = replace(summarized, generation=2, gpus=tuple(gpu for gpu in full.gpus if gpu.hostname in rack_b),
                       nodes=tuple(replace(node, detailed=node.hostname in rack_b) for node in full.nodes))
        page._on_state(read)
        assert page.overview.title.text == GPU_TITLE
        assert len(page.overview.source.data["node"]) == 80
    finally:
        cluster.close()
