"""``/metrics`` on a real server with MIG, pods from a real kubelet gRPC server, and processes.

The simulated ``a100-mig`` node: GPU 0 in MIG mode (3g.20gb GI 1, 2g.10gb GI 5, 1g.5gb GI 13 and 14), GPU 1 whole.
An instance's framebuffer figures follow the fake driver's MIG memory: each instance's own context
(``MIG_EMPTY_INSTANCE_MIB``) plus the fixed memory of its processes, out of its profile's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.metrics.fields import POD_SHARE_FAMILIES, QUOTA_FAMILIES
from nvdash.sampling.fake.mig import mig_uuid
from nvdash.sampling.fake.profiles import PROFILES, gpu_uuid
from nvdash.sampling.fake.usage_specs import A100_40GB_MIG_PROFILES, GHOST_PID_BASE, MIG_EMPTY_INSTANCE_MIB
from tests.conftest import NvdashServer, nvdash_server, wait_for
from tests.server.test_metrics_endpoint import scrape
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

MiB = 1024 * 1024
GPU_UUIDS = [gpu_uuid("a100-mig", 0, index) for index in range(2)]
LAYOUT = dict(PROFILES["a100-mig"].mig_layout)[0]
PROCESS_MIB = {spec.pid: spec.memory_mib for spec in PROFILES["a100-mig"].processes if spec.mig is not None}
INSTANCE_USED_MIB = {
    str(spec.gpu_instance_id): MIG_EMPTY_INSTANCE_MIB + sum(
        p.memory_mib for p in PROFILES["a100-mig"].processes if p.gpu == 0 and p.mig == index)
    for index, spec in enumerate(LAYOUT)
}
"""GI id -> MiB used: 3g.20gb 13 + 14000 + 4096, 2g.10gb 13 + 8192, 1g.5gb 13 + 3000, the empty 1g.5gb 13."""
BIG, EMPTY = mig_uuid(GPU_UUIDS[0], 1, 0), mig_uuid(GPU_UUIDS[0], 14, 0)
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}

Families = dict[str, list[tuple[dict[str, str], float]]]


def read(server: NvdashServer) -> Families:
    status, text, _ = scrape(server.url)
    assert status == 200
    return {family.name: [(s.labels, s.value) for s in family.samples] for family in parse_text(text)}


def args(sock: Path, *extra: str) -> list[str]:
    return ["--simulate", "a100-mig", "--interval", "0.25", "--process-interval", "0.5", "--no-history",
            "--kubelet-socket", str(sock), *extra]


def lister() -> Lister:
    """The 3g.20gb instance and the empty 1g.5gb one to two pods; GPU 1 time-sliced, a replica to each of two
    more pods and a second replica to the first of them."""
    shared = "nvidia.com/gpu.shared"
    return Lister(pods=[
        Pod("research", "llm-finetune", [Container("trainer", {"nvidia.com/mig-3g.20gb": [BIG]})]),
        Pod("research", "notebook", [Container("jupyter", {"nvidia.com/mig-1g.5gb": [EMPTY]})]),
        Pod("prod", "ranker-a", [Container("main", {shared: [f"{GPU_UUIDS[1]}::0", f"{GPU_UUIDS[1]}::3"]})]),
        Pod("prod", "ranker-b", [Container("main", {shared: [f"{GPU_UUIDS[1]}::1"]})]),
    ])


def until(server: NvdashServer, check: Callable[[Families], bool]) -> Families:
    result: Families = wait_for(lambda: read(server), check, timeout_s=60.0)
    return result


def test_mig_instances_and_processes_without_pod_labels(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sock = tmp_path / "kubelet.sock"
    with serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister()), \
            nvdash_server(args(sock, "--metrics-processes")) as server:
        found = until(server, lambda f: len(f.get("DCGM_FI_DEV_FB_USED", [])) == 2 + 4
                      and len(f.get("nvdash_process_gpu_memory_bytes", [])) == 5)
        used = {labels.get("GPU_I_ID"): (labels, value) for labels, value in found["DCGM_FI_DEV_FB_USED"]
                if labels["gpu"] == "0"}
        assert set(used) == {None, "1", "5", "13", "14"}
        for gi, (labels, value) in used.items():
            if gi is None:
                assert set(labels) == GPU_LABELS  # the GPU's own series stays as it is
                continue
            assert set(labels) == GPU_LABELS | {"GPU_I_PROFILE", "GPU_I_ID"}
            assert labels["UUID"] == GPU_UUIDS[0]  # dcgm-exporter: the parent GPU's UUID on a MIG series
            assert labels["device"] == "nvidia0"
            assert value == INSTANCE_USED_MIB[gi]
        assert used["1"] == ({**used["1"][0], "GPU_I_PROFILE": "3g.20gb"}, 13 + 14000 + 4096)
        assert used["14"][1] == 13
        assert used[None][1] == sum(INSTANCE_USED_MIB.values())  # the GPU's used memory: all its instances'
        free = {labels.get("GPU_I_ID"): value for labels, value in found["DCGM_FI_DEV_FB_FREE"]
                if labels["gpu"] == "0"}
        for spec in LAYOUT:
            gi = str(spec.gpu_instance_id)
            assert free[gi] == A100_40GB_MIG_PROFILES[spec.profile].memory_mib - INSTANCE_USED_MIB[gi]
        # No activity per instance on an A100 (no GPM), and no GPU utilization on a GPU in MIG mode.
        assert {labels["gpu"] for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"]} == {"1"}
        assert all("GPU_I_ID" not in labels for labels, _ in found.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE", []))
        # The kubelet serves allocations, but without --metrics-pods no device series carries them: only the
        # per-pod share and quota families, which name their pod by definition.
        per_pod = {name.removesuffix("_total") for name in (*POD_SHARE_FAMILIES, *QUOTA_FAMILIES)}
        assert all("pod" not in labels for name, family in found.items() if name not in per_pod
                   for labels, _ in family)
        assert "nvdash_pod_gpu_allocated" not in found
        memory = {labels["pid"]: (labels, value) for labels, value in found["nvdash_process_gpu_memory_bytes"]}
        assert set(memory) == {str(GHOST_PID_BASE + n) for n in (200, 201, 210, 220, 101)}
        for pid, mib in PROCESS_MIB.items():
            labels, value = memory[str(pid)]
            assert value == mib * MiB
            assert labels["UUID"] == GPU_UUIDS[0]
            assert labels["process_name"] == ""  # another PID namespace: the host cannot name it
        assert memory[str(GHOST_PID_BASE + 200)][0]["GPU_I_ID"] == "1"
        assert memory[str(GHOST_PID_BASE + 220)][0]["GPU_I_PROFILE"] == "1g.5gb"
        assert "GPU_I_ID" not in memory[str(GHOST_PID_BASE + 101)][0]
        ratios = {labels["pid"]: value for labels, value in found["nvdash_process_sm_utilization_ratio"]}
        assert set(ratios) == {str(GHOST_PID_BASE + 101)}  # NVML has no per-process utilization on MIG
        assert 0 <= ratios[str(GHOST_PID_BASE + 101)] <= 1


def test_pod_labels_follow_the_kubelets_allocations(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    sock = tmp_path / "kubelet.sock"
    with serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister()), \
            nvdash_server(args(sock, "--metrics-pods")) as server:
        found = until(server, lambda f: len(f.get("nvdash_pod_gpu_allocated", [])) == 4)
        util = found["DCGM_FI_DEV_GPU_UTIL"]
        # GPU 1, time-sliced between two pods: its series once per pod, the same value on each.
        assert sorted(labels["pod"] for labels, _ in util) == ["ranker-a", "ranker-b"]
        assert len({value for _, value in util}) == 1
        assert all(set(labels) == GPU_LABELS | {"namespace", "pod", "container"} for labels, _ in util)
        used = {(labels.get("GPU_I_ID"), labels.get("pod")): value for labels, value in found["DCGM_FI_DEV_FB_USED"]
                if labels["gpu"] == "0"}
        assert used == {(None, None): sum(INSTANCE_USED_MIB.values()), ("1", "llm-finetune"): INSTANCE_USED_MIB["1"],
                        ("5", None): INSTANCE_USED_MIB["5"], ("13", None): INSTANCE_USED_MIB["13"],
                        ("14", "notebook"): INSTANCE_USED_MIB["14"]}
        allocated = {(labels["pod"], labels.get("GPU_I_ID"), labels["sharing"], labels["resource"]): value
                     for labels, value in found["nvdash_pod_gpu_allocated"]}
        assert allocated == {
            ("llm-finetune", "1", "mig", "nvidia.com/mig-3g.20gb"): 1.0,
            ("notebook", "14", "mig", "nvidia.com/mig-1g.5gb"): 1.0,
            ("ranker-a", None, "shared", "nvidia.com/gpu.shared"): 2.0,
            ("ranker-b", None, "shared", "nvidia.com/gpu.shared"): 1.0,
        }
        # The empty 1g.5gb instance runs nothing: idle. GPU 1's rank cannot be told to one of its two pods, so
        # both count as busy; the 3g.20gb instance's processes belong to llm-finetune.
        idle = {labels["pod"]: value for labels, value in found["nvdash_pod_gpu_idle"]}
        assert idle == {"llm-finetune": 0.0, "notebook": 1.0, "ranker-a": 0.0, "ranker-b": 0.0}
        assert "nvdash_process_gpu_memory_bytes" not in found  # --metrics-processes is off
