"""/Cluster-Pods on a single node without Prometheus: offered because the node keeps a history, its pods from the
node itself (a real kubelet gRPC server allocating MIG instances of the simulated ``h100-mig``), and a pod's timeline
read from the history's pod shares, equal to the pod's shares that ``/api/processes.json`` serves.

The pod shares are stored per minute and the writer commits every second, so a minute's bucket appears within seconds
of its start: the test reads the last 30 minutes once the first whole minute after the pods' first shares began.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from bokeh.client import ClientSession, pull_session
from bokeh.models import ColumnDataSource, Div

from nvdash.sampling.fake.mig import mig_uuid
from nvdash.sampling.fake.profiles import gpu_uuid
from tests.conftest import NvdashServer, get_json, nvdash_server, wait_for
from tests.server.bokeh_viewer import receive_for
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

GPU0 = gpu_uuid("h100-mig", 0, 0)
TRAINER = mig_uuid(GPU0, 2, 0)
"""The 3g.40gb instance: two processes (24000 + 6144 MiB)."""
INFER = mig_uuid(GPU0, 3, 0)
"""The 2g.20gb instance: one process (12288 MiB)."""
IDLE = mig_uuid(GPU0, 10, 0)
"""The empty 1g.10gb instance."""
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NvdashServer]:
    root = tmp_path_factory.mktemp("pods_local")
    sock = root / "kubelet.sock"
    lister = Lister(pods=[
        Pod("research", "trainer", [Container("main", {"nvidia.com/mig-3g.40gb": [TRAINER]})]),
        Pod("serving", "infer", [Container("server", {"nvidia.com/mig-2g.20gb": [INFER]})]),
        Pod("research", "notebook", [Container("lab", {"nvidia.com/mig-1g.10gb": [IDLE]})]),
    ])
    args = ["--simulate", "h100-mig", "--interval", "0.25", "--process-interval", "0.5", "--kubelet-socket",
            str(sock), "--history", str(root / "history.sqlite")]
    with serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister), nvdash_server(args) as server:
        yield server


def _session(server: NvdashServer, arguments: dict[str, str]) -> ClientSession:
    return pull_session(url=server.url + "/Cluster-Pods", arguments=arguments)


def _source(session: ClientSession, name: str) -> dict[str, list[Any]]:
    for model in session.document.select({"type": ColumnDataSource, "name": name}):
        return {key: list(values) for key, values in model.data.items()}
    return {}


def _timeline(session: ClientSession) -> dict[str, list[float]]:
    receive_for(session, 0.2)
    data = _source(session, "pod-timeline")
    return {key: [float(v) for v in values] for key, values in data.items()}


def _pod_share(doc: dict[str, Any], pod: str) -> tuple[float, int] | None:
    """The pod's SM share (percent of its instance) and memory in ``/api/processes.json``."""
    for unit in doc["shares"]:
        for owner in unit["owners"]:
            if owner["kind"] == "pod" and owner["pod"] == pod and owner["sm_pct"] is not None:
                return owner["sm_pct"], owner["memory_bytes"]
    return None


def test_the_pods_page_is_offered_on_a_node_with_a_history(node: NvdashServer) -> None:
    assert get_json(node.url + "/index.json")["/Cluster-Pods"] == "Cluster Pods"


@pytest.mark.parametrize("kubelet", [False, True], ids=["not-a-kubernetes-node", "no-history"])
def test_off_kubernetes_or_without_history_the_pods_page_says_why(
    kubelet: bool, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A workstation (no kubelet socket) keeping a history, or a Kubernetes node without one: no pods page."""
    sock = tmp_path / "kubelet.sock"
    args = ["--simulate", "h100-mig", "--kubelet-socket", str(sock),
            *(["--no-history"] if kubelet else ["--history", str(tmp_path / "history.sqlite")])]
    serving = serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), Lister()) if kubelet else nullcontext()
    with serving, nvdash_server(args) as server:
        assert "/Cluster-Pods" not in get_json(server.url + "/index.json")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "/Cluster-Pods", timeout=30)
        assert refused.value.code == 404
        page = refused.value.read().decode()
        assert "pod-resources socket (--kubelet-socket), process readings (--process-interval above 0)" in page


def test_a_pods_timeline_from_this_nodes_history_matches_its_shares(node: NvdashServer) -> None:
    readings: dict[float, dict[str, float]] = {}
    """Each process reading the test saw, by its time: the pods' SM shares (percent of their instances)."""

    def shares() -> dict[str, Any]:
        doc = get_json(node.url + "/api/processes.json")
        found = {pod: _pod_share(doc, pod) for pod in ("trainer", "infer")}
        if doc["time_s"] is not None and all(value is not None for value in found.values()):
            readings.setdefault(doc["time_s"], {pod: value[0] for pod, value in found.items() if value is not None})
        return doc

    doc = wait_for(shares, lambda d: all(_pod_share(d, pod) is not None for pod in ("trainer", "infer")),
                   timeout_s=60.0)
    memory = {pod: _pod_share(doc, pod)[1] for pod in ("trainer", "infer")}  # type: ignore[index]
    # The simulated processes hold fixed amounts: 24000 + 6144 MiB in the trainer's instance, 12288 in infer's.
    assert memory == {"trainer": (24000 + 6144) * MiB, "infer": 12288 * MiB}
    # The minute holding the first shares also holds the sampler's first, still ramping, ones, which no client saw:
    # compare the next whole minute's bucket, watching every reading /api/processes.json serves through it. A
    # snapshot early in the minute carries the shares of a reading made up to one process interval before it.
    bucket = (math.floor(doc["time_s"] / 60.0) + 1) * 60.0
    wait_for(shares, lambda d: d["time_s"] >= bucket + 62.0, timeout_s=150.0)
    observed = {pod: [values[pod] for t, values in readings.items() if bucket - 1.0 <= t < bucket + 60.0]
                for pod in ("trainer", "infer")}
    assert all(len(values) >= 10 for values in observed.values()), observed

    sessions = {pod: _session(node, {"kind": "mig", "namespace": namespace, "pod": pod, "range": "30m"})
                for pod, namespace in (("trainer", "research"), ("infer", "serving"))}
    try:
        for pod, session in sessions.items():
            timeline = wait_for(lambda session=session: _timeline(session),
                                lambda data: bucket * 1000.0 in data.get("time", []), timeout_s=60.0)
            # 30 one-minute buckets (31 when the range starts inside a minute).
            assert 30 <= len(timeline["time"]) <= 31
            assert all(b - a == 60_000.0 for a, b in zip(timeline["time"], timeline["time"][1:], strict=False))
            at = timeline["time"].index(bucket * 1000.0)
            sm_gpus, held = timeline["sm_gpus"][at], timeline["memory_bytes"][at]
            # The minute's mean of the pod's share of its instance (devices-worth) lies within what
            # /api/processes.json served through that minute (1 point of slack for a reading between two of the
            # test's requests).
            low, high = min(observed[pod]), max(observed[pod])
            assert low - 1.0 <= sm_gpus * 100.0 <= high + 1.0, (pod, sm_gpus, low, high, observed[pod], doc["time_s"])
            assert held == memory[pod]
            assert any(text.startswith("From this node&#x27;s history (file ") for text in _texts(session))
            wait_for(lambda session=session: (receive_for(session, 0.2), _source(session, "pods"))[1],
                     lambda found, pod=pod: found.get("pod") == [pod], timeout_s=30.0)
        # Each pod its own share: the trainer's instance runs 0.85 of the job, infer's 0.5.
        trainer, infer = (_timeline(sessions[pod]) for pod in ("trainer", "infer"))
        assert trainer["sm_gpus"][trainer["time"].index(bucket * 1000.0)] > infer["sm_gpus"][
            infer["time"].index(bucket * 1000.0)] + 0.2
    finally:
        for session in sessions.values():
            session.close()


def test_the_type_filter_lists_this_nodes_pods(node: NvdashServer) -> None:
    session = _session(node, {"kind": "mig"})
    try:
        table = wait_for(lambda: (receive_for(session, 0.2), _source(session, "pods"))[1],
                         lambda found: len(found.get("pod", [])) == 3, timeout_s=60.0)
        assert sorted(zip(table["namespace"], table["pod"], table["device"], strict=True)) == [
            ("research", "notebook", "GPU 0 · 1g.10gb #10"), ("research", "trainer", "GPU 0 · 3g.40gb #2"),
            ("serving", "infer", "GPU 0 · 2g.20gb #3")]
        assert table["node"] == [table["node"][0]] * 3
    finally:
        session.close()
    whole = _session(node, {"kind": "whole"})
    try:
        wait_for(lambda: (receive_for(whole, 0.2), _texts(whole))[1],
                 lambda texts: "No pod matches these filters." in texts, timeout_s=60.0)
        assert _source(whole, "pods")["pod"] == []
    finally:
        whole.close()


def _texts(session: ClientSession) -> list[str]:
    return [str(model.text) for model in session.document.select({"type": Div})]

