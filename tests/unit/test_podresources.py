"""The kubelet pod-resources client and watcher against real gRPC servers on unix sockets."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvdash.sampling.kubelet import DEFAULT_SOCKET, PodResourcesClient, PodResourcesWatcher, podresources, sharing_of
from nvdash.sampling.kubelet.watcher import WAITING
from nvdash.sampling.usage_records import SHARING_KINDS, PodDevice, PodResources
from nvdash.supervision import Supervisor
from tests.conftest import wait_for
from tests.unit.kubelet_server import (
    Container,
    Lister,
    Pod,
    compile_api,
    serve_garbage,
    serve_junk,
    serve_no_service,
    serve_pods,
    stale_socket,
)

GPU_A = "GPU-6f1d3a52-0c1e-4b8e-9d7a-1a2b3c4d5e01"
GPU_B = "GPU-6f1d3a52-0c1e-4b8e-9d7a-1a2b3c4d5e02"
GPU_C = "GPU-6f1d3a52-0c1e-4b8e-9d7a-1a2b3c4d5e03"
MIG_A = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c01"
MIG_B = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c02"


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture(scope="session")
def api_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kubelet_api")


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


@pytest.fixture
def client(sock: Path) -> Iterator[PodResourcesClient]:
    client = PodResourcesClient(str(sock))
    yield client
    client.close()


def test_whole_gpus_listed_and_other_devices_left_out(sock: Path, api_dir: Path, client: PodResourcesClient) -> None:
    pods = [
        Pod(
            "ml",
            "train-0",
            [
                Container("trainer", {"nvidia.com/gpu": [GPU_A, GPU_B], "example.com/nic": ["eth1"]}),
                Container("sidecar", {}),
            ],
        ),
        Pod("infra", "crypto-0", [Container("qat", {"intel.com/qat": ["0000:3d:00.1"]})]),
    ]
    with serve_pods(sock, api_dir, Lister(pods)):
        answer = client.list()
    assert answer == PodResources(
        devices=(
            PodDevice("ml", "train-0", "trainer", "nvidia.com/gpu", GPU_A, "whole"),
            PodDevice("ml", "train-0", "trainer", "nvidia.com/gpu", GPU_B, "whole"),
        ),
        available=True,
        status="kubelet pod-resources: 1 pod holds 2 GPU devices",
    )


def test_mig_devices(sock: Path, api_dir: Path, client: PodResourcesClient) -> None:
    pods = [
        Pod("team-a", "infer-7c9", [Container("server", {"nvidia.com/mig-3g.20gb": [MIG_A]})]),
        Pod("team-b", "notebook", [Container("jupyter", {"nvidia.com/mig-3g.20gb": [MIG_B]})]),
    ]
    with serve_pods(sock, api_dir, Lister(pods)):
        answer = client.list()
    assert answer.available
    assert answer.devices == (
        PodDevice("team-a", "infer-7c9", "server", "nvidia.com/mig-3g.20gb", MIG_A, "mig"),
        PodDevice("team-b", "notebook", "jupyter", "nvidia.com/mig-3g.20gb", MIG_B, "mig"),
    )
    assert [d.uuid for d in answer.devices] == [MIG_A, MIG_B]
    assert answer.status == "kubelet pod-resources: 2 pods hold 2 GPU devices"


def test_shared_gpu_replicas(sock: Path, api_dir: Path, client: PodResourcesClient) -> None:
    pods = [
        Pod("dev", "a", [Container("main", {"nvidia.com/gpu.shared": [f"{GPU_C}::0"]})]),
        Pod("dev", "b", [Container("main", {"nvidia.com/gpu.shared": [f"{GPU_C}::1"]})]),
    ]
    with serve_pods(sock, api_dir, Lister(pods)):
        answer = client.list()
    assert [(d.pod, d.device_id, d.sharing, d.uuid) for d in answer.devices] == [
        ("a", f"{GPU_C}::0", "shared", GPU_C),
        ("b", f"{GPU_C}::1", "shared", GPU_C),
    ]
    assert answer.status == "kubelet pod-resources: 2 pods hold 2 GPU devices"


def test_several_pods_and_containers(sock: Path, api_dir: Path, client: PodResourcesClient) -> None:
    pods = [
        Pod(
            "ml",
            "ddp-0",
            [
                Container("rank0", {"nvidia.com/gpu": [GPU_A]}),
                Container("rank1", {"nvidia.com/gpu": [GPU_B], "example.com/nic": ["eth2"]}),
            ],
        ),
        Pod("ml", "eval", [Container("eval", {"nvidia.com/mig-1g.10gb": [MIG_A, MIG_B]})]),
        Pod("web", "render", [Container("blender", {"nvidia.com/gpu.shared": [f"{GPU_C}::3"]})]),
        Pod("web", "static", [Container("nginx", {})]),
    ]
    with serve_pods(sock, api_dir, Lister(pods)):
        answer = client.list()
    assert [(d.namespace, d.pod, d.container, d.device_id, d.sharing) for d in answer.devices] == [
        ("ml", "ddp-0", "rank0", GPU_A, "whole"),
        ("ml", "ddp-0", "rank1", GPU_B, "whole"),
        ("ml", "eval", "eval", MIG_A, "mig"),
        ("ml", "eval", "eval", MIG_B, "mig"),
        ("web", "render", "blender", f"{GPU_C}::3", "shared"),
    ]
    assert answer.status == "kubelet pod-resources: 3 pods hold 5 GPU devices"


def test_gpu_ids_count_under_any_resource_name_and_repeats_are_dropped(
    sock: Path, api_dir: Path, client: PodResourcesClient
) -> None:
    pods = [Pod("hpc", "job", [Container("c", {"example.com/gpu": [GPU_A, GPU_A], "example.com/fpga": ["fpga0"]})])]
    with serve_pods(sock, api_dir, Lister(pods)):
        answer = client.list()
    assert answer.devices == (PodDevice("hpc", "job", "c", "example.com/gpu", GPU_A, "whole"),)
    assert answer.status == "kubelet pod-resources: 1 pod holds 1 GPU device"


def test_no_gpu_allocated_is_still_an_answer(sock: Path, api_dir: Path, client: PodResourcesClient) -> None:
    with serve_pods(sock, api_dir, Lister([Pod("kube-system", "dns", [Container("coredns", {})])])):
        answer = client.list()
    assert answer == PodResources(available=True, status="kubelet pod-resources: no pod holds a GPU device")


@pytest.mark.parametrize(
    ("resource", "device_id", "kind"),
    [
        ("nvidia.com/gpu", GPU_A, "whole"),
        ("nvidia.com/gpu", f"{GPU_A}::2", "shared"),
        ("nvidia.com/gpu.shared", f"{GPU_A}::0", "shared"),
        ("nvidia.com/mig-3g.20gb", MIG_A, "mig"),
        ("nvidia.com/gpu", MIG_A, "mig"),
        ("nvidia.com/mig-1g.10gb.shared", f"{MIG_A}::1", "shared"),
        ("nvidia.com/GRID_T4-1Q", "f6b1c1d0-2a9e-4c3b-8d7e-1f2a3b4c5d6e", "vgpu"),
        ("nvidia.com/NVIDIA_A10-4Q_vGPU", "mdev-1", "vgpu"),
        ("nvidia.com/GA100_A100_PCIE_40GB", "0000:3b:00.0", "whole"),
    ],
)
def test_sharing_of(resource: str, device_id: str, kind: str) -> None:
    assert kind in SHARING_KINDS
    assert sharing_of(resource, device_id) == kind


def _fields(message: Any) -> list[tuple[str, int, int, int, str]]:
    return sorted((f.name, f.number, f.type, f.label, f.type_name) for f in message.field)


def test_runtime_descriptor_matches_api_proto(api_dir: Path) -> None:
    from google.protobuf import descriptor_pb2

    api_pb2, _ = compile_api(api_dir)
    compiled = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(compiled)
    upstream = {message.name: message for message in compiled.message_type}
    ours = podresources.api_descriptor()
    assert ours.package == compiled.package == "v1"
    assert len(ours.message_type) == 11
    for message in ours.message_type:
        assert _fields(message) == _fields(upstream[message.name]), message.name
    assert [m.name for m in compiled.service[0].method] == ["List", "GetAllocatableResources", "Get"]
    assert f"/{compiled.package}.{compiled.service[0].name}/List" == podresources.LIST_METHOD


def test_socket_absent(sock: Path, client: PodResourcesClient) -> None:
    assert client.list() == PodResources(
        available=False,
        status=f"No kubelet pod-resources socket at {sock}: not a Kubernetes node, or the socket is not mounted",
    )
    assert PodResourcesClient().socket_path == DEFAULT_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_regular_file_at_the_path(sock: Path, client: PodResourcesClient) -> None:
    sock.write_text("not a socket")
    answer = client.list()
    assert not answer.available
    assert answer.status == f"{sock} is not a socket, so it cannot be the kubelet pod-resources socket"


def test_stale_socket(sock: Path, client: PodResourcesClient) -> None:
    stale_socket(sock)
    answer = client.list()
    assert not answer.available
    assert answer.status == (
        f"Nobody listens on the kubelet pod-resources socket {sock}: it is stale, or the kubelet is down"
    )


def test_permission_denied(sock: Path, client: PodResourcesClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root may connect anyway, so the probe that tells why the kubelet refused is made to meet EACCES."""
    stale_socket(sock)

    class Denied(socket.socket):
        def connect(self, address: object) -> None:
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(socket, "socket", Denied)
    answer = client.list()
    assert answer.status == f"Permission denied on the kubelet pod-resources socket {sock}: nvdash needs to read it"


def test_garbage_answer(sock: Path, client: PodResourcesClient) -> None:
    with serve_garbage(sock):
        answer = client.list()
    assert answer == PodResources(
        available=False, status=f"The server at {sock} answered List with bytes that are not a pod-resources response"
    )


def test_server_without_the_service(sock: Path, client: PodResourcesClient) -> None:
    with serve_no_service(sock):
        answer = client.list()
    assert not answer.available
    assert answer.status == f"The server at {sock} does not offer the kubelet v1 pod-resources List call"


def test_listener_that_does_not_speak_grpc(sock: Path, client: PodResourcesClient) -> None:
    with serve_junk(sock) as callers:
        answer = client.list()
        assert callers[0] >= 1
    assert not answer.available
    assert answer.status == f"The server at {sock} does not answer as a gRPC server"


def test_deadline(sock: Path, api_dir: Path) -> None:
    client = PodResourcesClient(str(sock), timeout_s=0.5)
    lister = Lister([Pod("ml", "slow", [Container("c", {"nvidia.com/gpu": [GPU_A]})])], delay_s=60.0)
    with serve_pods(sock, api_dir, lister):
        started = time.monotonic()
        answer = client.list()
        elapsed = time.monotonic() - started
        assert answer == PodResources(
            available=False, status=f"The kubelet pod-resources socket {sock} gave no answer within 0.5 s"
        )
        assert elapsed < 0.5 + 5.0
        lister.delay_s = 0.0
        assert client.list().devices == (PodDevice("ml", "slow", "c", "nvidia.com/gpu", GPU_A, "whole"),)
    client.close()


def test_one_channel_kept_and_recreated_after_the_server_comes_back(
    sock: Path, api_dir: Path, client: PodResourcesClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real = grpc.insecure_channel

    def counting(target: str, *args: object, **kwargs: object) -> grpc.Channel:
        opened.append(target)
        return real(target, *args, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", counting)
    lister = Lister([Pod("ml", "train-0", [Container("c", {"nvidia.com/gpu": [GPU_A]})])])
    with serve_pods(sock, api_dir, lister):
        assert client.list().available
        lister.pods = [Pod("ml", "train-1", [Container("c", {"nvidia.com/gpu": [GPU_B]})])]
        assert [d.pod for d in client.list().devices] == ["train-1"]
    assert opened == [f"unix://{sock}"]

    down = client.list()
    assert not down.available
    assert down.status.startswith("No kubelet pod-resources socket at")
    assert len(opened) == 1
    stale_socket(sock)
    assert "stale" in client.list().status
    assert len(opened) == 2

    with serve_pods(sock, api_dir, lister):
        # A new channel to a server that just came back may fail its first connect on a loaded machine (gRPC fails
        # fast while connecting): each failure closes it, so the client is asked until it answers.
        back = wait_for(client.list, lambda answer: answer.available, timeout_s=30.0)
        recreated = len(opened)
        again = client.list()
    assert back.devices == (PodDevice("ml", "train-1", "c", "nvidia.com/gpu", GPU_B, "whole"),)
    assert recreated >= 3, "a new channel after the server came back"
    assert again.available
    assert len(opened) == recreated, "the channel that answers is kept"


MISSING = """
import json, sys
sys.modules[{module!r}] = None
from nvdash.sampling.kubelet import PodResourcesClient
answer = PodResourcesClient({path!r}).list()
print(json.dumps([answer.available, answer.status, len(answer.devices)]))
"""


@pytest.mark.parametrize("module", ["grpc", "google.protobuf"])
def test_optional_extra_missing(sock: Path, api_dir: Path, module: str) -> None:
    with serve_pods(sock, api_dir, Lister([Pod("ml", "p", [Container("c", {"nvidia.com/gpu": [GPU_A]})])])):
        result = subprocess.run(
            [sys.executable, "-c", MISSING.format(module=module, path=str(sock))],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout) == [
        False,
        "Kubernetes pod names need the optional extra: pip install nvdash[kubernetes]",
        0,
    ]


def test_watcher_keeps_the_latest_answer_and_refresh_asks_now(sock: Path, api_dir: Path) -> None:
    lister = Lister([Pod("ml", "train-0", [Container("c", {"nvidia.com/gpu": [GPU_A]})])])
    with serve_pods(sock, api_dir, lister):
        client = PodResourcesClient(str(sock))
        watcher = PodResourcesWatcher(client, interval_s=60.0)
        assert watcher.latest() == WAITING
        assert watcher.latest().status == "Asking the kubelet for pod resources..."
        assert not watcher.latest().available
        watcher.start()
        try:
            wait_until(lambda: watcher.latest().available)
            assert [d.pod for d in watcher.latest().devices] == ["train-0"]
            lister.pods = [
                Pod("ml", "train-1", [Container("c", {"nvidia.com/gpu": [GPU_A]})]),
                Pod("ml", "train-2", [Container("c", {"nvidia.com/gpu": [GPU_B]})]),
            ]
            assert [d.pod for d in watcher.latest().devices] == ["train-0"]
            refreshed = watcher.refresh()
            assert [d.pod for d in refreshed.devices] == ["train-1", "train-2"]
            assert watcher.latest() == refreshed
            assert watcher.latest().status == "kubelet pod-resources: 2 pods hold 2 GPU devices"
        finally:
            started = time.monotonic()
            watcher.stop(timeout_s=5.0)
            stopped_in = time.monotonic() - started
            client.close()
    assert not watcher.running
    assert stopped_in < 4.0


def test_watcher_asks_again_every_interval(sock: Path, api_dir: Path) -> None:
    lister = Lister([])
    with serve_pods(sock, api_dir, lister):
        client = PodResourcesClient(str(sock))
        watcher = PodResourcesWatcher(client, interval_s=0.05)
        watcher.start()
        try:
            wait_until(lambda: watcher.latest().available)
            lister.pods = [Pod("ml", "late", [Container("c", {"nvidia.com/gpu": [GPU_C]})])]
            wait_until(lambda: [d.pod for d in watcher.latest().devices] == ["late"])
            assert lister.calls >= 2
        finally:
            watcher.stop()
            client.close()


def test_watcher_survives_a_client_that_raises() -> None:
    class Broken:
        def list(self) -> PodResources:
            raise RuntimeError("boom")

    watcher = PodResourcesWatcher(Broken(), interval_s=60.0)
    watcher.start()
    try:
        wait_until(lambda: watcher.latest() != WAITING)
        assert watcher.latest() == PodResources(status="The kubelet pod-resources lookup failed: RuntimeError: boom")
        assert watcher.running
    finally:
        watcher.stop()


@pytest.mark.parametrize(
    ("resource", "device_id", "gpu"),
    [
        ("nvidia.com/gpu", "GPU-0a1b", True),
        ("nvidia.com/gpu.shared", "GPU-0a1b::3", True),
        ("nvidia.com/mig-1g.5gb", "MIG-0a1b", True),
        ("nvidia.com/GRID_T4-1Q", "f6b1c1d0-2a9e-4c3b-8d7e-1f2a3b4c5d6e", True),
        # The network operator's RDMA / SR-IOV resources are nvidia.com/ devices too, but not GPUs.
        ("nvidia.com/rdma_shared_device_a", "rdma-0", False),
        ("nvidia.com/sriov_netdevice", "0000:3b:00.2", False),
        ("example.com/nic", "eth1", False),
    ],
)
def test_only_gpu_resources_count_as_gpus(resource: str, device_id: str, gpu: bool) -> None:
    assert podresources.is_gpu(resource, device_id) is gpu


def test_watcher_runs_supervised_beats_each_answer_and_a_hung_call_shows_as_overdue() -> None:
    release = threading.Event()
    answers: list[int] = []

    class Hanging:
        def list(self) -> PodResources:
            answers.append(1)
            if len(answers) > 1:
                release.wait()  # a kubelet that accepts the call and never answers (past any deadline)
            return PodResources(status="kubelet pod-resources: no pod holds a GPU device")

    clock = [0.0]
    supervisor = Supervisor(monotonic=lambda: clock[0])
    watcher = PodResourcesWatcher(Hanging(), interval_s=0.01, supervisor=supervisor, expect_every_s=1.0)
    watcher.start()
    try:
        wait_until(lambda: supervisor.report().get("nvdash-kubelet", {}).get("last_beat_at") is not None)
        wait_until(lambda: len(answers) == 2)  # the second call hangs
        clock[0] = 60.0
        assert [item.name for item in supervisor.overdue()] == ["nvdash-kubelet"]
        assert supervisor.report()["nvdash-kubelet"]["running"] is True
    finally:
        release.set()
        watcher.stop()
    assert supervisor.report()["nvdash-kubelet"]["running"] is False
