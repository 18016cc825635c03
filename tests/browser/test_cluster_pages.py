"""The cluster pages in a real chromium, over a real Prometheus scraping three simulated nodes with their pods."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from tests.browser.chromium import artifact, chromium, open_page
from tests.conftest import wait_for
from tests.prometheus_cluster import NODES, PODS, Cluster, prometheus_cluster, query

pytestmark = pytest.mark.browser

ROWS_JS = """
(name) => {
  const doc = Bokeh.documents[0];
  for (const model of doc._all_models.values()) {
    if (model.type === "ColumnDataSource" && model.data[name] !== undefined) {
      const out = {};
      for (const [key, values] of Object.entries(model.data)) {
        out[key] = Array.from(values);
      }
      if (Object.keys(out).length > 0) return out;
    }
  }
  return null;
}
"""
"""The columns of the first source that has a column ``name`` (what the browser holds)."""

TABLES_JS = """
() => {
  const doc = Bokeh.documents[0];
  const found = [];
  for (const model of doc._all_models.values()) {
    if (model.type === "DataTable") {
      const data = {};
      for (const [key, values] of Object.entries(model.source.data)) data[key] = Array.from(values);
      found.push(data);
    }
  }
  return found;
}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with prometheus_cluster(tmp_path_factory.mktemp("cluster"), central=True, rules=False) as running:
        # Every node scraped, with its pods.
        wait_for(lambda: query(running.url, "count by (Hostname) (nvdash_pod_gpu_allocated)"),
                 lambda rows: len(rows) == len(NODES), timeout_s=90.0)
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def _tables(page: Page) -> list[dict[str, list[object]]]:
    return list(page.evaluate(TABLES_JS))


def test_cluster_nodes_lists_every_node_with_health_and_a_node_timeline(cluster: Cluster, browser: Browser) -> None:
    assert cluster.central is not None
    page, errors = open_page(browser, cluster.central.url + "/Cluster-Nodes?node=node-c&range=30m", 1400, 1100)
    try:
        page.get_by_text("3 nodes, 12 GPUs").wait_for(timeout=60_000)
        nodes = wait_for(lambda: next((t for t in _tables(page) if "problems" in t), {}),
                         lambda table: table.get("node") == ["node-a", "node-b", "node-c"], timeout_s=60.0)
        # node-b's GPU 0 had an XID 48 (a double-bit ECC error): critical, on the node's row.
        health = dict(zip(nodes["node"], nodes["health"], strict=True))
        assert health["node-b"] == "Critical"
        assert "GPU 0:" in str(dict(zip(nodes["node"], nodes["problems"], strict=True))["node-b"])
        assert nodes["gpus"] == [8, 2, 2]
        # /health says what the last refresh held: 12 GPUs, every one read (no aggregation at this size).
        cluster_health = cluster.central.health()["cluster"]
        assert (cluster_health["nodes"], cluster_health["gpus"], cluster_health["aggregated"],
                cluster_health["nodes_read_per_gpu"]) == (3, 12, False, 3)
        assert cluster_health["refresh_ms"] > 0
        cells = page.evaluate(ROWS_JS, "outline")
        assert sorted(zip(cells["node"], cells["gpu"], strict=True)) == sorted(
            [(name, f"GPU {index}") for name, (_a, _e, count) in NODES.items() for index in range(count)])
        # The bookmarked node and range: node-c's two GPUs over the last 30 minutes, read from Prometheus.
        page.get_by_text("last 30 min · 15 s buckets").wait_for(timeout=60_000)
        lines = page.evaluate(ROWS_JS, "temperature_c/0")
        assert set(lines) >= {"time", "temperature_c/0", "temperature_c/1", "utilization_pct/1"}
        temperatures = [value for value in lines["temperature_c/1"] if not math.isnan(value)]
        assert temperatures
        assert all(20.0 <= value <= 95.0 for value in temperatures)
        page.screenshot(path=str(artifact("cluster-nodes.png")), full_page=True)
        # Choosing another node keeps it in the URL.
        page.locator("select").first.select_option("node-a")
        wait_for(lambda: page.url, lambda url: "node=node-a" in url, timeout_s=30.0)
        wait_for(lambda: page.evaluate(ROWS_JS, "temperature_c/7"), lambda found: found is not None, timeout_s=60.0)
    finally:
        page.close()
    assert errors == []


def test_cluster_pods_lists_pods_idle_allocations_and_namespace_totals(cluster: Cluster, browser: Browser) -> None:
    assert cluster.central is not None
    page, errors = open_page(browser, cluster.central.url + "/Cluster-Pods", 1400, 1100)
    try:
        page.get_by_text("6 pods hold 9 GPU devices on 3 nodes").wait_for(timeout=60_000)
        tables = wait_for(lambda: _tables(page), lambda found: len(found) == 3 and len(found[0].get("pod", [])) == 9,
                          timeout_s=60.0)
        pods, idle, namespaces = tables
        # Nine allocations: train-llm's four GPUs, one each for the rest.
        assert sorted({(ns, pod) for ns, pod in zip(pods["namespace"], pods["pod"], strict=True)}) == sorted(PODS)
        assert {(pod, node) for pod, node in zip(pods["pod"], pods["node"], strict=True)} == {
            (pod, node) for (_ns, pod), node in PODS.items()}
        kinds = dict(zip(pods["pod"], pods["kind"], strict=True))
        assert kinds == {"train-llm": "whole GPU", "notebook": "whole GPU", "server-a": "time-sliced",
                         "server-b": "time-sliced", "mig-train": "MIG instance",
                         "mig-idle": "MIG instance"}
        assert sorted(idle["pod"]) == ["mig-idle", "notebook"]
        # GPUs held: 4 + 1 whole ones; two halves of one shared GPU; 3/7 + 1/7 of a MIG GPU.
        held = dict(zip(namespaces["namespace"], namespaces["share"], strict=True))
        assert held == {"batch": "0.57", "inference": "1.00", "research": "5.00"}
        assert dict(zip(namespaces["namespace"], namespaces["pods"], strict=True)) == {
            "batch": 2, "inference": 2, "research": 2}
        page.screenshot(path=str(artifact("cluster-pods.png")), full_page=True)
        # Only MIG instances.
        page.locator("select").first.select_option(label="MIG instance")
        wait_for(lambda: _tables(page)[0]["pod"], lambda names: sorted(names) == ["mig-idle", "mig-train"],
                 timeout_s=30.0)
    finally:
        page.close()
    assert errors == []
