"""Grants: GPU-Manager's vcuda units counted from a real pod-resources server's answer, HAMi's GPU shares named
after their GPU, and the HAMi and MPS quotas of the processes' environments mapped to GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.sampling.grants import collect_grants, environment_grants
from nvdash.sampling.kubelet import PodResourcesClient
from nvdash.sampling.usage_records import GpuProcess, Grant, HostProcess, PodDevice, PodResources, ProcessLimits
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

GPU0 = "GPU-98e1c2a4-5b3d-4f6e-8a7b-1c2d3e4f5a6b"
GPU1 = "GPU-3f0b7d1e-9c2a-4e8b-b6d4-7a5e2c1f0d93"
MIB = 1 << 20


@pytest.fixture(scope="session")
def api_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kubelet_api")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[PodResourcesClient]:
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"))
    yield client
    client.close()


def vcuda(cores: int, memory_units: int, start: int = 0) -> dict[str, list[str]]:
    return {"tencent.com/vcuda-core": [f"tencent.com/vcuda-core-{start + i}" for i in range(cores)],
            "tencent.com/vcuda-memory": [f"tencent.com/vcuda-memory-268435456-{start + i}"
                                         for i in range(memory_units)]}


def test_gpu_manager_amounts_are_the_counts_of_device_ids(tmp_path: Path, api_dir: Path,
                                                          client: PodResourcesClient) -> None:
    pods = [
        Pod("ml", "train-a", [Container("main", vcuda(50, 16)), Container("sidecar", {})]),
        Pod("ml", "infer-b", [Container("server", vcuda(25, 6, start=100))]),
        Pod("ml", "hami-c", [Container("main", {"nvidia.com/gpu": [f"{GPU1}-3"]})]),
    ]
    with serve_pods(tmp_path / "kubelet.sock", api_dir, Lister(pods)):
        answer = client.list()
    assert answer.available
    assert [(d.pod, d.uuid, d.sharing) for d in answer.devices] == [("hami-c", GPU1, "vgpu")]
    assert len(answer.quota_devices) == 50 + 16 + 25 + 6
    assert collect_grants(answer, ()) == (
        Grant("ml", "infer-b", "server", "gpu-manager", "pod-resources", None, core_pct=25.0,
              memory_bytes=6 * 256 * MIB),
        Grant("ml", "train-a", "main", "gpu-manager", "pod-resources", None, core_pct=50.0, memory_bytes=4 << 30),
    )


def test_device_ids_that_only_look_like_hami_shares_keep_their_name() -> None:
    assert PodDevice("a", "b", "c", "nvidia.com/gpu", f"{GPU0}::2", "shared").uuid == GPU0
    assert PodDevice("a", "b", "c", "nvidia.com/gpu", f"{GPU0}-12", "vgpu").uuid == GPU0
    assert PodDevice("a", "b", "c", "nvidia.com/gpu", GPU0, "whole").uuid == GPU0
    assert PodDevice("a", "b", "c", "nvidia.com/gpu", "GPU-1234-5", "whole").uuid == "GPU-1234-5"


def process(pid: int, gpu: str, limits: ProcessLimits | None, pod: str | None = "train-a",
            container: str | None = "main") -> GpuProcess:
    return GpuProcess(gpu_index=0 if gpu == GPU0 else 1, gpu_uuid=gpu, pid=pid, kinds=("compute",),
                      host=HostProcess(pid=pid, limits=limits), pod_namespace=None if pod is None else "ml",
                      pod_name=pod, container_name=container)


def test_hami_ordinals_map_to_the_visible_gpus_and_the_core_limit_to_each() -> None:
    limits = ProcessLimits(hami_memory_bytes=((0, 3000 * MIB), (1, 1 << 30)), hami_core_pct=30.0,
                           visible_devices=(GPU1, GPU0))
    assert environment_grants([process(10, GPU0, limits)]) == (
        Grant("ml", "train-a", "main", "hami", "environment", GPU1, core_pct=30.0, memory_bytes=3000 * MIB),
        Grant("ml", "train-a", "main", "hami", "environment", GPU0, core_pct=30.0, memory_bytes=1 << 30),
    )


def test_without_visible_uuids_one_ordinal_means_the_gpu_nvml_lists_the_process_on() -> None:
    mps = ProcessLimits(mps_thread_pct=40.0, mps_pinned_memory_bytes=((0, 1 << 30),))
    assert environment_grants([process(11, GPU1, mps, container=None)]) == (
        Grant("ml", "train-a", "", "mps", "environment", GPU1, core_pct=40.0, memory_bytes=1 << 30),)
    two = ProcessLimits(hami_memory_bytes=((0, MIB), (1, MIB)))
    assert environment_grants([process(12, GPU1, two)]) == ()


def test_processes_without_a_pod_or_limits_give_no_grant_and_duplicates_count_once() -> None:
    limits = ProcessLimits(hami_memory_bytes=((0, 2 << 30),), visible_devices=(GPU0,))
    processes = [process(1, GPU0, limits), process(2, GPU0, limits), process(3, GPU0, limits, pod=None),
                 process(4, GPU0, None), process(5, GPU0, ProcessLimits())]
    assert collect_grants(PodResources(), processes) == (
        Grant("ml", "train-a", "main", "hami", "environment", GPU0, core_pct=None, memory_bytes=2 << 30),)
