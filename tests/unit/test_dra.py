"""GPUs given to pods through DRA claims: the kubelet's ``dynamic_resources`` read from a real gRPC server, mapped to
GPUs by the NVIDIA DRA driver's device names, and used to name processes like device-plugin allocations."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.apps.process_notes import idle_columns
from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE as GHOST
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.kubelet import PodResourcesClient, PodResourcesWatcher
from nvdash.sampling.kubelet.dra import map_claim, profile_key, with_claims
from nvdash.sampling.usage import UsageCollector
from nvdash.sampling.usage_records import ClaimDevice, GpuUsage, MigInstance, PodDevice, PodResources, Usage
from tests.unit.conftest import FakeClock, open_source
from tests.unit.kubelet_server import Claim, ClaimResource, Container, Lister, Pod, serve_pods

GPU_A = "GPU-6f1d3a52-0c1e-4b8e-9d7a-1a2b3c4d5e01"
GPU_B = "GPU-6f1d3a52-0c1e-4b8e-9d7a-1a2b3c4d5e02"
MIG_3G = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c01"
MIG_1G = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c02"
MIG_1C = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c03"
MIG_2C = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c04"

GPUS = (
    # Minor numbers in another order than the indexes: a mapping by index would pick the wrong GPU.
    GpuUsage(0, GPU_A, minor_number=1),
    GpuUsage(1, GPU_B, mig_enabled=True, minor_number=0, instances=(
        MigInstance(1, MIG_3G, 1, 0, "3g.40gb", placement_start=4, placement_size=4),
        MigInstance(1, MIG_1G, 13, 0, "1g.10gb+me", placement_start=2, placement_size=1),
        # One GPU instance split into two compute instances: the driver never names those.
        MigInstance(1, MIG_1C, 5, 0, "1c.2g.20gb", placement_start=0, placement_size=2),
        MigInstance(1, MIG_2C, 5, 1, "1c.2g.20gb", placement_start=0, placement_size=2),
    )),
)


def claim(device: str, *, driver: str = "gpu.nvidia.com", container: str = "main", share_id: str | None = None,
          pool: str = "node-a", cdi: tuple[str, ...] = (), class_name: str | None = None) -> ClaimDevice:
    return ClaimDevice("ml", "train", container, "ml", "one-gpu", driver, pool, device, share_id, cdi, class_name)


def test_profile_key_is_the_drivers_spelling() -> None:
    assert profile_key("1g.10gb") == "1g10gb"
    assert profile_key("1g.10gb+me") == "1g10gb-me"
    assert profile_key("3g.40gb") == "3g40gb"


@pytest.mark.parametrize(("device", "uuid", "sharing"), [
    ("gpu-1", GPU_A, "whole"),  # minor 1 is index 0
    ("gpu-0", GPU_B, "whole"),
    ("gpu-0-mig-3g40gb-9-4", MIG_3G, "mig"),  # releases 25.12 on: profile name, profile id, placement start
    ("gpu-0-mig-1g10gb-me-20-2", MIG_1G, "mig"),
    ("gpu-0-mig-9-4-4", MIG_3G, "mig"),  # releases 25.3, 25.8: profile id, placement start, placement size
    ("gpu-0-mig-20-2-1", MIG_1G, "mig"),
])
def test_nvidia_dra_devices_map_to_their_gpu_or_mig_device(device: str, uuid: str, sharing: str) -> None:
    assert map_claim(claim(device), GPUS) == PodDevice(
        "ml", "train", "main", "gpu.nvidia.com (DRA claim ml/one-gpu)", uuid, sharing)


def test_a_shared_device_share_is_shared() -> None:
    mapped = map_claim(claim("gpu-1", share_id="3f0c2d4e-0000-4000-8000-000000000001"), GPUS)
    assert (mapped.uuid, mapped.sharing, mapped.note) == (GPU_A, "shared", None)


@pytest.mark.parametrize(("found", "device_id", "note"), [
    (claim("gpu-7"), "gpu.nvidia.com/node-a/gpu-7", "DRA device gpu-7: no GPU with minor number 7 here"),
    (claim("gpu-0-mig-2g20gb-14-0"), "gpu.nvidia.com/node-a/gpu-0-mig-2g20gb-14-0",
     "DRA device gpu-0-mig-2g20gb-14-0: no MIG devices of GPU 1 match it"),
    (claim("gpu-0-mig-14-0-2"), "gpu.nvidia.com/node-a/gpu-0-mig-14-0-2",
     "DRA device gpu-0-mig-14-0-2: 2 MIG devices of GPU 1 match it"),
    (claim("gpu-vfio-0"), "gpu.nvidia.com/node-a/gpu-vfio-0",
     "DRA device gpu-vfio-0: a GPU passed through to a virtual machine (VFIO)"),
    (claim("gpu-a"), "gpu.nvidia.com/node-a/gpu-a", "DRA device gpu-a: not a name the NVIDIA DRA driver gives"),
    (claim("gpu-0", driver="gpu.example.com"), "gpu.example.com/node-a/gpu-0",
     "DRA device gpu-0 of driver gpu.example.com: not an NVIDIA GPU driver"),
    (claim("", driver="", pool="", cdi=("k8s.gpu.nvidia.com/claim=4e1f",), class_name="gpu.nvidia.com"),
     "k8s.gpu.nvidia.com/claim=4e1f",
     "DRA claim of class gpu.nvidia.com from a kubelet older than 1.31, which names no device"),
    (claim("", driver="", pool=""), "DRA claim ml/one-gpu",
     "DRA claim from a kubelet older than 1.31, which names no device"),
])
def test_devices_nvdash_cannot_map_are_kept_with_a_note_and_on_no_gpu(found: ClaimDevice, device_id: str,
                                                                        note: str) -> None:
    mapped = map_claim(found, GPUS)
    assert (mapped.device_id, mapped.note, mapped.sharing) == (device_id, note, "whole")
    assert mapped.uuid not in {GPU_A, GPU_B, MIG_3G, MIG_1G, MIG_1C, MIG_2C}
    assert mapped.resource_name == f"{found.driver or 'unknown driver'} (DRA claim ml/one-gpu)"


def test_without_minor_numbers_no_gpu_is_guessed() -> None:
    gpus = (GpuUsage(0, GPU_A), GpuUsage(1, GPU_B))
    assert map_claim(claim("gpu-0"), gpus).note == "DRA device gpu-0: no GPU with minor number 0 here"


def test_with_claims_adds_each_containers_device_once_and_counts_the_unmapped() -> None:
    plugin = PodDevice("ml", "other", "c", "nvidia.com/gpu", GPU_B, "whole")
    pods = PodResources(devices=(plugin,), available=True, status="kubelet pod-resources: 1 pod holds 1 GPU device",
                        claim_devices=(claim("gpu-1"), claim("gpu-1", container="sidecar"), claim("gpu-9")))
    mapped = with_claims(pods, GPUS)
    assert [(d.container, d.uuid, d.note is None) for d in mapped.devices] == [
        ("c", GPU_B, True), ("main", GPU_A, True), ("sidecar", GPU_A, True), ("main", "gpu.nvidia.com/node-a/gpu-9",
                                                                             False)]
    assert mapped.status == ("kubelet pod-resources: 1 pod holds 1 GPU device; "
                             "1 DRA device not mapped to a GPU here")
    assert with_claims(PodResources(devices=(plugin,)), GPUS) == PodResources(devices=(plugin,))


@pytest.fixture
def kubelet(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lister, PodResourcesClient]]:
    lister = Lister()
    with serve_pods(tmp_path / "kubelet.sock", tmp_path_factory.mktemp("kubelet_api"), lister):
        client = PodResourcesClient(str(tmp_path / "kubelet.sock"))
        yield lister, client
        client.close()


def test_the_client_reads_dynamic_resources(kubelet: tuple[Lister, PodResourcesClient]) -> None:
    lister, client = kubelet
    cdi = "k8s.gpu.nvidia.com/claim=2f7e3a40-9d1c-4b5e-8f6a-0c1d2e3f4a5b-gpu-0"
    whole = Claim("ml", "one-gpu", [ClaimResource("gpu.nvidia.com", "node-a", "gpu-0", [cdi])])
    mig = Claim("ml", "slice", [ClaimResource("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-3")])
    nic = Claim("net", "rdma", [ClaimResource("dra.net", "node-a", "eth1")])
    shared = Claim("ml", "one-gpu", [ClaimResource("gpu.nvidia.com", "node-a", "gpu-0", [], "share-7")])
    old = Claim("ml", "old", [ClaimResource("", "", "", ["k8s.gpu.nvidia.com/claim=old"])], class_name="gpu.nvidia.com")
    lister.pods = [
        Pod("ml", "train", [Container("trainer", {}, [whole, mig]), Container("logger", {}, [whole, nic])]),
        Pod("ml", "infer", [Container("server", {"nvidia.com/gpu": [GPU_B]}, [shared, old])]),
    ]
    answer = client.list()
    assert answer.devices == (PodDevice("ml", "infer", "server", "nvidia.com/gpu", GPU_B, "whole"),)
    assert answer.claim_devices == (
        ClaimDevice("ml", "train", "trainer", "ml", "one-gpu", "gpu.nvidia.com", "node-a", "gpu-0", None, (cdi,)),
        ClaimDevice("ml", "train", "trainer", "ml", "slice", "gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-3"),
        ClaimDevice("ml", "train", "logger", "ml", "one-gpu", "gpu.nvidia.com", "node-a", "gpu-0", None, (cdi,)),
        ClaimDevice("ml", "train", "logger", "net", "rdma", "dra.net", "node-a", "eth1"),
        ClaimDevice("ml", "infer", "server", "ml", "one-gpu", "gpu.nvidia.com", "node-a", "gpu-0", "share-7"),
        ClaimDevice("ml", "infer", "server", "ml", "old", "", "", "", None, ("k8s.gpu.nvidia.com/claim=old",),
                    "gpu.nvidia.com"),
    )
    assert answer.status == "kubelet pod-resources: 1 pod holds 1 GPU device; DRA claims give 2 pods 6 devices"
    lister.pods = [Pod("ml", "train", [Container("trainer", {}, [whole])])]
    assert client.list().status == ("kubelet pod-resources: no pod holds a device-plugin GPU; "
                                    "DRA claims give 1 pod 1 device")


def test_processes_on_a_dra_gpu_are_named_after_its_pod(kubelet: tuple[Lister, PodResourcesClient]) -> None:
    """The fake's GPUs have minor numbers in reverse index order (dgx-h100: GPU 7 is /dev/nvidia0)."""
    lister, client = kubelet
    watcher = PodResourcesWatcher(client, interval_s=60.0)
    for source, _ in open_source("dgx-h100", FakeClock()):
        source.open()
        uuids = [gpu.uuid for gpu in source.gpus]
        lister.pods = [Pod("ml", "train", [Container("trainer", {}, [
            Claim("ml", "two-gpus", [ClaimResource("gpu.nvidia.com", "node-a", "gpu-7"),
                                     ClaimResource("gpu.nvidia.com", "node-a", "gpu-6")])])])]
        assert watcher.refresh().available
        usage = UsageCollector(source, HostProcessTable(), watcher).collect(time.time(), 10.0)
        named = {(p.gpu_index, p.pod_namespace, p.pod_name, p.container_name) for p in usage.processes
                 if p.pid in (GHOST + 100, GHOST + 101, GHOST + 102)}
        assert named == {(0, "ml", "train", "trainer"), (1, "ml", "train", "trainer"), (2, None, None, None)}
        assert [(d.uuid, d.resource_name) for d in usage.pods.devices] == [
            (uuids[0], "gpu.nvidia.com (DRA claim ml/two-gpus)"), (uuids[1], "gpu.nvidia.com (DRA claim ml/two-gpus)")]
        assert usage.idle_allocations() == ()


def test_a_mig_device_claim_names_the_processes_in_it(kubelet: tuple[Lister, PodResourcesClient]) -> None:
    lister, client = kubelet
    watcher = PodResourcesWatcher(client, interval_s=60.0)
    for source, _ in open_source("a100-mig", FakeClock()):
        source.open()
        instances = UsageCollector(source, HostProcessTable()).collect(time.time(), 10.0).gpus[0].instances
        assert (instances[0].profile, instances[0].placement_start) == ("3g.20gb", 4)
        # a100-mig's GPU 0 is /dev/nvidia1; its 3g.20gb instance starts at memory slice 4 (profile id 2 on A100 40GB).
        lister.pods = [Pod("team-a", "big", [Container("c", {}, [
            Claim("team-a", "mig-3g", [ClaimResource("gpu.nvidia.com", "node-a", "gpu-1-mig-3g20gb-2-4")])])])]
        watcher.refresh()
        usage = UsageCollector(source, HostProcessTable(), watcher).collect(time.time(), 10.0)
        big = {p.pid: p for p in usage.processes}[GHOST + 200]
        assert (big.mig_uuid, big.pod_namespace, big.pod_name) == (instances[0].uuid, "team-a", "big")
        assert [(d.uuid, d.sharing) for d in usage.pods.devices] == [(instances[0].uuid, "mig")]


def test_the_idle_table_says_why_a_dra_device_is_on_no_gpu() -> None:
    pods = with_claims(PodResources(available=True, claim_devices=(claim("gpu-1"), claim("gpu-9"))), GPUS)
    data = idle_columns(Usage(1.0, gpus=GPUS, pods=pods))
    assert data["device"] == [GPU_A, "gpu.nvidia.com/node-a/gpu-9"]
    assert data["gpu"] == ["GPU 0", "unknown GPU: DRA device gpu-9: no GPU with minor number 9 here"]
    assert data["resource"] == ["gpu.nvidia.com (DRA claim ml/one-gpu)"] * 2
