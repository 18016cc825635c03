"""The usage collector end to end: fake NVML under the real pynvml, real child processes, a real kubelet gRPC server.

Processes the host can see are real children of this test. Where a test needs a process to sit in a given cgroup
(a pod's, or a plain login session's), it looks the child up through a proc root whose ``cgroup`` file is written
by the test and whose other files are the child's own (symlinks into ``/proc``).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvdash.sampling.cgroups import pod_names_from_logs
from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.kubelet import PodResourcesClient, PodResourcesWatcher
from nvdash.sampling.nvml_source import NvmlSource
from nvdash.sampling.usage import UsageCollector
from nvdash.sampling.usage_records import GpuProcess, Usage
from tests.conftest import wait_for
from tests.unit.conftest import FakeClock, open_source
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

POD_UID = "7f3c2a10-5b6e-4d8f-9a1b-2c3d4e5f6a7b"
K8S_CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    + POD_UID.replace("-", "_")
    + ".slice/cri-containerd-"
    + "4f2b" * 16
    + ".scope\n"
)
SESSION_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"


@pytest.fixture
def h100(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    for source, fake in open_source("dgx-h100", clock):
        source.open()
        clock.at(60.0)
        yield source, fake


@pytest.fixture
def children() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--nvdash-test-child"])
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        child.wait(10)


def proc_root_with_cgroup(root: Path, pid: int, cgroup: str) -> Path:
    """A proc root where ``pid`` is the real process (links to its files: read it with ``follow_links``) except for
    its ``cgroup`` file."""
    root.mkdir(exist_ok=True)
    if not (root / "stat").exists():
        (root / "stat").symlink_to("/proc/stat")
    own = root / str(pid)
    own.mkdir()
    for name in os.listdir(f"/proc/{pid}"):
        if name != "cgroup":
            (own / name).symlink_to(f"/proc/{pid}/{name}")
    (own / "cgroup").write_text(cgroup)
    return root


def by_pid(usage: Usage) -> dict[int, GpuProcess]:
    return {(p.pid): p for p in usage.processes}


def test_visible_processes_get_host_details_and_others_are_marked_not_visible(
    h100: tuple[NvmlSource, FakeNvmlLibrary], children: Callable[[], subprocess.Popen[bytes]]
) -> None:
    source, fake = h100
    child = children()
    fake.add_process(7, child.pid, memory_mib=300)
    collector = UsageCollector(source, HostProcessTable())
    me = pwd.getpwuid(os.getuid()).pw_name  # looked up off the collector's thread: "uid N" until then
    usage = wait_for(lambda: collector.collect(time.time(), 10.0),
                     lambda u: getattr(by_pid(u)[child.pid].host, "user", None) == me)
    processes = by_pid(usage)
    mine = processes[child.pid]
    assert mine.gpu_index == 7
    assert mine.gpu_memory_bytes == 300 * 1024 * 1024
    assert mine.host is not None
    assert mine.host.user == pwd.getpwuid(os.getuid()).pw_name
    assert mine.host.command is not None
    assert "--nvdash-test-child" in mine.host.command
    assert mine.host.rss_bytes is not None
    assert mine.host.rss_bytes > 0
    assert mine.host.started_s is not None
    assert abs(mine.host.started_s - time.time()) < 120
    ghost = processes[GHOST_PID_BASE + 100]
    assert not ghost.visible
    assert ghost.host is None
    assert ghost.gpu_memory_bytes is not None
    assert ghost.gpu_memory_bytes > 0
    assert usage.pods.status == "Kubernetes pod lookup is off."
    assert [gpu.index for gpu in usage.gpus] == list(range(8))


def test_an_exited_process_loses_its_host_details_then_disappears(
    h100: tuple[NvmlSource, FakeNvmlLibrary], children: Callable[[], subprocess.Popen[bytes]]
) -> None:
    source, fake = h100
    child = children()
    fake.add_process(7, child.pid)
    collector = UsageCollector(source, HostProcessTable())
    assert by_pid(collector.collect(time.time(), 10.0))[child.pid].visible
    child.kill()
    child.wait(10)
    # NVML may still list a process for a moment after it exited: listed, not visible, no error.
    assert not by_pid(collector.collect(time.time(), 10.0))[child.pid].visible
    fake.remove_process(child.pid)
    assert child.pid not in by_pid(collector.collect(time.time(), 10.0))


@pytest.fixture
def kubelet(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lister, PodResourcesWatcher]]:
    sock = tmp_path / "kubelet.sock"
    lister = Lister()
    with serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister):
        client = PodResourcesClient(str(sock))
        watcher = PodResourcesWatcher(client, interval_s=60.0)
        yield lister, watcher
        client.close()


def test_pods_name_the_processes_on_gpus_allocated_to_them(
    h100: tuple[NvmlSource, FakeNvmlLibrary], kubelet: tuple[Lister, PodResourcesWatcher], tmp_path: Path,
    children: Callable[[], subprocess.Popen[bytes]],
) -> None:
    source, fake = h100
    lister, watcher = kubelet
    uuids = [gpu.uuid for gpu in source.gpus]
    lister.pods = [
        Pod("ml", "train-0", [Container("trainer", {"nvidia.com/gpu": [uuids[0], uuids[1]]})]),
        Pod("serving", "infer-5d8", [Container("server", {"nvidia.com/gpu": [uuids[7]]})]),
        Pod("dev", "a", [Container("main", {"nvidia.com/gpu.shared": [f"{uuids[6]}::0"]})]),
        Pod("dev", "b", [Container("main", {"nvidia.com/gpu.shared": [f"{uuids[6]}::1"]})]),
    ]
    assert watcher.refresh().available
    # A host process in a plain login session on GPU 1: never named after the pod that holds GPU 1.
    outsider = children()
    fake.add_process(1, outsider.pid)
    host = HostProcessTable(proc_root_with_cgroup(tmp_path / "proc", outsider.pid, SESSION_CGROUP), follow_links=True)
    usage = UsageCollector(source, host, watcher).collect(time.time(), 10.0)
    processes = by_pid(usage)
    rank0 = processes[GHOST_PID_BASE + 100]
    assert (rank0.pod_namespace, rank0.pod_name, rank0.container_name) == ("ml", "train-0", "trainer")
    assert processes[GHOST_PID_BASE + 101].pod_name == "train-0"
    assert processes[outsider.pid].visible
    assert processes[outsider.pid].pod_name is None
    # GPU 6 is shared by two pods: its (invisible) MPS processes cannot be told apart, so no pod is named.
    assert all(processes[GHOST_PID_BASE + n].pod_name is None for n in (600, 601, 602))
    # GPU 7 is allocated but runs nothing: allocated, idle. GPU 6's pods may own its processes: not idle.
    idle = usage.idle_allocations()
    assert [(d.namespace, d.pod, d.uuid, d.sharing) for d in idle] == [("serving", "infer-5d8", uuids[7], "whole")]
    assert usage.pods.available


def test_a_pod_uid_in_the_cgroup_and_the_pod_log_dirs_name_a_process_on_a_shared_gpu(
    h100: tuple[NvmlSource, FakeNvmlLibrary], kubelet: tuple[Lister, PodResourcesWatcher], tmp_path: Path,
    children: Callable[[], subprocess.Popen[bytes]],
) -> None:
    source, fake = h100
    lister, watcher = kubelet
    uuid = source.gpus[7].uuid
    lister.pods = [
        Pod("dev", "alice", [Container("main", {"nvidia.com/gpu.shared": [f"{uuid}::0"]})]),
        Pod("dev", "bob", [Container("main", {"nvidia.com/gpu.shared": [f"{uuid}::1"]})]),
    ]
    watcher.refresh()
    child = children()
    fake.add_process(7, child.pid)
    logs = tmp_path / "pods"
    (logs / f"dev_alice_{POD_UID}" / "main").mkdir(parents=True)
    (logs / "dev_bob_0b8e6f2c-1d2e-4f3a-9b8c-7d6e5f4a3b2c" / "main").mkdir(parents=True)
    host = HostProcessTable(proc_root_with_cgroup(tmp_path / "proc", child.pid, K8S_CGROUP), follow_links=True)
    usage = UsageCollector(source, host, watcher, lambda: pod_names_from_logs(logs)).collect(time.time(), 10.0)
    process = by_pid(usage)[child.pid]
    assert process.host is not None
    assert process.host.cgroup.pod_uid == POD_UID
    assert process.host.cgroup.qos == "burstable"
    assert (process.pod_namespace, process.pod_name, process.container_name) == ("dev", "alice", "main")
    # bob holds a share of the same GPU and runs nothing on it.
    assert [d.pod for d in usage.idle_allocations()] == ["bob"]


def test_mig_instances_allocated_to_pods(clock: FakeClock, kubelet: tuple[Lister, PodResourcesWatcher]) -> None:
    lister, watcher = kubelet
    for source, _ in open_source("a100-mig", clock):
        source.open()
        first = UsageCollector(source, HostProcessTable()).collect(time.time(), 10.0)
        instances = first.gpus[0].instances
        lister.pods = [
            Pod("team-a", "big", [Container("c", {"nvidia.com/mig-3g.20gb": [instances[0].uuid]})]),
            Pod("team-b", "tiny", [Container("c", {"nvidia.com/mig-1g.5gb": [instances[3].uuid]})]),
        ]
        watcher.refresh()
        usage = UsageCollector(source, HostProcessTable(), watcher).collect(time.time(), 10.0)
        processes = by_pid(usage)
        big = processes[GHOST_PID_BASE + 200]
        assert (big.mig_uuid, big.mig_profile) == (instances[0].uuid, "3g.20gb")
        assert (big.pod_namespace, big.pod_name) == ("team-a", "big")
        assert big.sm_pct is None  # not reported per process under MIG
        assert processes[GHOST_PID_BASE + 210].pod_name is None  # the 2g.10gb instance is no pod's
        assert [(d.pod, d.sharing) for d in usage.idle_allocations()] == [("tiny", "mig")]


def test_without_nvml_the_collector_reports_no_gpu(children: Callable[[], subprocess.Popen[bytes]]) -> None:
    usage = UsageCollector(None, HostProcessTable()).collect(123.0, 1.0)
    assert (usage.time_s, usage.gpus, usage.processes) == (123.0, (), ())


def test_the_kubelet_watcher_status_reaches_the_usage_when_the_socket_is_absent(
    h100: tuple[NvmlSource, FakeNvmlLibrary], tmp_path: Path
) -> None:
    source, _ = h100
    watcher = PodResourcesWatcher(PodResourcesClient(str(tmp_path / "absent.sock")), interval_s=60.0)
    watcher.refresh()
    usage = UsageCollector(source, HostProcessTable(), watcher).collect(time.time(), 10.0)
    assert not usage.pods.available
    assert str(tmp_path / "absent.sock") in usage.pods.status
    assert usage.processes  # processes are still listed without the kubelet
