"""Each GPU's time goes to exactly one owner per part: allocations first, then the processes on it."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest

from nvdash.accounting.attribution import UNKNOWN, Owner, attribute, mig_fraction, process_owner
from nvdash.sampling.job_mapping import JobMapping, MappedJob
from nvdash.sampling.records import GpuSample
from nvdash.sampling.usage_records import (
    CgroupIdentity,
    GpuProcess,
    GpuUsage,
    HostProcess,
    MigInstance,
    PodDevice,
    PodResources,
    Usage,
)

GiB = 1 << 30
NO_CGROUP = CgroupIdentity()
UUIDS = {0: "GPU-aaaa", 1: "GPU-bbbb"}
CONTAINER = "3f4e" * 16


class FakeNames:
    """A password and group database of two users."""

    users: ClassVar[dict[int, str]] = {1000: "alice", 1001: "bob"}
    groups: ClassVar[dict[str, str]] = {"alice": "physics", "bob": "chemistry"}

    def user(self, uid: int) -> str | None:
        return self.users.get(uid)

    def group_of(self, user: str) -> str | None:
        return self.groups.get(user)


NAMES = FakeNames()


def sample(index: int, util: float = 50.0, used: int = 10 * GiB, lost: bool = False) -> GpuSample:
    if lost:
        return GpuSample(index=index, lost=True)
    return GpuSample(index=index, utilization_pct=util, memory_used_bytes=used, gpm_sm_active_pct=util / 2)


def process(pid: int, gpu: int = 0, user: str | None = "alice", memory: int | None = GiB, *,
            cgroup: CgroupIdentity = NO_CGROUP, mig: str | None = None,
            pod: tuple[str, str] | None = None) -> GpuProcess:
    host = HostProcess(pid=pid, user=user, cgroup=cgroup)
    return GpuProcess(gpu_index=gpu, gpu_uuid=UUIDS[gpu], pid=pid, kinds=("compute",), gpu_memory_bytes=memory,
                      mig_uuid=mig, host=host, pod_namespace=pod[0] if pod else None,
                      pod_name=pod[1] if pod else None)


def usage(*processes: GpuProcess, devices: tuple[PodDevice, ...] = (),
          gpus: tuple[GpuUsage, ...] = ()) -> Usage:
    return Usage(time_s=100.0, gpus=gpus, processes=processes,
                 pods=PodResources(devices=devices, available=bool(devices), status=""))


def by_owner(shares: list) -> dict[tuple[int, str], float]:
    totals: dict[tuple[int, str], float] = {}
    for share in shares:
        key = (share.gpu_index, share.owner.job)
        totals[key] = totals.get(key, 0.0) + share.fraction
    return totals


def test_processes_of_two_users_share_a_gpu_by_the_memory_they_hold() -> None:
    shares = attribute([sample(0)], UUIDS, usage(process(1, memory=3 * GiB), process(2, user="bob", memory=GiB),
                                                 process(3, memory=0)), names=NAMES)
    assert by_owner(shares) == {(0, "alice"): 0.75, (0, "bob"): 0.25}
    alice = next(share for share in shares if share.owner.user == "alice")
    assert alice.owner == Owner("user", "alice", "alice", "physics")
    assert alice.memory_bytes == 3 * GiB, "the owner's processes' memory, not the GPU's"
    assert (alice.utilization_pct, alice.sm_active_pct) == (50.0, 25.0)


def test_without_memory_readings_owners_get_equal_parts() -> None:
    shares = attribute([sample(0)], UUIDS, usage(process(1, memory=None), process(2, user="bob", memory=GiB),
                                                 process(4, user="carol")), names=NAMES)
    assert by_owner(shares) == pytest.approx({(0, "alice"): 1 / 3, (0, "bob"): 1 / 3, (0, "carol"): 1 / 3})
    carol = next(share for share in shares if share.owner.user == "carol")
    assert carol.owner.project == UNKNOWN, "carol has no entry in the group database"


def test_a_job_mapping_file_owns_the_gpu_whatever_runs_on_it() -> None:
    mapping = JobMapping(by_index={0: (MappedJob("4242", 1001),)})
    shares = attribute([sample(0, used=20 * GiB), sample(1)], UUIDS, usage(process(1), process(2, gpu=1)),
                       mapping, names=NAMES)
    assert by_owner(shares) == {(0, "4242"): 1.0, (1, "alice"): 1.0}
    job = shares[0]
    assert job.owner == Owner("slurm", "4242", "bob", "chemistry")
    assert job.memory_bytes == 20 * GiB, "a unit's only owner holds all of its memory"


def test_a_uuid_file_wins_over_an_index_file_and_two_jobs_halve_a_gpu() -> None:
    mapping = JobMapping(by_index={0: (MappedJob("1"),)},
                         by_uuid={"GPU-aaaa": (MappedJob("2", 99999), MappedJob("3"))})
    shares = attribute([sample(0)], UUIDS, usage(process(7, cgroup=CgroupIdentity(slurm_job="3"))), mapping,
                       names=NAMES)
    assert by_owner(shares) == {(0, "2"): 0.5, (0, "3"): 0.5}
    owners = {share.owner.job: share.owner for share in shares}
    assert owners["2"].user == "uid 99999", "a UID the system cannot name"
    assert owners["3"].user == "alice", "no UID in the file: the user of the job's processes"


def test_a_process_in_a_slurm_cgroup_is_its_jobs() -> None:
    shares = attribute([sample(0)], UUIDS, usage(process(5, user="bob", cgroup=CgroupIdentity(slurm_job="812"))),
                       names=NAMES)
    assert [share.owner for share in shares] == [Owner("slurm", "812", "bob", "chemistry")]


def test_pods_allocated_a_gpu_own_it_even_with_no_process() -> None:
    devices = (PodDevice("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-bbbb", "whole"),
               PodDevice("web", "a", "c", "nvidia.com/gpu.shared", "GPU-aaaa::0", "shared"),
               PodDevice("web", "b", "c", "nvidia.com/gpu.shared", "GPU-aaaa::1", "shared"))
    shares = attribute([sample(0), sample(1)], UUIDS, usage(process(9, pod=("web", "a")), devices=devices),
                       names=NAMES)
    assert by_owner(shares) == {(0, "web/a"): 0.5, (0, "web/b"): 0.5, (1, "ml/trainer-0"): 1.0}
    owners = {share.owner.job: share for share in shares}
    assert owners["web/a"].owner == Owner("pod", "web/a", "alice", "web")
    assert owners["web/a"].memory_bytes == GiB
    assert owners["web/b"].owner.user == UNKNOWN
    assert owners["web/b"].memory_bytes is None


def test_container_processes_are_owned_by_their_container() -> None:
    owner = process_owner(process(3, cgroup=CgroupIdentity(runtime="docker", container_id=CONTAINER)), NAMES)
    assert owner == Owner("container", CONTAINER[:12], "alice", "physics")


def test_mig_instances_are_owned_by_their_compute_slices_and_never_add_up_past_the_gpu() -> None:
    instances = (MigInstance(0, "MIG-3g", 1, 0, "3g.20gb", memory_used_bytes=5 * GiB, sm_active_pct=40.0),
                 MigInstance(0, "MIG-2g", 5, 0, "2g.10gb"),
                 MigInstance(0, "MIG-1g", 13, 0, "1g.5gb", memory_used_bytes=GiB),
                 MigInstance(0, "MIG-1g-b", 14, 0, "1g.5gb"))
    gpus = (GpuUsage(0, "GPU-aaaa", mig_enabled=True, instances=instances),)
    devices = (PodDevice("ml", "p", "c", "nvidia.com/mig-3g.20gb", "MIG-3g", "mig"),)
    shares = attribute([sample(0)], UUIDS, usage(process(2, user="bob", mig="MIG-1g"), devices=devices, gpus=gpus),
                       names=NAMES)
    assert by_owner(shares) == pytest.approx({(0, "ml/p"): 3 / 7, (0, "bob"): 1 / 7})
    pod = next(share for share in shares if share.owner.kind == "pod")
    assert (pod.unit, pod.memory_bytes, pod.utilization_pct) == ("MIG-3g", 5 * GiB, 40.0)
    assert sum(share.fraction for share in shares) <= 1.0


def test_a_whole_gpu_mapping_file_covers_its_mig_instances() -> None:
    instances = (MigInstance(0, "MIG-x", 1, 0, "4g.20gb"), MigInstance(0, "MIG-y", 2, 0, "3g.20gb"))
    gpus = (GpuUsage(0, "GPU-aaaa", mig_enabled=True, instances=instances),)
    mapping = JobMapping(by_uuid={"GPU-aaaa": (MappedJob("5"),), "MIG-y": (MappedJob("6"),)})
    shares = attribute([sample(0)], UUIDS, usage(gpus=gpus), mapping, names=NAMES)
    assert by_owner(shares) == pytest.approx({(0, "5"): 4 / 7, (0, "6"): 3 / 7})


def test_a_lost_or_unused_gpu_has_no_owner() -> None:
    assert attribute([sample(0, lost=True), sample(1)], UUIDS, usage(process(1)), names=NAMES) == []
    assert attribute([sample(0)], UUIDS, None, names=NAMES) == []


@pytest.mark.parametrize(("profile", "fraction"), [
    ("3g.20gb", 3 / 7), ("1g.10gb", 1 / 7), ("7g.80gb", 1.0), ("1c.3g.20gb", 1 / 7), ("2c.4g.20gb", 2 / 7),
    ("1g.10gb+me", 1 / 7), ("mystery", None),
])
def test_mig_fractions_are_compute_slices_of_seven(profile: str, fraction: float | None) -> None:
    got = mig_fraction(profile)
    assert got == fraction if fraction is None else math.isclose(got or 0.0, fraction)
