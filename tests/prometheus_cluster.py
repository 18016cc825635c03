"""A small simulated cluster for the Prometheus tests: three nvdash nodes, each with a real gRPC kubelet
pod-resources server handing its GPUs to pods, a real Prometheus (Debian's package) scraping them every second,
and optionally a fourth nvdash showing the cluster pages over that Prometheus.

The pods:

- node-a (DGX H100): ``research/train-llm`` holds GPUs 0-3 whole; ``research/notebook`` holds GPU 7, which runs
  nothing (an allocated but idle GPU);
- node-b (2 x A100 PCIe, an XID 48 injected on GPU 0): ``inference/server-a`` and ``inference/server-b`` share
  GPU 0 (time-slicing replicas ``GPU-...::0`` and ``::1``);
- node-c (A100 in MIG mode): ``batch/mig-train`` holds the 3g.20gb instance, ``batch/mig-idle`` a 1g.5gb
  instance that runs nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import NvdashServer, free_port, get_json, http_get, nvdash_server, wait_for
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "nvdash-alerts.yml"
NODES: dict[str, tuple[list[str], dict[str, str], int]] = {
    "node-a": (["--simulate", "dgx-h100"], {}, 8),
    "node-b": (["--simulate", "a100-pcie-2"], {"NVDASH_FAKE_FAULTS": "xid:48:0@3"}, 2),
    "node-c": (["--simulate", "a100-mig"], {}, 2),
}
"""Name: (nvdash arguments, environment, GPU count)."""
PODS = {
    ("research", "train-llm"): "node-a", ("research", "notebook"): "node-a",
    ("inference", "server-a"): "node-b", ("inference", "server-b"): "node-b",
    ("batch", "mig-train"): "node-c", ("batch", "mig-idle"): "node-c",
}
IDLE_PODS = {("research", "notebook"), ("batch", "mig-idle")}


@dataclass
class Cluster:
    """The running pieces: Prometheus's URL, the nodes, their kubelets' answers, and the cluster-view server."""

    url: str
    nodes: dict[str, NvdashServer]
    listers: dict[str, Lister] = field(default_factory=dict)
    central: NvdashServer | None = None


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("prometheus is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    return path


def status_of(url: str) -> int:
    try:
        return http_get(url)[0]
    except OSError:
        return 0


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query's result rows."""
    answer = get_json(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def allocations(server: NvdashServer) -> int:
    """How many pod allocations the node's ``/metrics`` exports."""
    text = http_get(server.url + "/metrics")[1]
    return sum(1 for line in text.splitlines() if line.startswith("nvdash_pod_gpu_allocated{"))


def _pods(name: str, server: NvdashServer) -> list[Pod]:
    """The pods of node ``name``, on its simulated GPUs' UUIDs (MIG instances' from its process API)."""
    uuids = [gpu["uuid"] for gpu in get_json(server.url + "/info.json")["gpus"]]
    if name == "node-a":
        return [Pod("research", "train-llm", [Container("trainer", {"nvidia.com/gpu": uuids[0:4]})]),
                Pod("research", "notebook", [Container("lab", {"nvidia.com/gpu": [uuids[7]]})])]
    if name == "node-b":
        return [Pod("inference", "server-a", [Container("server", {"nvidia.com/gpu.shared": [f"{uuids[0]}::0"]})]),
                Pod("inference", "server-b", [Container("server", {"nvidia.com/gpu.shared": [f"{uuids[0]}::1"]})])]
    usage = wait_for(lambda: get_json(server.url + "/api/processes.json"),
                     lambda found: any(gpu["mig"]["instances"] for gpu in found["gpus"] if gpu.get("mig")),
                     timeout_s=60.0)
    instances = {item["profile"]: item["uuid"] for gpu in usage["gpus"] if gpu.get("mig")
                 for item in gpu["mig"]["instances"]}
    idle = next(item["uuid"] for gpu in usage["gpus"] if gpu.get("mig") for item in gpu["mig"]["instances"]
                if item["profile"] == "1g.5gb" and item["memory_used_bytes"] < 64 * 1024 * 1024)
    return [Pod("batch", "mig-train", [Container("worker", {"nvidia.com/mig-3g.20gb": [instances["3g.20gb"]]})]),
            Pod("batch", "mig-idle", [Container("worker", {"nvidia.com/mig-1g.5gb": [idle]})])]


@contextmanager
def run_prometheus(root: Path, targets: Sequence[str], *, rules: bool | Path = True) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` (``host:port``) every second, its data under ``root``, with the shipped
    alert rules (``rules=True``), none (``False``) or the rules file given; yields its URL once it is ready (not yet
    scraped)."""
    config = root / "prometheus.yml"
    rules_file = rules if isinstance(rules, Path) else RULES if rules else None
    rule_files = f"rule_files:\n  - {rules_file}\n" if rules_file is not None else ""
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n" + rule_files +
        f"scrape_configs:\n  - job_name: nvdash\n    static_configs:\n      - targets: {json.dumps(list(targets))}\n"
    )
    port = free_port()
    with (root / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: status_of(url + "/-/ready"), lambda status: status == 200, timeout_s=60.0)
            yield url
        finally:
            process.terminate()
            process.wait(20)


@contextmanager
def prometheus_cluster(root: Path, *, central: bool = False, rules: bool = True) -> Iterator[Cluster]:
    """Start everything; Prometheus is ready (not yet scraped) when this yields."""
    with ExitStack() as stack:
        nodes: dict[str, NvdashServer] = {}
        listers: dict[str, Lister] = {}
        for name, (args, env, _count) in NODES.items():
            socket_path = root / f"{name}-kubelet.sock"
            listers[name] = stack.enter_context(serve_pods(socket_path, root, Lister()))
            nodes[name] = stack.enter_context(nvdash_server(
                [*args, "--interval", "0.5", "--process-interval", "1", "--no-history", "--hostname", name,
                 "--metrics-pods", "--kubelet-socket", str(socket_path)], env=env))
        for name, server in nodes.items():
            listers[name].pods = _pods(name, server)
        for name, server in nodes.items():
            # Scraped from the start with every pod: the kubelet watcher asks every few seconds.
            wanted = sum(len(ids) for pod in listers[name].pods for container in pod.containers
                         for ids in container.devices.values())
            wait_for(lambda s=server: allocations(s), lambda found, n=wanted: found == n, timeout_s=60.0)
        targets = [f"127.0.0.1:{server.port}" for server in nodes.values()]
        url = stack.enter_context(run_prometheus(root, targets, rules=rules))
        view = None
        if central:
            view = stack.enter_context(nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url]))
        yield Cluster(url, nodes, listers, view)


def firing_alerts(url: str) -> list[dict[str, Any]]:
    """The alerts the Prometheus at ``url`` has firing now."""
    alerts = get_json(url + "/api/v1/alerts")["data"]["alerts"]
    return [alert for alert in alerts if alert["state"] == "firing"]
