"""vGPU quotas against use, end to end.

- Real child processes whose environments carry HAMi's quota variables run on a simulated GPU, sit in a real
  cgroup v1 pod directory, and are named by the kubelet's pod log directories and a real pod-resources gRPC server:
  the sampler's readings flag the pod over its memory quota and not the one under it, on ``/api/processes.json``'s
  document and the ``/metrics`` families.
- A real server (``--simulate vgpu``) flags use of a GPU that no pod was allocated while pods hold the other one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from nvdash.metrics.collector import ExportOptions, StoreCollector
from nvdash.metrics.counters import default_counters
from nvdash.metrics.exposition import text_format
from nvdash.sampling.cgroups import pod_names_from_logs
from nvdash.sampling.hardware import Hardware, open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.kubelet import PodResourcesClient, PodResourcesWatcher
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.usage import UsageCollector
from nvdash.server.usage_json import processes_json
from nvdash.store import Store
from tests.conftest import get_json, http_get, nvdash_server, wait_for
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

MIB = 1 << 20
CGROUP_V1 = Path("/sys/fs/cgroup/pids")


@contextlib.contextmanager
def pod_cgroup(pod_uid: str) -> Iterator[Path]:
    """A real cgroup v1 container directory ``kubepods/besteffort/pod<uid>/<id>``, removed afterwards (its
    processes must have exited or moved out by then)."""
    root = CGROUP_V1 / "kubepods" / "besteffort"
    pod_dir = root / f"pod{pod_uid}"
    container = pod_dir / uuid.uuid4().hex.ljust(64, "0")
    try:
        container.mkdir(parents=True)
    except OSError as error:
        pytest.skip(f"needs a writable cgroup v1 hierarchy at {CGROUP_V1} (root): {error}")
    try:
        yield container
    finally:
        for path in (container, pod_dir):
            with contextlib.suppress(OSError):
                path.rmdir()


def start_in_cgroup(cgroup: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``sleep`` with ``env``, moved into ``cgroup`` once it has exec'd (its environment is then its own)."""
    child = subprocess.Popen(["sleep", "600"], env={"PATH": os.environ.get("PATH", "/usr/bin"), **env})
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/comm").read_text().strip() != "sleep":
        assert time.monotonic() < deadline, "the child never ran sleep"
        time.sleep(0.01)
    (cgroup / "cgroup.procs").write_text(str(child.pid))
    return child


def metric_samples(store: Store, family: str) -> list[tuple[dict[str, str], float]]:
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, default_counters(), ExportOptions(hostname="node-a", pods=True)))
    text = text_format(registry.collect()).decode()
    return [(sample.labels, sample.value) for parsed in text_string_to_metric_families(text)
            if parsed.name == family for sample in parsed.samples]


@pytest.fixture
def hardware() -> Iterator[Hardware]:
    opened = open_hardware("vgpu")
    yield opened
    opened.close()


def test_a_vgpu_pod_over_its_memory_quota_is_flagged_and_one_under_it_is_not(
    hardware: Hardware, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fake = hardware.fake
    assert fake is not None
    assert hardware.gpus is not None
    gpu1 = hardware.inventory.gpus[1].uuid
    over_uid, under_uid = str(uuid.uuid4()), str(uuid.uuid4())
    logs = tmp_path / "pods"
    for name, uid in (("over", over_uid), ("under", under_uid)):
        (logs / f"ml_{name}_{uid}").mkdir(parents=True)
    lister = Lister(pods=[Pod("ml", "over", [Container("main", {"nvidia.com/gpu": [f"{gpu1}-0"]})]),
                          Pod("ml", "under", [Container("main", {"nvidia.com/gpu": [f"{gpu1}-1"]})])])
    sock = tmp_path / "kubelet.sock"
    children: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        over_cgroup = stack.enter_context(pod_cgroup(over_uid))
        under_cgroup = stack.enter_context(pod_cgroup(under_uid))
        stack.enter_context(serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister))

        @stack.callback
        def stop_children() -> None:
            for child in children:
                child.kill()
                child.wait(10)

        hami = {"NVIDIA_VISIBLE_DEVICES": gpu1, "CUDA_DEVICE_SM_LIMIT": "30"}
        over = start_in_cgroup(over_cgroup, {**hami, "CUDA_DEVICE_MEMORY_LIMIT_0": "2000m", "TOKEN": "s3cr3t"})
        children.append(over)
        under = start_in_cgroup(under_cgroup, {**hami, "CUDA_DEVICE_MEMORY_LIMIT_0": "1g"})
        children.append(under)
        fake.add_process(1, over.pid, memory_mib=2500)
        fake.add_process(1, under.pid, memory_mib=700)

        client = PodResourcesClient(str(sock))
        stack.callback(client.close)
        watcher = PodResourcesWatcher(client, interval_s=0.5)
        watcher.start()
        stack.callback(watcher.stop)
        store = Store(hardware.inventory, capacity=1000)
        collector = UsageCollector(hardware.gpus, HostProcessTable(), watcher, lambda: pod_names_from_logs(logs))
        sampler = Sampler(store, hardware.host, hardware.gpus, 0.25, usage=collector, usage_interval_s=0.5)
        sampler.start()
        stack.callback(sampler.stop)

        def flagged(doc: dict[str, Any]) -> bool:
            return any(f["kind"] == "memory_over_quota" for f in doc["quota_findings"])

        doc = wait_for(lambda: processes_json(store), flagged, timeout_s=60.0)
        gpu0 = hardware.inventory.gpus[0].uuid
        assert doc["quota_findings"] == [{
            "namespace": "ml", "pod": "over", "container": "main", "gpu_uuid": gpu1, "kind": "memory_over_quota",
            "used": 2500.0 * MIB, "quota": 2000.0 * MIB, "scheme": "hami",
            "text": "ml/over/main holds 2.4 GiB of GPU memory on GPU 1, over its HAMi quota of 2.0 GiB",
        }, {  # the profile's own processes on GPU 0, which no pod holds
            "namespace": "", "pod": "", "container": "", "gpu_uuid": gpu0, "kind": "unallocated_use",
            "used": 4000.0 * MIB, "quota": None, "scheme": "",
            "text": "GPU 0 runs 2 processes of a process outside any pod (3.9 GiB), but the kubelet allocated it to "
                    "no pod",
        }]
        grants = {g["pod"]: g for g in doc["grants"]}
        assert grants["over"] == {"namespace": "ml", "pod": "over", "container": "main", "scheme": "hami",
                                  "source": "environment", "gpu_uuid": gpu1, "core_pct": 30.0,
                                  "memory_bytes": 2000 * MIB}
        assert grants["under"]["memory_bytes"] == 1 << 30
        assert "s3cr3t" not in repr(doc)

        findings = metric_samples(store, "nvdash_pod_gpu_quota_finding")
        assert [(labels["pod"], labels["finding"], labels["UUID"], labels["gpu"], value)
                for labels, value in findings] == [("over", "memory_over_quota", gpu1, "1", 1.0),
                                                   ("", "unallocated_use", gpu0, "0", 1.0)]
        quotas = {labels["pod"]: value for labels, value in metric_samples(store, "nvdash_pod_gpu_memory_quota_bytes")}
        assert quotas == {"over": 2000.0 * MIB, "under": float(1 << 30)}
        cores = {labels["pod"]: value for labels, value in metric_samples(store, "nvdash_pod_gpu_core_quota_ratio")}
        assert cores == {"over": 0.3, "under": 0.3}


def test_a_real_server_flags_use_of_a_gpu_nobody_was_allocated(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sock = tmp_path / "kubelet.sock"
    hardware = open_hardware("vgpu")
    gpu0, gpu1 = (gpu.uuid for gpu in hardware.inventory.gpus)
    hardware.close()
    lister = Lister(pods=[Pod("ml", "hami-a", [Container("main", {"nvidia.com/gpu": [f"{gpu0}-0"]})])])
    args = ["--simulate", "vgpu", "--interval", "0.25", "--process-interval", "0.5", "--kubelet-socket", str(sock),
            "--metrics-pods"]
    with serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister), nvdash_server(args) as server:
        doc = wait_for(lambda: get_json(server.url + "/api/processes.json"),
                       lambda d: bool(d["quota_findings"]), timeout_s=60.0)
        assert doc["allocations"][0]["uuid"] == gpu0
        assert doc["allocations"][0]["sharing"] == "vgpu"
        assert [(f["kind"], f["gpu_uuid"], f["pod"], f["used"]) for f in doc["quota_findings"]] == [
            ("unallocated_use", gpu1, "", 2048.0 * MIB)]
        text = wait_for(lambda: http_get(server.url + "/metrics")[1],
                        lambda t: "nvdash_pod_gpu_quota_finding{" in t, timeout_s=60.0)
        lines = [line for line in text.splitlines() if line.startswith("nvdash_pod_gpu_quota_finding{")]
        assert len(lines) == 1
        assert 'finding="unallocated_use"' in lines[0]
        assert f'UUID="{gpu1}"' in lines[0]
        assert lines[0].endswith(" 1.0")

