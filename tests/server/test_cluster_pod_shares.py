"""Per-pod shares from a real node through a real Prometheus to the Cluster Pods page.

One nvdash node simulates a time-sliced GPU 0 (``timesliced``) whose replicas ``::0``-``::2`` the real kubelet
pod-resources server allocates to three pods, each a real process in its kubelet-named cgroup doing 50 %, 30 % and
10 % of the GPU's work. A real Prometheus scrapes the node every second; a second nvdash with ``--prometheus`` shows
``/Cluster-Pods``. Nothing is backfilled: the exporter's names and labels, the cluster model's queries and the
pod timeline's range queries must agree for the page to show the pods and their shares.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from bokeh.client import pull_session
from bokeh.models import ColumnDataSource, DataTable

from nvdash.cluster.model import ClusterPod
from nvdash.cluster.poller import ClusterPoller
from nvdash.cluster.promapi import PrometheusClient
from tests.conftest import get_json, nvdash_server, wait_for
from tests.prometheus_cluster import query, run_prometheus
from tests.server.bokeh_viewer import receive_until
from tests.server.kubelet_pods import sleeping
from tests.server.test_shares_e2e import MEMORY_MIB, NAMESPACE, PODS, SM_SHARES, TIMESLICED_GPU0, timesliced_server

MIB = 1 << 20
HOSTNAME = "node-ts"
CHOSEN = "alpha"
WINDOW_MARGIN_S = 10.0
"""Readings this long before a timeline point's window still count as current in it: the reading a scrape saw at the
window's start was made up to one process interval (2 s) earlier, polled up to a few polls late on a loaded machine."""


@dataclass
class NodeReadings:
    """Every distinct process reading of the node, polled on a thread: time -> pod -> (SM share 0-1, memory bytes)."""

    url: str
    found: dict[float, dict[str, tuple[float, int]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        while not self.stop.wait(0.1):
            document = get_json(self.url + "/api/processes.json")
            unit = next((u for u in document["shares"] if u["unit"] == TIMESLICED_GPU0), None)
            if unit is None or document["time_s"] is None:
                continue
            pods = {o["pod"]: (o["sm_pct"] / 100.0, o["memory_bytes"]) for o in unit["owners"]
                    if o["kind"] == "pod" and o["sm_pct"] is not None}
            if set(pods) == set(PODS):
                with self.lock:
                    self.found.setdefault(document["time_s"], pods)

    def snapshot(self) -> dict[float, dict[str, tuple[float, int]]]:
        with self.lock:
            return dict(self.found)


@pytest.fixture
def node_and_view(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, NodeReadings]]:
    """(Prometheus's URL, the cluster view's URL, the node's readings as they come)."""
    with sleeping(len(PODS)) as children, \
            timesliced_server(tmp_path, tmp_path_factory, children, ["--metrics-pods", "--hostname", HOSTNAME]) as node:
        readings = NodeReadings(node.url)
        poller = threading.Thread(target=readings.run, daemon=True, name="node-readings")
        poller.start()
        try:
            scraped = [f"127.0.0.1:{node.port}"]
            with run_prometheus(tmp_path_factory.mktemp("prometheus"), scraped, rules=False) as url, \
                    nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url]) as view:
                yield url, view.url, readings
        finally:
            readings.stop.set()
            poller.join(10)


def pods_table(tables: list[DataTable]) -> dict[str, list[Any]]:
    """The "GPU use per pod" table's rows (the idle table, with the same columns, is empty here)."""
    filled = [dict(table.source.data) for table in tables if "node" in table.source.data and table.source.data["pod"]]
    return filled[0] if len(filled) == 1 else {}


def test_cluster_pods_shows_each_time_sliced_pods_own_share_from_a_real_prometheus(
    node_and_view: tuple[str, str, NodeReadings]
) -> None:
    prometheus, view, readings = node_and_view
    # The chosen pod's share scraped a few times, so the timeline's newest point holds several scrapes.
    try:
        wait_for(lambda: query(prometheus, f'count_over_time(nvdash_pod_gpu_sm_share_ratio{{pod="{CHOSEN}"}}[1m])'),
                 lambda rows: bool(rows) and float(rows[0]["value"][1]) >= 5, timeout_s=90.0)
    except AssertionError:
        print(get_json(prometheus + "/api/v1/targets"))
        raise

    # The cluster model's rows for the three pods: kind time-sliced, their own SM share and memory, which are
    # exactly what the node reported in one of its readings (Prometheus holds the reading current at a scrape).
    client = PrometheusClient(prometheus)
    model = ClusterPoller(client)

    def model_pods() -> dict[str, ClusterPod]:
        return {pod.pod: pod for pod in model.refresh().pods if pod.namespace == NAMESPACE}

    def agrees(pods: dict[str, ClusterPod]) -> bool:
        if set(pods) != set(PODS):
            return False
        seen = readings.snapshot().values()
        return any(all(pods[name].sm_share_pct is not None
                       and math.isclose(pods[name].sm_share_pct / 100.0, reading[name][0], abs_tol=1e-9)
                       for name in PODS) for reading in seen)

    pods = wait_for(model_pods, agrees, timeout_s=60.0)
    for name, mib in zip(PODS, MEMORY_MIB, strict=True):
        pod = pods[name]
        assert (pod.hostname, pod.sharing, pod.gpu, pod.uuid, pod.container) == (
            HOSTNAME, "shared", 0, TIMESLICED_GPU0, "main")
        assert pod.pod_memory_bytes == mib * MIB
        assert pod.sm_share_pct is not None
        assert pod.utilization_pct is not None
        assert 0 < pod.sm_share_pct <= pod.utilization_pct
    # The shares keep the pods' 5:3:1 (each a whole percent per sample, hence the tolerance).
    alpha = pods["alpha"].sm_share_pct
    assert alpha is not None
    for name, share in zip(PODS, SM_SHARES, strict=True):
        own = pods[name].sm_share_pct
        assert own is not None
        assert own / alpha == pytest.approx(share / SM_SHARES[0], abs=0.05 + 1.0 / alpha), name

    # The page: every pod's row, time-sliced, each holding a third of GPU 0.
    everyone = pull_session(url=view + "/Cluster-Pods")
    try:
        tables = list(everyone.document.select({"type": DataTable}))
        receive_until(everyone, lambda: sorted(pods_table(tables).get("pod", [])) == sorted(PODS), timeout_s=60.0)
        rows = pods_table(tables)
        assert set(zip(rows["node"], rows["namespace"], rows["container"], rows["device"], rows["kind"],
                       rows["share"], strict=True)) == {(HOSTNAME, NAMESPACE, "main", "GPU 0", "time-sliced", "0.33")}
    finally:
        everyone.close()

    # The page opened on the chosen pod's URL: its row alone, and its SM-share timeline over 30 min.
    session = pull_session(url=view + "/Cluster-Pods",
                           arguments={"namespace": NAMESPACE, "pod": CHOSEN, "range": "30m"})
    try:
        document = session.document
        tables = list(document.select({"type": DataTable}))
        receive_until(session, lambda: pods_table(tables).get("pod") == [CHOSEN], timeout_s=60.0)
        row = pods_table(tables)
        assert (row["node"], row["namespace"], row["container"], row["device"], row["kind"]) == (
            [HOSTNAME], [NAMESPACE], ["main"], ["GPU 0"], ["time-sliced"])
        assert row["share"] == ["0.33"]  # one of three replicas of GPU 0

        timeline = document.select_one({"name": "pod-timeline"})
        assert isinstance(timeline, ColumnDataSource)

        def latest() -> tuple[float, float] | None:
            """The newest drawn point (its time in ms, its SM share in GPUs), once there is one."""
            points = [(t, v) for t, v in zip(timeline.data.get("time", []), timeline.data.get("sm_gpus", []),
                                                      strict=True) if not math.isnan(v)]
            return points[-1] if points else None

        receive_until(session, lambda: latest() is not None, timeout_s=60.0)
        times = list(timeline.data["time"])
        step_s = (times[1] - times[0]) / 1000.0
        point = latest()
        assert point is not None
        start_ms, value = point
        start_s = start_ms / 1000.0
        # A point at start_s summarises the minute before start_s + step (the pod's one series' mean over it): its
        # value lies between the lowest and highest share the node reported for the pod in that minute.
        end_s = start_s + step_s
        seen = {t: pods_now[CHOSEN][0] for t, pods_now in readings.snapshot().items()
                if end_s - 60.0 - WINDOW_MARGIN_S <= t <= end_s}
        print(f"{CHOSEN}: timeline point {value:.4f} GPU at {start_s:.0f}+{step_s:.0f} s, node's shares in its "
              f"window {min(seen.values()):.4f}-{max(seen.values()):.4f} over {len(seen)} readings")
        assert min(seen.values()) - 1e-9 <= value <= max(seen.values()) + 1e-9
        assert value > 0
        # The pod's memory is constant: its mean is exact.
        memory = timeline.data["memory_bytes"][times.index(start_ms)]
        assert memory == MEMORY_MIB[PODS.index(CHOSEN)] * MIB
    finally:
        session.close()
