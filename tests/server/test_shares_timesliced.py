"""Per-pod shares of a time-sliced GPU end to end: the simulated ``timesliced`` machine under the real pynvml, the
real sampler and usage collector, real child processes placed in real cgroup v1 directories named as the kubelet
names them, pod names from pod log directories, and a real kubelet pod-resources gRPC server.

The pods' true shares come from the simulation's definition of the work: each process does ``sm_share`` of GPU 0's
utilization, so over a window its true SM share is ``sm_share`` times the workload's utilization averaged over
that window (read from the fake's ``Workload``, never from nvdash).
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.sampling.cgroups import pod_names_from_logs
from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.fake.profiles import TIMESLICED_SM_SHARES
from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE
from nvdash.sampling.fake.workload import SLOT_S
from nvdash.sampling.hardware import Hardware, open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.kubelet import PodResourcesClient, PodResourcesWatcher
from nvdash.sampling.records import Snapshot
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.usage import UsageCollector
from nvdash.store import Store
from tests.conftest import wait_for
from tests.server.kubelet_pods import kubelet_cgroups
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

INTERVAL_S = 0.25
USAGE_INTERVAL_S = 2.0
WINDOWS = 6
"""Process readings compared with the truth (after the first, whose window is the driver's whole buffer)."""
SAMPLE_PERIOD_S = 0.2
"""The simulated driver's per-process sample period."""
ROUNDING_PCT = 0.5
"""Each per-process sample is a whole percent."""


def tolerance_pct(share: float, window_s: float) -> float:
    """How far (percentage points of the GPU) a pod's SM share may be from its true share over ``window_s``.

    The per-process window ends at the newest sample, up to one sample period before the reading, and the reading
    itself comes a little after the sweep's time: each end of the window may be off by up to two sample periods, during
    which the pod's work may swing by ``share`` x 100 %; and each sample is a whole percent.
    """
    return share * 100.0 * 2 * SAMPLE_PERIOD_S / window_s + ROUNDING_PCT


PODS = ("alpha", "beta", "gamma")


@pytest.fixture
def hardware() -> Iterator[Hardware]:
    opened = open_hardware("timesliced")
    yield opened
    opened.close()


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started = [subprocess.Popen(["sleep", "600"]) for _ in PODS]
    yield started
    for child in started:
        child.kill()
        child.wait(10)


def true_util(fake: FakeNvmlLibrary, gpu: int, start_s: float, end_s: float) -> float:
    """The workload's utilization of ``gpu`` averaged over (start, end] (wall-clock seconds), slot by slot."""
    first = int((start_s - fake.created_at) / SLOT_S) + 1
    last = int((end_s - fake.created_at) / SLOT_S)
    values = [fake.workload.utilization(gpu, k * SLOT_S)[0] for k in range(first, last + 1)]
    return sum(values) / len(values)


def unit_of(snapshot: Snapshot, uuid_: str) -> UnitShares:
    (unit,) = [u for u in snapshot.shares if u.unit == uuid_]
    return unit


def test_pods_time_slicing_a_gpu_get_their_true_shares(
    hardware: Hardware, sleepers: list[subprocess.Popen[bytes]], tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    fake = hardware.fake
    assert isinstance(fake, FakeNvmlLibrary)
    assert hardware.gpus is not None
    uuids = [gpu.uuid for gpu in hardware.inventory.gpus]
    # The profile's own (invisible) processes on GPU 0 make way for three real ones, one per pod, doing the same work.
    for n in range(3):
        assert fake.remove_process(GHOST_PID_BASE + 300 + n)
    for child, share, mib in zip(sleepers, TIMESLICED_SM_SHARES, (1000, 2000, 3000), strict=True):
        fake.add_process(0, child.pid, memory_mib=mib, sm_share=share)
    logs = tmp_path / "pods"
    lister = Lister(pods=[
        *(Pod("team", name, [Container("main", {"nvidia.com/gpu": [f"{uuids[0]}::{n}"]})])
          for n, name in enumerate(PODS)),
        *(Pod("serving", f"mps-{n}", [Container("server", {"nvidia.com/gpu": [f"{uuids[1]}::{n}"]})])
          for n in range(2)),
    ])
    sock = tmp_path / "kubelet.sock"
    with kubelet_cgroups(len(PODS)) as cgroups, serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister):
        for child, name, (pod_uid, leaf) in zip(sleepers, PODS, cgroups, strict=True):
            (leaf / "cgroup.procs").write_text(str(child.pid))
            (logs / f"team_{name}_{pod_uid}" / "main").mkdir(parents=True)
            assert f"/kubepods/besteffort/pod{pod_uid}/{leaf.name}" in Path(f"/proc/{child.pid}/cgroup").read_text()
        client = PodResourcesClient(str(sock))
        watcher = PodResourcesWatcher(client, interval_s=60.0)
        assert watcher.refresh().available
        store = Store(hardware.inventory, capacity=10_000)
        collector = UsageCollector(hardware.gpus, HostProcessTable(), watcher, lambda: pod_names_from_logs(logs))
        sampler = Sampler(store, hardware.host, hardware.gpus, INTERVAL_S, usage=collector,
                          usage_interval_s=USAGE_INTERVAL_S)
        sampler.start()
        try:
            def readings() -> list[Snapshot]:
                rows = store.since(0)[0]
                return [s for i, s in enumerate(rows)
                        if s.usage is not None and (i == 0 or s.usage is not rows[i - 1].usage)]

            wait_for(readings, lambda found: len(found) > WINDOWS, timeout_s=120.0)
        finally:
            sampler.stop()
            client.close()
    rows = store.since(0)[0]
    news = readings()
    with_shares = [s for s in rows if s.shares]
    assert with_shares, "the snapshots carry shares"

    # Each pod owns its process (attributed by its cgroup's pod UID), and its SM share over each window is its true
    # share within the tolerance; over all the windows together (what one window misses, the next one counts) the
    # tolerance is that of their total span.
    done: dict[str, float] = dict.fromkeys(PODS, 0.0)
    truth: dict[str, float] = dict.fromkeys(PODS, 0.0)
    span_s = 0.0
    for previous, reading in itertools.pairwise(news):
        assert previous.usage is not None
        assert reading.usage is not None
        unit = unit_of(reading, uuids[0])
        assert unit.measured
        assert unit.sharing == "shared"
        shares = {o.owner.pod: o for o in unit.owners}
        assert set(shares) == set(PODS)
        window_s = reading.usage.time_s - previous.usage.time_s
        gpu_util = true_util(fake, 0, previous.usage.time_s, reading.usage.time_s)
        span_s += window_s
        for name, share in zip(PODS, TIMESLICED_SM_SHARES, strict=True):
            owner = shares[name]
            assert (owner.owner.namespace, owner.owner.container) == ("team", "main")
            assert owner.sm_pct is not None
            assert owner.sm_pct == pytest.approx(share * gpu_util, abs=tolerance_pct(share, window_s)), name
            done[name] += owner.sm_pct * window_s
            truth[name] += share * gpu_util * window_s
        assert shares["gamma"].memory_bytes == 3000 * 1024 * 1024
    for name, share in zip(PODS, TIMESLICED_SM_SHARES, strict=True):
        assert done[name] / span_s == pytest.approx(truth[name] / span_s, abs=tolerance_pct(share, span_s)), name

    for snapshot in with_shares:
        for unit in snapshot.shares:
            attributed = sum(o.sm_pct or 0.0 for o in unit.owners)
            assert unit.utilization_pct is not None
            assert attributed <= unit.utilization_pct + 1e-9
            assert unit.unattributed_sm_pct == pytest.approx(unit.utilization_pct - attributed, abs=1e-9)

    # Energy: the owners' parts plus the unattributed part are the GPU's energy-counter delta since the first
    # snapshot with shares, exactly (no counter reset in this run).
    for gpu, uuid_ in enumerate(uuids):
        first, last = (next(g.energy_mj for g in s.gpus if g.index == gpu) for s in (with_shares[0], with_shares[-1]))
        assert first is not None
        assert last is not None
        unit = unit_of(with_shares[-1], uuid_)
        counted = sum(o.energy_j for o in unit.owners) + unit.unattributed_energy_j
        assert counted == pytest.approx((last - first) / 1000.0, rel=1e-9)
    pods_energy = {o.owner.pod: o.energy_j for o in unit_of(with_shares[-1], uuids[0]).owners}
    assert pods_energy["alpha"] > pods_energy["beta"] > pods_energy["gamma"] > 0

    # GPU 1 runs MPS clients (their PIDs are in another namespace, so no pod is named): the replicas read as mps,
    # and the clients' samples, which add up to more than the GPU's utilization, are scaled down to it.
    scaled = 0
    for reading in news:
        mps = unit_of(reading, uuids[1])
        assert mps.sharing == "mps"
        clients = {o.owner.pid: o.sm_pct or 0.0 for o in mps.owners}
        assert set(clients) == {GHOST_PID_BASE + n for n in (310, 311, 312)}
        assert clients[GHOST_PID_BASE + 310] == 0.0  # the MPS server itself does no work
        assert mps.utilization_pct is not None
        if mps.utilization_pct > 30 and sum(clients.values()) == pytest.approx(mps.utilization_pct):
            scaled += 1
            big, small = clients[GHOST_PID_BASE + 311], clients[GHOST_PID_BASE + 312]
            assert big / small == pytest.approx(0.7 / 0.6, rel=0.1)  # 70 % and 60 % of the work, whole percents
    assert scaled >= len(news) // 2
