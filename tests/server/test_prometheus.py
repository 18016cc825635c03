"""A real Prometheus (Debian's package) scraping three simulated nvdash nodes, with nvdash's alert rules loaded."""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.cluster.history import PrometheusHistory
from nvdash.cluster.model import ClusterState, GpuClass
from nvdash.cluster.poller import ClusterPoller
from nvdash.cluster.promapi import PrometheusClient, PrometheusError
from nvdash.health.status import Status
from tests.conftest import NvdashServer, get_json, http_get, wait_for
from tests.grafana_queries import dashboard_queries, dashboard_variables, load, substitute
from tests.prometheus_cluster import IDLE_PODS, NODES, firing_alerts, prometheus_cluster, query

NODE_FAMILIES = {"nvdash_last_sample_timestamp_seconds", "nvdash_last_process_sample_timestamp_seconds"}
"""The node's own series (when it last read), which belong to no GPU."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, NvdashServer]]]:
    with prometheus_cluster(tmp_path_factory.mktemp("prometheus")) as running:
        yield running.url, running.nodes


def test_every_node_and_gpu_is_scraped(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster
    # Every GPU reads its temperature (a GPU in MIG mode has no utilization of its own).
    result = wait_for(lambda: query(url, "count by (Hostname) (group by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP))"),
                      lambda rows: len(rows) == 3, timeout_s=90.0)
    counts = {row["metric"]["Hostname"]: int(row["value"][1]) for row in result}
    assert counts == {name: count for name, (_args, _env, count) in NODES.items()}


def test_every_exported_family_is_queryable_with_its_labels(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, servers = cluster
    for name, server in servers.items():
        status, text, _ = http_get(server.url + "/metrics")
        assert status == 200
        parsed = {family.name: family for family in parse_text(text) if family.samples}
        assert parsed
        # The parser names a counter family without its "_total"; Prometheus stores what the exposition wrote.
        exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
        families = {name + "_total" if name + "_total" in exposed else name: family for name, family in parsed.items()}
        for family_name, family in families.items():
            rows = wait_for(lambda n=family_name, h=name: query(url, f'{n}{{Hostname="{h}"}}'),
                            lambda rows: len(rows) > 0, timeout_s=60.0)
            labels = rows[0]["metric"]
            assert labels["__name__"] == family_name
            if family_name in NODE_FAMILIES:
                assert {"Hostname", "instance", "job"} <= set(labels)
                assert "gpu" not in labels
            else:
                gpu_labels = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "instance", "job"}
                assert gpu_labels <= set(labels)
            assert labels["job"] == "nvdash"
            assert len(rows) == len(family.samples), family_name


def test_grafana_12239_queries_give_one_series_per_gpu(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster
    for promql in ('max(DCGM_FI_DEV_GPU_TEMP{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, uuid)',
                   'max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, uuid)',
                   'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"node-a", gpu=~".*"} * 1000000) by (Hostname, UUID, gpu)',
                   'max(DCGM_FI_DEV_FB_USED{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, GPU_I_ID, '
                   'GPU_I_PROFILE)',
                   'max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, '
                   'GPU_I_ID, GPU_I_PROFILE)'):
        rows = wait_for(lambda q=promql: query(url, q), lambda rows: len(rows) == 8, timeout_s=60.0)
        assert sorted(int(row["metric"]["gpu"]) for row in rows) == list(range(8)), promql
    values = {row["metric"]["gpu"]: float(row["value"][1]) for row in query(
        url, 'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"node-a"} * 1000000) by (Hostname, UUID, gpu)')}
    assert all(1e8 < value <= 1980e6 for value in values.values())  # Hz: the H100's SM clock tops out at 1980 MHz


def test_an_injected_xid_fires_the_xid_rules(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster

    alerts = wait_for(lambda: firing_alerts(url), lambda found: {a["labels"]["alertname"] for a in found}
                      >= {"NvdashGpuXidError", "NvdashGpuCriticalXid"}, timeout_s=90.0)
    critical = [alert for alert in alerts if alert["labels"]["alertname"] == "NvdashGpuCriticalXid"]
    # One alert per pod sharing the GPU (each series carries its pod, as dcgm-exporter's pod mapper writes them).
    assert {(a["labels"]["Hostname"], a["labels"]["gpu"], a["labels"]["err_code"]) for a in critical} == {
        ("node-b", "0", "48")}
    assert sorted(a["labels"].get("pod") for a in critical) == ["server-a", "server-b"]
    assert critical[0]["labels"]["severity"] == "critical"
    assert "node-b" in critical[0]["annotations"]["summary"] or "node-b" in critical[0]["annotations"]["description"]
    # Nothing fires on the nodes without an XID.
    assert {a["labels"].get("Hostname") for a in alerts if "Xid" in a["labels"]["alertname"]} == {"node-b"}


def test_the_cluster_state_from_prometheus(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, servers = cluster
    poller = ClusterPoller(PrometheusClient(url))
    state = wait_for(poller.refresh, lambda found: len(found.gpus) == 12 and len(found.pods) == 9, timeout_s=90.0)
    assert state.error is None
    assert state.hostnames == ["node-a", "node-b", "node-c"]
    # Each GPU as its node's /info.json lists it.
    for name, server in servers.items():
        info = get_json(server.url + "/info.json")["gpus"]
        assert [(gpu.index, gpu.uuid, gpu.model) for gpu in state.node(name)] == [
            (gpu["index"], gpu["uuid"], gpu["name"]) for gpu in info]
    xid = state.node("node-b")[0].health
    assert xid.status is Status.CRITICAL
    assert any(finding.text.startswith("last XID 48:") for finding in xid.findings)
    assert {(pod.namespace, pod.pod) for pod in state.pods if pod.idle} == IDLE_PODS
    assert {(pod.namespace, pod.pod): pod.sharing for pod in state.pods} == {
        ("research", "train-llm"): "whole", ("research", "notebook"): "whole", ("inference", "server-a"): "shared",
        ("inference", "server-b"): "shared", ("batch", "mig-train"): "mig", ("batch", "mig-idle"): "mig"}
    mig = next(pod for pod in state.pods if pod.pod == "mig-train")
    assert mig.mig_profile == "3g.20gb"
    assert mig.memory_used_bytes is not None
    assert mig.memory_used_bytes > 1024 * 1024 * 1024


def test_the_nodes_aggregated_in_promql_agree_with_every_gpus_readings(
        cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    """The fleet-size path (nodes from aggregations, each node's own verdict) over real nodes: the same GPUs by class
    as every GPU's readings judged here, node-b's XID read GPU by GPU."""
    url, _servers = cluster
    client = PrometheusClient(url)
    every_gpu = ClusterPoller(client, fleet_from_gpus=10**9)
    aggregated = ClusterPoller(client, fleet_from_gpus=0)

    def tallies(state: ClusterState) -> list[tuple[object, ...]]:
        return [(node.hostname, dict(node.counts), node.models, node.xid_now) for node in state.nodes]

    def both() -> tuple[ClusterState, ClusterState]:
        return aggregated.refresh(), every_gpu.refresh()

    fleet, baseline = wait_for(both, lambda found: found[0].gpu_count == 12 and tallies(found[0]) == tallies(found[1]),
                               timeout_s=90.0)
    assert fleet.fleet
    assert not baseline.fleet
    assert fleet.error is None
    assert "node-b" in {gpu.hostname for gpu in fleet.gpus}
    assert next(node for node in fleet.nodes if node.hostname == "node-b").worst is GpuClass.CRITICAL


def test_a_node_history_from_prometheus_matches_its_readings(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster
    client = PrometheusClient(url)
    history = PrometheusHistory(client, "node-a")
    wait_for(lambda: query(url, 'count_over_time(DCGM_FI_DEV_FB_USED{Hostname="node-a", gpu="0"}[5m])'),
             lambda rows: bool(rows) and float(rows[0]["value"][1]) >= 10, timeout_s=60.0)
    end = time.time()
    result = history.query(["utilization_pct", "memory_used_bytes"], end - 600, end, step_s=15.0)
    assert sorted(result.series["utilization_pct"]) == list(range(8))
    assert result.step_s == 15.0
    memory = result.series["memory_used_bytes"][0]
    known = memory.mean[~np.isnan(memory.mean)]
    assert len(known) >= 1
    # Bytes, from dcgm-exporter's MiB: an 80 GB H100 holds at most 81,559 MiB.
    assert (known > 0).all()
    assert (known <= 81_559 * 1024 * 1024).all()
    assert (memory.minimum[~np.isnan(memory.mean)] <= known).all()
    util = result.series["utilization_pct"][3].mean
    assert ((util[~np.isnan(util)] >= 0) & (util[~np.isnan(util)] <= 100)).all()
    # Only the GPUs asked for.
    assert sorted(history.query(["power_w"], end - 300, end, gpus=[2, 5]).series["power_w"]) == [2, 5]


def test_prometheus_refusals_are_one_line(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, servers = cluster
    with pytest.raises(PrometheusError) as refused:
        PrometheusClient(url).instant("sum(")
    assert str(refused.value).startswith(f"Prometheus at {url} refused the query: bad_data: ")
    assert "\n" not in str(refused.value)
    not_prometheus = servers["node-c"].url
    with pytest.raises(PrometheusError) as wrong:
        PrometheusClient(not_prometheus).instant("up")
    assert str(wrong.value) == f"Prometheus at {not_prometheus} refused the query: HTTP 404 Not Found"


def test_every_grafana_dashboard_query_answers_with_series(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster
    queries = dashboard_queries()
    assert len(queries) >= 40
    for title, promql in queries:
        if "nvdash_process_" in promql:
            # Per-process families need --metrics-processes, which these nodes do not run: the query still parses.
            assert query(url, promql) == [], title
            continue
        rows = wait_for(lambda q=promql: query(url, q), lambda found: len(found) > 0, timeout_s=60.0)
        assert all(row["value"][1] not in ("NaN", "+Inf", "-Inf") for row in rows), (title, promql, rows[:3])


def variable_values(url: str, definition: str, values: dict[str, str]) -> list[str]:
    """What Grafana lists for a ``label_values(selector, label)`` variable: Prometheus's label values API, the
    selector's variables filled in."""
    match = re.fullmatch(r"label_values\((?P<selector>.*), (?P<label>\w+)\)", definition)
    assert match is not None, definition
    selector = urllib.parse.quote(substitute(match["selector"], values))
    return list(get_json(f"{url}/api/v1/label/{match['label']}/values?match[]={selector}")["data"])


def test_the_dashboard_variables_list_the_nodes_and_narrow_each_other(
        cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    """The variables chain on a real Prometheus: no cluster label (nothing to list, All still selects every node),
    the job, each node's instance; one instance chosen, the node and GPU lists narrow to that node's."""
    url, servers = cluster
    dashboard = load()
    definitions = {variable["name"]: variable["definition"] for variable in dashboard["templating"]["list"]
                   if "definition" in variable}
    every = dict.fromkeys(dashboard_variables(dashboard), ".*")
    hosts = wait_for(lambda: variable_values(url, definitions["Hostname"], every),
                     lambda found: len(found) == len(NODES), timeout_s=90.0)
    assert sorted(hosts) == sorted(NODES)
    assert variable_values(url, definitions["cluster"], every) == []
    (job,) = variable_values(url, definitions["job"], every)
    instances = variable_values(url, definitions["instance"], every)
    assert len(instances) == len(servers)
    for name, (_args, _env, count) in NODES.items():
        instance = f"127.0.0.1:{servers[name].port}"
        assert instance in instances
        # Grafana escapes a chosen value's regex characters for PromQL: 127\\.0\\.0\\.1 in the query text.
        chosen = {**every, "job": job, "instance": instance.replace(".", "\\\\.")}
        assert variable_values(url, definitions["Hostname"], chosen) == [name]
        assert sorted(variable_values(url, definitions["gpu"], chosen), key=int) == [str(gpu) for gpu in range(count)]


def test_every_alert_rule_evaluates_without_error(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    """Prometheus evaluates each rule of nvdash-alerts.yml on the nodes' series without an error (a many-to-many
    match, a bad offset); none of the rules that catch silence fires on a healthy cluster."""
    url, _servers = cluster

    def rules() -> list[dict[str, object]]:
        groups = get_json(url + "/api/v1/rules")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    evaluated = wait_for(rules, lambda found: bool(found) and all(
        not str(rule.get("lastEvaluation", "")).startswith("0001") for rule in found), timeout_s=60.0)
    assert {str(rule["name"]): rule["health"] for rule in evaluated} == dict.fromkeys(
        (str(rule["name"]) for rule in evaluated), "ok"), [rule.get("lastError") for rule in evaluated]
    silent = {"NvdashNodeGpuCountDropped", "NvdashNodeAbsent", "NvdashSamplerStale", "NvdashTargetDown",
              "NvdashGpuRetiredPagesPending"}
    assert silent <= {str(rule["name"]) for rule in evaluated}
    assert not [alert for alert in firing_alerts(url) if alert["labels"]["alertname"] in silent]
