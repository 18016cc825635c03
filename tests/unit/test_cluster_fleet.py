"""The fleet's tallies and rows from the cluster model's per-GPU judgement and the day's answers, with exact counts;
the day's queries aggregate by host within the series scope; the page builds over both."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bokeh.document import Document
from bokeh.models import ColumnDataSource
from bokeh.models.widgets import DataTable, Div, Select

from nvdash.apps import cluster_fleet
from nvdash.cluster.fleet import FleetDay, NodeRow, fleet_queries, fleet_view, per_host
from nvdash.cluster.model import ClusterState, GpuClass, build_gpus
from nvdash.cluster.selectors import SeriesScope

NOW = 1_800_000_000.0
HEALTHY = {"DCGM_FI_DEV_GPU_TEMP": 50.0, "DCGM_FI_DEV_GPU_UTIL": 40.0, "DCGM_FI_DEV_FB_USED": 1000.0,
           "DCGM_FI_DEV_FB_FREE": 79000.0, "DCGM_FI_DEV_XID_ERRORS": 0.0}


def samples(host: str, gpu: int, values: Mapping[str, float]) -> list[tuple[dict[str, str], float]]:
    labels = {"Hostname": host, "gpu": str(gpu), "UUID": f"GPU-{host}-{gpu}", "modelName": "NVIDIA H100"}
    return [({**labels, "__name__": name}, value) for name, value in values.items()]


def state() -> ClusterState:
    """ok-1: 8 healthy; warn-1: GPU 2 hot; xid-1: GPU 0's last XID 48 (critical); lost-1: GPU 1 fell off the bus,
    GPU 3 silent; silent-1: both GPUs seen in the last hour, silent now."""
    current: list[tuple[dict[str, str], float]] = []
    for gpu in range(8):
        current += samples("ok-1", gpu, HEALTHY)
    for gpu in range(4):
        current += samples("warn-1", gpu, {**HEALTHY, "DCGM_FI_DEV_GPU_TEMP": 88.0 if gpu == 2 else 50.0,
                                           "DCGM_FI_DEV_SLOWDOWN_TEMP": 90.0})
    for gpu in range(2):
        current += samples("xid-1", gpu, {**HEALTHY, "DCGM_FI_DEV_XID_ERRORS": 48.0 if gpu == 0 else 0.0})
    for gpu in (0, 2):
        current += samples("lost-1", gpu, HEALTHY)
    current += samples("lost-1", 1, {"nvdash_gpu_lost": 1.0})
    seen = [labels for host, gpu in [("lost-1", 3), ("silent-1", 0), ("silent-1", 1)]
            for labels, _value in samples(host, gpu, {"DCGM_FI_DEV_GPU_TEMP": 0.0})]
    gpus = build_gpus(current, seen, NOW)
    return ClusterState(time_s=NOW, gpus=gpus, ok_time_s=NOW, generation=1)


def test_every_gpu_and_node_is_counted_once_by_its_worst_class() -> None:
    day = FleetDay(xids={"xid-1": 1}, xid_gpus={"xid-1": 1},
                   gpus_now={"ok-1": 8, "warn-1": 4, "xid-1": 2, "lost-1": 2},
                   gpus_day_ago={"ok-1": 8, "warn-1": 4, "xid-1": 2, "lost-1": 4, "silent-1": 2, "gone-1": 8},
                   ok_time_s=NOW, generation=1)
    view = fleet_view(state(), day)
    assert view.gpus == {GpuClass.OK: 8 + 3 + 1 + 2, GpuClass.WARNING: 1, GpuClass.CRITICAL: 1, GpuClass.LOST: 1,
                         GpuClass.NOT_REPORTING: 1 + 2}
    # gone-1 was there a day ago, silent for over an hour: a node not reporting, with no GPU in the tallies.
    assert view.nodes == {GpuClass.OK: 1, GpuClass.WARNING: 1, GpuClass.CRITICAL: 1, GpuClass.LOST: 1,
                          GpuClass.NOT_REPORTING: 2}
    assert [row.node for row in view.rows] == ["lost-1", "xid-1", "gone-1", "silent-1", "warn-1", "ok-1"]
    lost, xid, gone, silent, warn, ok = view.rows
    assert (lost.worst, lost.counts[GpuClass.OK], lost.counts[GpuClass.LOST], lost.counts[GpuClass.NOT_REPORTING],
            lost.gpus, lost.dropped) == (GpuClass.LOST, 2, 1, 1, 4, 2)
    assert (xid.worst, xid.xids, xid.xid_gpus, xid.xid_now, xid.dropped) == (GpuClass.CRITICAL, 1, 1, 1, 0)
    assert "GPU 0: last XID 48" in xid.problems
    assert (gone.worst, gone.gpus, gone.gpus_now, gone.gpus_day_ago, gone.dropped) == (
        GpuClass.NOT_REPORTING, 0, 0, 8, 8)
    assert (silent.worst, silent.gpus, silent.dropped) == (GpuClass.NOT_REPORTING, 2, 2)
    assert (warn.worst, warn.counts[GpuClass.WARNING], warn.counts[GpuClass.OK]) == (GpuClass.WARNING, 1, 3)
    assert "GPU 2: 88 °C" in warn.problems
    assert (ok.worst, ok.gpus, ok.dropped, ok.problems) == (GpuClass.OK, 8, 0, "")
    assert (view.dropped_nodes, view.xid_nodes) == (3, 1)


def test_the_worst_offenders_come_first_within_a_class() -> None:
    ok = dict.fromkeys(GpuClass, 0) | {GpuClass.OK: 8}
    rows = [NodeRow("a", GpuClass.OK, ok), NodeRow("b", GpuClass.OK, ok, xids=3),
            NodeRow("c", GpuClass.OK, ok, gpus_now=8, gpus_day_ago=9), NodeRow("d", GpuClass.WARNING, ok)]
    assert [row.node for row in sorted(rows, key=NodeRow.sort_key)] == ["d", "c", "b", "a"]


def test_before_the_days_answer_nothing_counts_as_dropped() -> None:
    view = fleet_view(state(), FleetDay())
    assert all(row.gpus_now is None and row.dropped == 0 for row in view.rows)
    assert view.nodes[GpuClass.NOT_REPORTING] == 1


def test_the_days_queries_aggregate_by_host_within_the_scope() -> None:
    queries = fleet_queries(SeriesScope(matchers=('job="nvdash"',)))
    assert queries.xids == ('count by (Hostname, hostname) (count by (Hostname, hostname, UUID, err_code) ('
                            '(max_over_time(DCGM_FI_DEV_XID_ERRORS{job="nvdash"}[24h]) '
                            'or max_over_time(DCGM_FI_DEV_XID_ERROR{job="nvdash"}[24h])) > 0))')
    assert queries.gpus_day_ago == (
        'count by (Hostname, hostname) (count by (Hostname, hostname, UUID) ('
        'last_over_time(DCGM_FI_DEV_GPU_TEMP{job="nvdash"}[15m] offset 1d) '
        'or last_over_time(DCGM_FI_DEV_GPU_TEMP_CELSIUS{job="nvdash"}[15m] offset 1d)))')
    custom = fleet_queries(SeriesScope(host_label="node"))
    assert custom.gpus_now.startswith("count by (node) (count by (node, UUID) (DCGM_FI_DEV_GPU_TEMP")
    assert per_host([({"Hostname": "a"}, 2.0), ({"hostname": "a"}, 1.0), ({"node": "x"}, 5.0)], SeriesScope()) == {
        "a": 3}
    assert per_host([({"node": "x"}, 5.0), ({"Hostname": "a"}, 1.0)], SeriesScope(host_label="node")) == {"x": 5}


def test_rows_link_to_the_node_page_relative_to_the_fleet_page() -> None:
    view = fleet_view(state(), FleetDay(gpus_day_ago={"a b/c": 1}, ok_time_s=NOW))
    data = cluster_fleet.table_data(view)
    assert data["node"][:2] == ["lost-1", "xid-1"]
    assert data["link"][:2] == ["Cluster-Nodes?node=lost-1", "Cluster-Nodes?node=xid-1"]
    assert "Cluster-Nodes?node=a%20b%2Fc" in data["link"]
    assert (data["lost"][0], data["dropped"][0], data["gpus_now"][0]) == (1, 0, "0")
    html = cluster_fleet.summary_html(view, dark=False)
    assert "<b>6 nodes</b>" in html
    assert "<b>20 GPUs</b>" in html


def test_the_page_shows_the_pollers_answers(closed_port: int) -> None:
    from dataclasses import replace

    from nvdash.cluster import open_cluster
    from tests.unit.test_apps import make_ctx

    cluster = open_cluster(f"http://127.0.0.1:{closed_port}", timeout_s=1.0)
    try:
        assert cluster.fleet is not None
        cluster.poller._state = state()
        cluster.fleet.refresh()  # Prometheus down: the day's line says so, the tallies still show
        doc = Document()
        cluster_fleet.build(doc, replace(make_ctx(rows=()), cluster=cluster))
        assert doc.title == "Fleet Health"
        text = " ".join(str(model.text) for model in doc.models if isinstance(model, Div))
        assert "XIDs and GPU counts of the last 24h not available:" in text
        assert "Connection refused" in text
        (table,) = [model for model in doc.models if isinstance(model, DataTable)]
        source = table.source
        assert isinstance(source, ColumnDataSource)
        assert source.data["node"] == ["lost-1", "xid-1", "silent-1", "warn-1", "ok-1"]
    finally:
        cluster.close()


def test_the_days_round_keeps_its_last_answer_and_says_why_it_failed() -> None:
    from nvdash.cluster.fleet_poller import FleetPoller
    from nvdash.cluster.promapi import PrometheusClient
    from tests.unit.rogue_prometheus import Behaviour, rogue_prometheus, vector

    with rogue_prometheus() as (url, rogue):
        rogue.behaviour = Behaviour(raw=vector({"metric": {"Hostname": "node-a"}, "value": [NOW, "3"]}))
        poller = FleetPoller(PrometheusClient(url, timeout_s=2.0), clock=lambda: NOW)
        good = poller.refresh()
        assert rogue.requests == 1 + 4  # whether the recording rules cover the day, then one query each
        assert (good.xids, good.gpus_day_ago, good.error, good.ok_time_s) == ({"node-a": 3}, {"node-a": 3}, None, NOW)
        assert good.recorded  # the presence query answered a series: the rules have recorded for the whole day
        assert cluster_fleet.day_html(poller, good).endswith(" · from the recording rules")
        assert "from the raw series (load nvdash-recording-rules.yml" in cluster_fleet.day_html(
            poller, dataclasses.replace(good, recorded=False))
        rogue.behaviour = Behaviour(raw=vector(1, 2))
        failed = poller.refresh()
    assert failed.error == f"Prometheus at {url} answered a malformed result: result[0] is 1, not a series object"
    assert (failed.xids, failed.ok_time_s, failed.generation) == ({"node-a": 3}, NOW, 2)
    line = cluster_fleet.day_html(poller, failed)
    assert "not available:</b> Prometheus at" in line
    assert "last answer" in line


def test_with_a_group_label_the_page_shows_the_group_and_filters_by_it(closed_port: int) -> None:
    from dataclasses import replace

    from nvdash.cluster import open_cluster
    from nvdash.cluster.access import PrometheusAccess
    from tests.unit.test_apps import make_ctx

    access = PrometheusAccess(scope=SeriesScope(group_label="rack"))
    cluster = open_cluster(f"http://127.0.0.1:{closed_port}", timeout_s=1.0, access=access)
    try:
        assert cluster.fleet is not None
        racks = {"ok-1": "rack-a", "warn-1": "rack-a", "xid-1": "rack-b", "lost-1": "rack-b", "silent-1": "rack-b"}
        every = state()
        cluster.poller._state = replace(every, nodes=tuple(replace(node, group=racks[node.hostname])
                                                           for node in every.nodes))
        cluster.fleet._day = FleetDay(gpus_day_ago={"gone-1": 8}, ok_time_s=NOW, generation=1)
        doc = Document()
        cluster_fleet.build(doc, replace(make_ctx(rows=()), cluster=cluster))
        (table,) = [model for model in doc.models if isinstance(model, DataTable)]
        source = table.source
        assert isinstance(source, ColumnDataSource)
        assert "rack" in [column.title for column in table.columns]
        assert source.data["node"] == ["lost-1", "xid-1", "gone-1", "silent-1", "warn-1", "ok-1"]
        assert source.data["group"] == ["rack-b", "rack-b", "", "rack-b", "rack-a", "rack-a"]
        (menu,) = [model for model in doc.models if isinstance(model, Select)]
        assert menu.options == ["every group", "rack-a", "rack-b"]
        menu.value = "rack-a"
        assert source.data["node"] == ["warn-1", "ok-1"]
        summary = " ".join(str(model.text) for model in doc.models if isinstance(model, Div))
        assert "<b>2 nodes</b>" in summary
        assert "<b>12 GPUs</b>" in summary
    finally:
        cluster.close()
