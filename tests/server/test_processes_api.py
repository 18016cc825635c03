"""``/api/processes.json`` and MIG in ``/api/snapshot.json`` on a real server, with a real kubelet gRPC server."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdash.sampling.fake.mig import mig_uuid
from nvdash.sampling.fake.profiles import gpu_uuid
from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE
from tests.conftest import get_json, nvdash_server, wait_for
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

MiB = 1024 * 1024


def test_processes_and_mig_instances_are_served(tmp_path: Path) -> None:
    absent = tmp_path / "kubelet.sock"
    args = ["--simulate", "a100-mig", "--interval", "0.25", "--process-interval", "0.5",
            "--kubelet-socket", str(absent)]
    with nvdash_server(args) as server:
        doc = wait_for(lambda: get_json(server.url + "/api/processes.json"), lambda d: not d["collecting"],
                       timeout_s=60.0)
        assert doc["kubernetes"] == {
            "available": False,
            "status": f"No kubelet pod-resources socket at {absent}: not a Kubernetes node, "
            "or the socket is not mounted",
        }
        first, second = doc["gpus"]
        assert first["mig"]["enabled"] is True
        assert not first["process_utilization"]
        assert second["process_utilization"]
        profiles = [(i["profile"], i["placement_start"], i["memory_total_bytes"]) for i in first["mig"]["instances"]]
        assert profiles == [("3g.20gb", 4, 20096 * MiB), ("2g.10gb", 0, 9984 * MiB), ("1g.5gb", 2, 4864 * MiB),
                            ("1g.5gb", 3, 4864 * MiB)]
        processes = {p["pid"]: p for p in doc["processes"]}
        assert set(processes) == {GHOST_PID_BASE + n for n in (200, 201, 210, 220, 101)}
        big = processes[GHOST_PID_BASE + 200]
        assert big["gpu"] == 0
        assert big["mig_profile"] == "3g.20gb"
        assert big["mig_uuid"] == first["mig"]["instances"][0]["uuid"]
        assert big["gpu_memory_bytes"] == 14000 * MiB
        assert big["sm_pct"] is None
        assert big["visible"] is False
        assert big["user"] is None
        assert big["types"] == ["compute"]
        rank = processes[GHOST_PID_BASE + 101]
        assert rank["mig_uuid"] is None
        assert 0 <= rank["sm_pct"] <= 100
        assert doc["allocations"] == []
        snapshot = get_json(server.url + "/api/snapshot.json")
        assert snapshot["gpus"][0]["mig"]["enabled"] is True
        assert [i["profile"] for i in snapshot["gpus"][0]["mig"]["instances"]] == ["3g.20gb", "2g.10gb", "1g.5gb",
                                                                                   "1g.5gb"]
        assert snapshot["gpus"][0]["utilization_pct"] is None  # nvidia-smi: N/A for a GPU in MIG mode
        assert snapshot["gpus"][1]["mig"]["instances"] == []


def test_pods_from_the_kubelet_name_processes_and_idle_allocations(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sock = tmp_path / "kubelet.sock"
    uuids = [gpu_uuid("a100-mig", 0, i) for i in range(2)]
    big = mig_uuid(uuids[0], 1, 0)
    empty = mig_uuid(uuids[0], 14, 0)
    lister = Lister(pods=[
        Pod("research", "llm-finetune", [Container("trainer", {"nvidia.com/mig-3g.20gb": [big]})]),
        Pod("research", "notebook", [Container("jupyter", {"nvidia.com/mig-1g.5gb": [empty]})]),
        Pod("prod", "ranker", [Container("main", {"nvidia.com/gpu": [uuids[1]]})]),
    ])
    args = ["--simulate", "a100-mig", "--interval", "0.25", "--process-interval", "0.5", "--kubelet-socket", str(sock)]
    with serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister), nvdash_server(args) as server:
        doc = wait_for(lambda: get_json(server.url + "/api/processes.json"),
                        lambda d: not d["collecting"] and d["kubernetes"]["available"], timeout_s=60.0)
        assert doc["kubernetes"]["status"] == "kubelet pod-resources: 3 pods hold 3 GPU devices"
        pods = {p["pid"]: p["pod"] for p in doc["processes"]}
        assert pods[GHOST_PID_BASE + 200] == {"uid": None, "namespace": "research", "name": "llm-finetune",
                                              "container": "trainer", "qos": None}
        assert pods[GHOST_PID_BASE + 101]["name"] == "ranker"
        assert pods[GHOST_PID_BASE + 210] is None
        allocations = {a["pod"]: a for a in doc["allocations"]}
        assert allocations["notebook"]["idle"] is True
        assert allocations["notebook"]["sharing"] == "mig"
        assert allocations["notebook"]["uuid"] == empty
        assert allocations["llm-finetune"]["idle"] is False
        assert allocations["ranker"]["idle"] is False
        assert allocations["ranker"]["sharing"] == "whole"
