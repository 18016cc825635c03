"""Pods that got their GPU through a DRA claim, attributed by a real server on every HTTP surface.

A real ``python -m nvdash --simulate h100-mig`` subprocess (GPU 0 in MIG mode, GPU 1 whole; the simulation's minor
numbers run in reverse order of the index, so GPU 1 is ``/dev/nvidia0``). A real pod-resources gRPC server gives
three pods nothing but DRA claims: a whole GPU, a MIG device, and a device of another driver. Real processes sit
in the pods' cgroups and the simulation lists them on their GPU and MIG device.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdash.sampling.fake.mig import mig_uuid
from nvdash.sampling.fake.profiles import PROFILES, gpu_uuid
from tests.conftest import get_json, nvdash_server, wait_for
from tests.server.kubelet_pods import kubelet_cgroups, place, pod_log_dirs, sleeping
from tests.server.test_shares_e2e import families, unit_of
from tests.unit.kubelet_server import Claim, ClaimResource, Container, Lister, Pod, serve_pods

NAMESPACE = "team"
CONTAINER = "main"
GPU0 = gpu_uuid("h100-mig", 0, 0)
GPU1 = gpu_uuid("h100-mig", 0, 1)
SPEC_3G = dict(PROFILES["h100-mig"].mig_layout)[0][0]
MIG_3G = mig_uuid(GPU0, SPEC_3G.gpu_instance_id, SPEC_3G.compute_instance_id)
CDI = "k8s.gpu.nvidia.com/claim=5b0c7d2e-8a41-4f3e-9c6d-2e7f1a3b4c5d-gpu-0"
PODS = {
    # pod: (claim, driver, device, the GPU or MIG device it is)
    "trainer": ("whole-gpu", "gpu.nvidia.com", "gpu-0", GPU1),
    "notebook": ("mig-slice", "gpu.nvidia.com", "gpu-1-mig-3g40gb-9-4", MIG_3G),
    "router": ("rdma", "dra.net", "eth1", None),
}


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    with sleeping(2) as started:
        yield started


def test_a_pod_with_only_a_dra_claim_is_attributed_on_processes_json_and_metrics(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    logs = tmp_path / "pods"
    sock = tmp_path / "kubelet.sock"
    lister = Lister(pods=[
        Pod(NAMESPACE, pod, [Container(CONTAINER, {}, [
            Claim(NAMESPACE, claim, [ClaimResource(driver, "node-a", device, [CDI] if device == "gpu-0" else [])])])])
        for pod, (claim, driver, device, _) in PODS.items()])
    trainer, notebook = sleepers
    listed = f"process:1:{trainer.pid}:0.6:4000;process:0/0:{notebook.pid}:0.85:24000"
    with kubelet_cgroups(3) as cgroups, serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister):
        place(trainer.pid, cgroups[0][1])
        place(notebook.pid, cgroups[1][1])
        pod_log_dirs(logs, [(NAMESPACE, pod, pod_uid, CONTAINER) for pod, (pod_uid, _) in zip(PODS, cgroups,
                                                                                               strict=True)])
        args = ["--simulate", "h100-mig", "--interval", "0.25", "--process-interval", "1", "--no-history",
                "--kubelet-socket", str(sock), "--pod-log-dir", str(logs), "--metrics-pods"]
        with nvdash_server(args, env={"NVDASH_FAKE_FAULTS": f"clear_processes:0;clear_processes:1;{listed}"}) as server:
            def document() -> dict[str, Any]:
                return get_json(server.url + "/api/processes.json")

            def attributed(found: dict[str, Any]) -> bool:
                units = [unit_of(found, uuid) for uuid in (GPU1, MIG_3G)]
                return all(u is not None and u["owners"] and u["owners"][0]["sm_pct"] for u in units)

            found = wait_for(document, attributed, timeout_s=60.0)

            # The processes: named after their pods and containers (the container comes from the claim alone).
            processes = {p["pid"]: p for p in found["processes"]}
            for child, pod, gpu, mig in ((trainer, "trainer", 1, None), (notebook, "notebook", 0, MIG_3G)):
                process = processes[child.pid]
                assert (process["gpu"], process["mig_uuid"]) == (gpu, mig)
                assert (process["pod"]["namespace"], process["pod"]["name"], process["pod"]["container"]) == (
                    NAMESPACE, pod, CONTAINER)

            # The allocations: the two NVIDIA devices on their GPU and MIG device, the other driver's kept with a note.
            allocations = {a["pod"]: a for a in found["allocations"]}
            assert allocations == {
                "trainer": {"namespace": NAMESPACE, "pod": "trainer", "container": CONTAINER,
                            "resource_name": "gpu.nvidia.com (DRA claim team/whole-gpu)", "device_id": GPU1,
                            "uuid": GPU1, "sharing": "whole", "idle": False, "note": None},
                "notebook": {"namespace": NAMESPACE, "pod": "notebook", "container": CONTAINER,
                             "resource_name": "gpu.nvidia.com (DRA claim team/mig-slice)", "device_id": MIG_3G,
                             "uuid": MIG_3G, "sharing": "mig", "idle": False, "note": None},
                "router": {"namespace": NAMESPACE, "pod": "router", "container": CONTAINER,
                           "resource_name": "dra.net (DRA claim team/rdma)", "device_id": "dra.net/node-a/eth1",
                           "uuid": "dra.net/node-a/eth1", "sharing": "whole", "idle": True,
                           "note": "DRA device eth1 of driver dra.net: not an NVIDIA GPU driver"},
            }
            assert found["kubernetes"]["status"] == ("kubelet pod-resources: no pod holds a device-plugin GPU; "
                                                     "DRA claims give 3 pods 3 devices; "
                                                     "1 DRA device not mapped to a GPU here")

            # The shares: each unit's one owner is its pod, with all of the unit's measured activity.
            for uuid, pod, sharing in ((GPU1, "trainer", "whole"), (MIG_3G, "notebook", "mig")):
                unit = unit_of(found, uuid)
                assert unit is not None
                (owner,) = unit["owners"]
                assert (owner["kind"], owner["namespace"], owner["pod"], owner["container"]) == (
                    "pod", NAMESPACE, pod, CONTAINER)
                assert unit["sharing"] == sharing

            # /metrics: the DCGM series of GPU 1 and of the 3g.40gb instance carry their pods (--metrics-pods), and
            # the per-pod families name them.
            def metrics() -> Any:
                return families(server)

            def labelled(scrape: Any) -> bool:
                return any(labels.get("pod") == "trainer" for labels, _ in scrape.get("DCGM_FI_DEV_GPU_UTIL", []))

            scrape = wait_for(metrics, labelled, timeout_s=30.0)
            util = {labels["gpu"]: labels for labels, _ in scrape["DCGM_FI_DEV_GPU_UTIL"]}
            assert (util["1"]["namespace"], util["1"]["pod"], util["1"]["container"]) == (NAMESPACE, "trainer",
                                                                                         CONTAINER)
            used = {(labels.get("GPU_I_ID"), labels.get("pod")) for labels, _ in scrape["DCGM_FI_DEV_FB_USED"]
                    if labels["gpu"] == "0"}
            assert (str(SPEC_3G.gpu_instance_id), "notebook") in used
            allocated = {(labels["pod"], labels["UUID"], labels.get("GPU_I_ID"), labels["sharing"], labels["resource"])
                         for labels, _ in scrape["nvdash_pod_gpu_allocated"]}
            assert allocated == {
                ("trainer", GPU1, None, "whole", "gpu.nvidia.com (DRA claim team/whole-gpu)"),
                ("notebook", GPU0, str(SPEC_3G.gpu_instance_id), "mig", "gpu.nvidia.com (DRA claim team/mig-slice)"),
            }
            shares = {labels["pod"] for labels, _ in scrape["nvdash_pod_gpu_sm_share_ratio"]}
            assert shares == {"trainer", "notebook"}

            # Accounting: each pod is charged its busy GPU or MIG device.
            def pod_rows() -> dict[str, dict[str, Any]]:
                rows = get_json(server.url + "/api/accounting.json?range=today&by=pod")["rows"]
                return {row["key"]: row for row in rows if row["key"].startswith(f"{NAMESPACE}/")}

            rows = wait_for(pod_rows, lambda r: len(r) == 2 and all(x["busy_hours"] > 0 for x in r.values()),
                            timeout_s=60.0)
            assert {key: row["gpus"] for key, row in rows.items()} == {
                f"{NAMESPACE}/trainer": [1], f"{NAMESPACE}/notebook": [0]}
