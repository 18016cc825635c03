"""Per-pod shares through a real server's HTTP surfaces: ``/api/processes.json``, ``/metrics`` and the accounting API.

A real ``python -m nvdash`` subprocess simulates the GPUs; real child processes sit in real cgroup v1 directories
named as the kubelet names them, the kubelet's pod log directories name their pods, and a real pod-resources gRPC
server allocates the GPU (replicas of a time-sliced GPU, or MIG instances) to them. The simulation lists the
children on the GPUs (``process:UNIT:PID:SM_SHARE:MEMORY_MIB`` fault items, the profile's own processes cleared), so
each child does a known part of its unit's work.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nvdash.sampling.fake.mig import mig_uuid
from nvdash.sampling.fake.processes import SAMPLE_PERIOD_S
from nvdash.sampling.fake.profiles import PROFILES, gpu_uuid
from tests.conftest import NvdashServer, get_json, nvdash_server, wait_for
from tests.server.kubelet_pods import kubelet_cgroups, place, pod_log_dirs, sleeping
from tests.server.test_metrics_endpoint import scrape
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

MIB = 1 << 20
INTERVAL_S = 0.25
PROCESS_INTERVAL_S = 2.0
NAMESPACE = "team"
CONTAINER = "main"
PODS = ("alpha", "beta", "gamma")
SM_SHARES = (0.5, 0.3, 0.1)
MEMORY_MIB = (1000, 2000, 3000)
TIMESLICED_GPU0 = gpu_uuid("timesliced", 0, 0)
READINGS = 6
"""Process readings whose shares are compared with the work the simulation gives each pod."""
ROUNDING_PCT = 0.5
"""Each per-process sample is a whole percent."""


def tolerance_pct(share: float, span_s: float, edges: int) -> float:
    """How far (percentage points of the GPU) a pod's SM share over ``span_s`` may be from ``share`` times the GPU's
    utilization that nvdash averaged over the same readings.

    The per-process samples of a window end at the newest sample (up to one sample period before the reading),
    while the utilization averages the sweeps since the previous reading (one sweep interval each): at each of the
    ``edges`` window ends that are not shared with a neighbouring compared window, the two may cover up to a sample
    period plus a sweep interval of different time, during which the pod's work may swing by ``share`` x 100 %;
    each sample is rounded to a whole percent.
    """
    return share * 100.0 * edges * (SAMPLE_PERIOD_S + INTERVAL_S) / span_s + ROUNDING_PCT


@dataclass(frozen=True)
class Reading:
    """One process reading as ``/api/processes.json`` served it: GPU 0's unit and its owners by pod."""

    time_s: float
    window_s: float
    utilization_pct: float
    unattributed_sm_pct: float
    owners: dict[str, dict[str, Any]]


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    with sleeping(len(PODS)) as started:
        yield started


Families = dict[str, list[tuple[dict[str, str], float]]]


def families(server: NvdashServer) -> Families:
    """One scrape of ``/metrics``: the samples by their names without ``_total`` (the parser adds it to a counter's
    samples that lack it, such as dcgm-exporter's ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``)."""
    status, text, _ = scrape(server.url)
    assert status == 200
    found: Families = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name.removesuffix("_total"), []).append((sample.labels, sample.value))
    return found


def energy(found: Families, gpu: str, pods: int) -> tuple[float, float]:
    """(GPU ``gpu``'s energy counter in J, its pods' energy plus its unattributed energy, over its whole GPU or all
    its MIG instances, in J), from one scrape."""
    (counter,) = [v for labels, v in found["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] if labels["gpu"] == gpu]
    owned = [v for labels, v in found["nvdash_pod_gpu_energy_joules"] if labels["gpu"] == gpu]
    rest = [v for labels, v in found["nvdash_gpu_unattributed_energy_joules"] if labels["gpu"] == gpu]
    assert len(owned) == pods
    return counter / 1000.0, sum(owned) + sum(rest)


def check_energy(server: NvdashServer, gpu: str, pods: int) -> None:
    """Between two scrapes, the pods' energy plus the unattributed energy of ``gpu`` grew by what its energy counter
    did (each scrape reads one snapshot, so only float rounding may differ)."""
    before = energy(families(server), gpu, pods)
    after = wait_for(lambda: energy(families(server), gpu, pods), lambda e: e[0] > before[0] + 100.0, timeout_s=60.0)
    counted, shared = after[0] - before[0], after[1] - before[1]
    print(f"GPU {gpu} energy between scrapes: counter {counted:.6f} J, pods + unattributed {shared:.6f} J")
    assert shared == pytest.approx(counted, rel=1e-9, abs=1e-6)


def unit_of(document: dict[str, Any], unit: str) -> dict[str, Any] | None:
    return next((u for u in document["shares"] if u["unit"] == unit), None)


@contextlib.contextmanager
def timesliced_server(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, sleepers: list[subprocess.Popen[bytes]],
    extra: Sequence[str] = (),
) -> Iterator[NvdashServer]:
    """``--simulate timesliced`` with GPU 0's replicas 0-2 allocated to three pods, each a real process doing
    ``SM_SHARES`` of GPU 0's work (``extra``: more arguments for the server)."""
    logs = tmp_path / "pods"
    sock = tmp_path / "kubelet.sock"
    lister = Lister(pods=[Pod(NAMESPACE, name, [Container(CONTAINER, {"nvidia.com/gpu": [f"{TIMESLICED_GPU0}::{n}"]})])
                          for n, name in enumerate(PODS)])
    listed = ";".join(f"process:0:{child.pid}:{share}:{mib}"
                      for child, share, mib in zip(sleepers, SM_SHARES, MEMORY_MIB, strict=True))
    with kubelet_cgroups(len(PODS)) as cgroups, serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister):
        for child, (_, leaf) in zip(sleepers, cgroups, strict=True):
            place(child.pid, leaf)
        pod_log_dirs(logs, [(NAMESPACE, name, pod_uid, CONTAINER) for name, (pod_uid, _) in zip(PODS, cgroups,
                                                                                                   strict=True)])
        args = ["--simulate", "timesliced", "--interval", str(INTERVAL_S), "--process-interval",
                str(PROCESS_INTERVAL_S), "--no-history", "--kubelet-socket", str(sock), "--pod-log-dir", str(logs),
                *extra]
        with nvdash_server(args, env={"NVDASH_FAKE_FAULTS": f"clear_processes:0;{listed}"}) as server:
            yield server


def gpu0_reading(server: NvdashServer) -> Reading | None:
    """GPU 0's shares in the newest process reading, once they name the three pods with measured SM shares."""
    document = get_json(server.url + "/api/processes.json")
    unit = unit_of(document, TIMESLICED_GPU0)
    if unit is None or not unit["measured"] or unit["window_s"] <= 0 or unit["utilization_pct"] is None:
        return None
    owners = {o["pod"]: o for o in unit["owners"] if o["kind"] == "pod"}
    if set(owners) != set(PODS) or any(o["sm_pct"] is None for o in owners.values()):
        return None
    return Reading(document["time_s"], unit["window_s"], unit["utilization_pct"], unit["unattributed"]["sm_pct"],
                   owners)


def collect_readings(server: NvdashServer, count: int) -> list[Reading]:
    """``count`` distinct process readings (polled: one missed on a loaded machine only widens the tolerance)."""
    found: dict[float, Reading] = {}

    def poll() -> int:
        reading = gpu0_reading(server)
        if reading is not None:
            found.setdefault(reading.time_s, reading)
        return len(found)

    wait_for(poll, lambda n: n > count, timeout_s=30.0 + 10 * count * PROCESS_INTERVAL_S)
    return [found[t] for t in sorted(found)][1:]  # the first window is the driver's whole buffer


def test_time_sliced_pods_get_their_shares_on_every_http_surface(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    with timesliced_server(tmp_path, tmp_path_factory, sleepers) as server:
        readings = collect_readings(server, READINGS)

        # processes.json: each pod owns its process, its SM share is its part of the GPU's utilization (both in the
        # same document), and the owners never add up to more than the utilization.
        done = dict.fromkeys(PODS, 0.0)
        truth = dict.fromkeys(PODS, 0.0)
        worst = dict.fromkeys(PODS, 0.0)
        span_s = 0.0
        edges = 2
        for previous, reading in zip([None, *readings], readings, strict=False):
            contiguous = previous is not None and math.isclose(reading.time_s - previous.time_s, reading.window_s,
                                                               abs_tol=1e-3)
            edges += 0 if previous is None or contiguous else 2
            span_s += reading.window_s
            attributed = sum(o["sm_pct"] for o in reading.owners.values())
            assert attributed <= reading.utilization_pct + 1e-9
            assert reading.unattributed_sm_pct == pytest.approx(reading.utilization_pct - attributed, abs=1e-9)
            for name, share, mib in zip(PODS, SM_SHARES, MEMORY_MIB, strict=True):
                owner = reading.owners[name]
                assert (owner["namespace"], owner["container"], owner["label"]) == (
                    NAMESPACE, CONTAINER, f"{NAMESPACE}/{name}/{CONTAINER}")
                assert owner["memory_bytes"] == mib * MIB
                expected = share * reading.utilization_pct
                assert owner["sm_pct"] == pytest.approx(expected, abs=tolerance_pct(share, reading.window_s, 2)), name
                worst[name] = max(worst[name], abs(owner["sm_pct"] - expected))
                done[name] += owner["sm_pct"] * reading.window_s
                truth[name] += expected * reading.window_s
        for name, share in zip(PODS, SM_SHARES, strict=True):
            error = done[name] / span_s - truth[name] / span_s
            print(f"{name}: mean SM share error {error:+.3f} pp over {span_s:.1f} s ({edges} loose edges), "
                  f"worst window {worst[name]:.3f} pp")
            assert abs(error) <= tolerance_pct(share, span_s, edges), name

        # /metrics: a share per pod with its labels; between two scrapes the pods' energy plus the unattributed
        # energy grew by what GPU 0's energy counter did (each scrape reads one snapshot).
        first = families(server)
        ratios = {labels["pod"]: (labels, value) for labels, value in first["nvdash_pod_gpu_sm_share_ratio"]
                  if labels["UUID"] == TIMESLICED_GPU0}
        assert set(ratios) == set(PODS)
        for labels, value in ratios.values():
            assert (labels["namespace"], labels["container"], labels["sharing"], labels["gpu"]) == (
                NAMESPACE, CONTAINER, "shared", "0")
            assert 0 < value <= 1

        check_energy(server, "0", len(PODS))

        # Accounting: the pods' GPU time is their shares of the busy GPU (5:3:1), and what no pod used is no one's.
        def pod_rows() -> dict[str, dict[str, Any]]:
            rows = get_json(server.url + "/api/accounting.json?range=today&by=pod")["rows"]
            return {row["key"]: row for row in rows if row["key"].startswith(f"{NAMESPACE}/")}

        rows = wait_for(pod_rows, lambda r: len(r) == len(PODS) and min(x["gpu_seconds"] for x in r.values()) > 1.0,
                        timeout_s=60.0)
        print({key: (row["gpu_seconds"], row["busy_hours"], row["start_s"], row["end_s"]) for key, row in rows.items()})
        seconds = {key.split("/")[1]: row["gpu_seconds"] for key, row in rows.items()}
        total = sum(seconds.values())
        for name, share in zip(PODS, SM_SHARES, strict=True):
            part = seconds[name] / total
            print(f"{name}: {part:.4f} of the pods' GPU time, expected {share / sum(SM_SHARES):.4f}")
            assert part == pytest.approx(share / sum(SM_SHARES), abs=0.03), name
        elapsed_s = max(row["end_s"] for row in rows.values()) - min(row["start_s"] for row in rows.values())
        print(f"pods' GPU time {total:.3f} s of {elapsed_s:.3f} s elapsed")
        assert total < elapsed_s


MIG_GPU0 = gpu_uuid("h100-mig", 0, 0)
MIG_LAYOUT = dict(PROFILES["h100-mig"].mig_layout)[0]
MIG_PODS = (("llm", 0, 0.85, 24000), ("notebook", 1, 0.5, 12288))
"""(pod, index of its instance in the layout, SM share, MiB): the 3g.40gb and the 2g.20gb instances."""


def test_mig_pods_get_their_instances_activity_on_every_http_surface(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    logs = tmp_path / "pods"
    sock = tmp_path / "kubelet.sock"
    instances = {name: MIG_LAYOUT[index] for name, index, _, _ in MIG_PODS}
    uuids = {name: mig_uuid(MIG_GPU0, spec.gpu_instance_id, spec.compute_instance_id)
             for name, spec in instances.items()}
    lister = Lister(pods=[
        Pod(NAMESPACE, name, [Container(CONTAINER, {f"nvidia.com/mig-{spec.profile}": [uuids[name]]})])
        for name, spec in instances.items()])
    children = sleepers[:len(MIG_PODS)]
    listed = ";".join(f"process:0/{index}:{child.pid}:{share}:{mib}"
                      for child, (_, index, share, mib) in zip(children, MIG_PODS, strict=True))
    with kubelet_cgroups(len(MIG_PODS)) as cgroups, serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister):
        for child, (_, leaf) in zip(children, cgroups, strict=True):
            place(child.pid, leaf)
        pod_log_dirs(logs, [(NAMESPACE, name, pod_uid, CONTAINER)
                            for (name, *_), (pod_uid, _) in zip(MIG_PODS, cgroups, strict=True)])
        args = ["--simulate", "h100-mig", "--interval", str(INTERVAL_S), "--process-interval",
                str(PROCESS_INTERVAL_S), "--no-history", "--kubelet-socket", str(sock), "--pod-log-dir", str(logs)]
        with nvdash_server(args, env={"NVDASH_FAKE_FAULTS": f"clear_processes:0;{listed}"}) as server:
            def document() -> dict[str, Any]:
                return get_json(server.url + "/api/processes.json")

            def busy(found: dict[str, Any]) -> bool:
                units = [unit_of(found, uuid_) for uuid_ in uuids.values()]
                return all(u is not None and u["owners"] and u["owners"][0]["sm_pct"] for u in units)

            # processes.json: each instance's one pod has all of the instance's activity (the same document's).
            found = wait_for(document, busy, timeout_s=60.0)
            (gpu0,) = [gpu for gpu in found["gpus"] if gpu["uuid"] == MIG_GPU0]
            activity = {instance["uuid"]: instance["sm_active_pct"] for instance in gpu0["mig"]["instances"]}
            for name, uuid_ in uuids.items():
                unit = unit_of(found, uuid_)
                assert unit is not None
                (owner,) = unit["owners"]
                assert (owner["kind"], owner["namespace"], owner["pod"], owner["container"]) == (
                    "pod", NAMESPACE, name, CONTAINER)
                assert unit["measured"]
                assert unit["sharing"] == "mig"
                assert owner["sm_pct"] == activity[uuid_] == unit["utilization_pct"]
                assert owner["fraction"] == 1.0
                assert unit["unattributed"]["sm_pct"] == 0.0

            # /metrics: the pods' shares carry their instances' labels.
            def shares() -> dict[str, dict[str, str]]:
                return {labels["pod"]: labels for labels, value in families(server)["nvdash_pod_gpu_sm_share_ratio"]
                        if labels["UUID"] == MIG_GPU0 and value > 0}

            labelled = wait_for(shares, lambda s: set(s) == set(uuids), timeout_s=30.0)
            for name, spec in instances.items():
                labels = labelled[name]
                assert (labels["GPU_I_ID"], labels["GPU_I_PROFILE"], labels["sharing"]) == (
                    str(spec.gpu_instance_id), spec.profile, "mig")
                assert (labels["namespace"], labels["container"]) == (NAMESPACE, CONTAINER)
            check_energy(server, "0", len(MIG_PODS))

            # Accounting: each pod is charged its busy instance.
            def pod_rows() -> dict[str, dict[str, Any]]:
                rows = get_json(server.url + "/api/accounting.json?range=today&by=pod")["rows"]
                return {row["key"].split("/")[1]: row for row in rows if row["key"].startswith(f"{NAMESPACE}/")}

            rows = wait_for(pod_rows, lambda r: set(r) == set(uuids) and all(x["busy_hours"] > 0 for x in r.values()),
                            timeout_s=60.0)
            print({name: (row["gpu_seconds"], row["busy_hours"], row["energy_j"]) for name, row in rows.items()})
            for row in rows.values():
                assert row["gpus"] == [0]
                assert row["energy_j"] > 0
