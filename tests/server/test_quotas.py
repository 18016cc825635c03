"""vGPU quotas against use, end to end, on a real server (``--simulate vgpu``).

- Real child processes whose environments carry HAMi's quota variables sit in real cgroup v1 pod directories, are
  named by the kubelet's pod log directories and a real pod-resources gRPC server (HAMi's ``GPU-<uuid>-<n>`` ids
  under ``nvidia.com/gpu``), and are listed on the simulated GPU 1 (``process:`` fault items): the pod over its
  memory quota is flagged from the first reading and the one under it never, on ``/api/processes.json``,
  ``/metrics`` and the GPU Health page; the pod above its core quota only once 3 readings in a row showed it.
- A real server flags use of a GPU that no pod was allocated while pods hold the other one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nvdash.health.quota_judge import SUSTAIN_READINGS
from nvdash.health.quotas import COMPUTE_TOLERANCE_PCT
from nvdash.sampling.fake.profiles import gpu_uuid
from nvdash.sampling.hardware import open_hardware
from tests.conftest import NvdashServer, get_json, http_get, nvdash_server, wait_for
from tests.server.bokeh_viewer import open_session, receive_until
from tests.server.kubelet_pods import kubelet_cgroups, place, pod_log_dirs, sleeping
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

MIB = 1 << 20
GPU0, GPU1 = gpu_uuid("vgpu", 0, 0), gpu_uuid("vgpu", 0, 1)
PROCESS_INTERVAL_S = 2.0
"""Long enough that the test's polling (every 0.2 s) sees each of the first readings."""
HAMI_PODS = (
    # pod, SM share of GPU 1's work, MiB held, CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT
    ("over", 0.0, 2500, "2000m", "30"),
    ("under", 0.0, 700, "1g", "30"),
    ("busy", 1.0, 500, "1g", "1"),
)
CORE_QUOTA_PCT = 1.0
BUSY_FROM_S = 12.0
"""The busy pod's work starts this long after the server's start (``process:...@SECONDS``), so that the test sees it
below its quota first, however slowly the server starts on a loaded machine."""


@contextlib.contextmanager
def hami_server(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NvdashServer]:
    """The three HAMi pods of :data:`HAMI_PODS` on GPU 1 (their kubelet ids ``<GPU 1>-<n>``), the profile's own
    processes left on GPU 0, which no pod holds."""
    envs = [{"NVIDIA_VISIBLE_DEVICES": GPU1, "CUDA_DEVICE_MEMORY_LIMIT_0": memory, "CUDA_DEVICE_SM_LIMIT": cores,
             **({"TOKEN": "s3cr3t"} if name == "over" else {})} for name, _, _, memory, cores in HAMI_PODS]
    logs = tmp_path / "pods"
    sock = tmp_path / "kubelet.sock"
    lister = Lister(pods=[Pod("ml", name, [Container("main", {"nvidia.com/gpu": [f"{GPU1}-{n}"]})])
                          for n, (name, *_) in enumerate(HAMI_PODS)])
    with sleeping(len(HAMI_PODS), envs) as children, kubelet_cgroups(len(HAMI_PODS)) as cgroups, \
            serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister):
        for child, (_, leaf) in zip(children, cgroups, strict=True):
            place(child.pid, leaf)
        pod_log_dirs(logs, [("ml", name, pod_uid, "main")
                            for (name, *_), (pod_uid, _) in zip(HAMI_PODS, cgroups, strict=True)])
        listed = ";".join(f"process:1:{child.pid}:{share}:{mib}" + (f"@{BUSY_FROM_S:g}" if share else "")
                          for child, (_, share, mib, _, _) in zip(children, HAMI_PODS, strict=True))
        args = ["--simulate", "vgpu", "--interval", "0.25", "--process-interval", str(PROCESS_INTERVAL_S),
                "--no-history", "--metrics-pods", "--kubelet-socket", str(sock), "--pod-log-dir", str(logs)]
        with nvdash_server(args, env={"NVDASH_FAKE_FAULTS": f"clear_processes:1;{listed}"}) as server:
            assert [gpu["uuid"] for gpu in get_json(server.url + "/info.json")["gpus"]] == [GPU0, GPU1]
            yield server


def busy_sm_pct(document: dict[str, Any]) -> float | None:
    """The ``busy`` pod's own SM share of GPU 1 in a reading."""
    unit = next((u for u in document["shares"] if u["unit"] == GPU1), None)
    owners = [] if unit is None else [o for o in unit["owners"] if o["kind"] == "pod" and o["pod"] == "busy"]
    return owners[0]["sm_pct"] if owners else None


def kinds(document: dict[str, Any]) -> set[tuple[str, str]]:
    """(pod, finding kind) of every finding in a reading."""
    return {(f["pod"], f["kind"]) for f in document["quota_findings"]}


def metric_samples(server: NvdashServer, family: str) -> list[tuple[dict[str, str], float]]:
    text = http_get(server.url + "/metrics")[1]
    return [(sample.labels, sample.value) for parsed in text_string_to_metric_families(text)
            if parsed.name == family for sample in parsed.samples]


def test_hami_pods_over_their_quotas_are_flagged_on_every_surface_of_a_real_server(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with hami_server(tmp_path, tmp_path_factory) as server:
        # Every distinct reading, in order, until the busy pod's compute finding shows.
        readings: dict[float, dict[str, Any]] = {}

        def poll() -> dict[float, dict[str, Any]]:
            document = get_json(server.url + "/api/processes.json")
            if document["time_s"] is not None:
                readings.setdefault(document["time_s"], document)
            return readings

        wait_for(poll, lambda found: any(("busy", "compute_over_quota") in kinds(d) for d in found.values()),
                 timeout_s=60.0 + 10 * PROCESS_INTERVAL_S)
        ordered = [readings[t] for t in sorted(readings)]
        over = [(busy_sm_pct(d) or 0.0) > CORE_QUOTA_PCT + COMPUTE_TOLERANCE_PCT for d in ordered]
        print([(d["time_s"], busy_sm_pct(d), sorted(kinds(d))) for d in ordered])

        # Memory held over the quota is a state: flagged from the first reading on, the pod under it never.
        first = ordered[0]
        assert ("over", "memory_over_quota") in kinds(first)
        assert all(("under", kind) not in kinds(d) for d in ordered for kind in ("memory_over_quota",
                                                                                 "compute_over_quota"))
        # Compute above the core quota is a rate: flagged only once SUSTAIN_READINGS readings in a row were above
        # it. The busy pod starts working BUSY_FROM_S after start, so a reading below the quota comes first.
        flagged = next(n for n, d in enumerate(ordered) if ("busy", "compute_over_quota") in kinds(d))
        assert over[flagged]
        below = [n for n in range(flagged) if not over[n]]
        assert below, f"no reading below the quota was seen before the flag: {over}"
        # The readings after the last one seen below the quota, up to the flagged one, counted by their times (a
        # poll the test missed on a loaded machine does not hide a reading): at least SUSTAIN_READINGS.
        span = round((ordered[flagged]["time_s"] - ordered[below[-1]]["time_s"]) / PROCESS_INTERVAL_S)
        assert span >= SUSTAIN_READINGS, (span, over)
        assert all(("busy", "compute_over_quota") not in kinds(d) for d in ordered[:below[-1] + 1])

        document = ordered[flagged]
        compute = next(f for f in document["quota_findings"] if f["kind"] == "compute_over_quota")
        assert compute["used"] == pytest.approx(busy_sm_pct(document))
        assert compute["text"] == (f"ml/busy/main keeps {compute['used']:.0f} % of GPU 1's SM time busy, above its "
                                   "HAMi core quota of 1 % (+5 tolerated), for 3 readings or more")
        assert {k: v for k, v in compute.items() if k not in ("used", "text")} == {
            "namespace": "ml", "pod": "busy", "container": "main", "gpu_uuid": GPU1, "kind": "compute_over_quota",
            "quota": CORE_QUOTA_PCT, "scheme": "hami"}
        memory = next(f for f in document["quota_findings"] if f["kind"] == "memory_over_quota")
        assert memory == {
            "namespace": "ml", "pod": "over", "container": "main", "gpu_uuid": GPU1, "kind": "memory_over_quota",
            "used": 2500.0 * MIB, "quota": 2000.0 * MIB, "scheme": "hami",
            "text": "ml/over/main holds 2.4 GiB of GPU memory on GPU 1, over its HAMi quota of 2.0 GiB",
        }
        grants = {g["pod"]: g for g in document["grants"]}
        assert grants["over"] == {"namespace": "ml", "pod": "over", "container": "main", "scheme": "hami",
                                  "source": "environment", "gpu_uuid": GPU1, "core_pct": 30.0,
                                  "memory_bytes": 2000 * MIB}
        assert (grants["under"]["memory_bytes"], grants["under"]["core_pct"]) == (1 << 30, 30.0)
        assert (grants["busy"]["memory_bytes"], grants["busy"]["core_pct"]) == (1 << 30, CORE_QUOTA_PCT)
        assert all("s3cr3t" not in repr(d) for d in ordered)
        # The profile's own processes on GPU 0, which no pod holds, once the kubelet answered.
        unallocated = wait_for(lambda: get_json(server.url + "/api/processes.json")["quota_findings"],
                               lambda found: any(f["kind"] == "unallocated_use" for f in found), timeout_s=60.0)
        assert [(f["gpu_uuid"], f["pod"], f["used"]) for f in unallocated if f["kind"] == "unallocated_use"] == [
            (GPU0, "", 4000.0 * MIB)]

        # /metrics: the quotas of all three pods, the memory finding of the pod over it (none of the one under).
        quotas = {labels["pod"]: (labels["UUID"], labels["gpu"], labels["scheme"], value)
                  for labels, value in metric_samples(server, "nvdash_pod_gpu_memory_quota_bytes")}
        assert quotas == {"over": (GPU1, "1", "hami", 2000.0 * MIB), "under": (GPU1, "1", "hami", float(1 << 30)),
                          "busy": (GPU1, "1", "hami", float(1 << 30))}
        cores = {labels["pod"]: value for labels, value in metric_samples(server, "nvdash_pod_gpu_core_quota_ratio")}
        assert cores == {"over": 0.3, "under": 0.3, "busy": 0.01}

        def findings() -> set[tuple[str, str, str, str, float]]:
            return {(labels["pod"], labels["finding"], labels["UUID"], labels["gpu"], value)
                    for labels, value in metric_samples(server, "nvdash_pod_gpu_quota_finding")}

        exported = wait_for(findings, lambda found: ("busy", "compute_over_quota", GPU1, "1", 1.0) in found,
                            timeout_s=60.0)
        assert ("over", "memory_over_quota", GPU1, "1", 1.0) in exported
        assert ("", "unallocated_use", GPU0, "0", 1.0) in exported
        assert not [found for found in exported if found[0] == "under"]

        # GPU Health: the flag on GPU 1's row, as a viewer's page receives it.
        session = open_session(server.url, "/GPU-Health")
        try:
            status = session.document.select_one({"name": "status"})
            receive_until(session, lambda: 'data-quota="memory_over_quota"' in status.text, timeout_s=60.0)
            rows = status.text.split("<tr ")
            (gpu1_row,) = [row for row in rows if "<b>GPU 1</b>" in row]
            assert "Quota: ml/over/main holds 2.4 GiB of GPU memory on GPU 1, over its HAMi quota of 2.0 GiB" \
                in gpu1_row
            assert "ml/under" not in status.text
        finally:
            session.close()


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

