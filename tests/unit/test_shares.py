"""Shares of a shared GPU from hand-written readings: the values follow from the definitions in ``share_records``
(an owner's SM time over the window, capped by the unit's mean utilization; power and energy by SM fraction; the
rest unattributed)."""

from __future__ import annotations

import pytest

from nvdash.sampling.records import GpuSample
from nvdash.sampling.share_records import ShareOwner, UnitShares
from nvdash.sampling.shares import ShareTracker, mig_part, owner_of, scale_to, sharing_of
from nvdash.sampling.usage import with_mps
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

UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-66666666-7777-8888-9999-000000000000"
MIG3 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
MIG1 = "MIG-ffffffff-0000-1111-2222-333333333333"
MiB = 1024 * 1024
CONTAINER = "4f2b" * 16


def pod_process(pid: int, pod: str, sm: float | None, *, memory_mib: int = 1000, gpu_uuid: str = UUID,
                mig: str | None = None, kinds: tuple[str, ...] = ("compute",)) -> GpuProcess:
    return GpuProcess(0 if gpu_uuid == UUID else 1, gpu_uuid, pid, kinds, memory_mib * MiB, mig_uuid=mig,
                      sm_pct=sm, pod_namespace="team", pod_name=pod, container_name="main")


def gpu(util: float | None, energy_mj: int | None, *, index: int = 0, power_w: float | None = 200.0,
        used_mib: int = 4000, gpm: float | None = None, lost: bool = False) -> GpuSample:
    if lost:
        return GpuSample(index, lost=True)
    return GpuSample(index, utilization_pct=util, power_w=power_w, energy_mj=energy_mj,
                     memory_used_bytes=used_mib * MiB, gpm_sm_active_pct=gpm)


def usage(time_s: float, processes: tuple[GpuProcess, ...], *, devices: tuple[PodDevice, ...] = (),
          gpus: tuple[GpuUsage, ...] = (GpuUsage(0, UUID, process_utilization=True),)) -> Usage:
    return Usage(time_s, gpus, processes, PodResources(devices, available=True, status=""))


def only(shares: tuple[UnitShares, ...], unit: str = UUID) -> UnitShares:
    found = [s for s in shares if s.unit == unit]
    assert len(found) == 1, shares
    return found[0]


def by_pod(unit: UnitShares) -> dict[str | None, tuple[float | None, float | None, float | None, float]]:
    return {o.owner.pod: (o.sm_pct, o.fraction, o.power_w, o.energy_j) for o in unit.owners}


def test_time_sliced_pods_share_the_mean_utilization_of_the_window() -> None:
    tracker = ShareTracker()
    first = usage(0.0, ())
    tracker.update(0.0, (gpu(50.0, 1_000_000),), first)
    tracker.update(0.5, (gpu(60.0, 1_000_000),), first)
    # Three pods with 35 %, 21 % and 7 % of the SM time over the window; the GPU's mean utilization is 70 %.
    second = usage(1.0, (pod_process(11, "a", 35.0), pod_process(12, "b", 21.0), pod_process(13, "c", 7.0)))
    unit = only(tracker.update(1.0, (gpu(80.0, 1_000_000, gpm=40.0),), second))
    assert unit.utilization_pct == pytest.approx(70.0)
    assert unit.window_s == pytest.approx(1.0)
    assert unit.measured
    assert unit.sharing == "whole"
    shares = by_pod(unit)
    assert shares["a"][:3] == pytest.approx((35.0, 0.5, 100.0))
    assert shares["b"][:3] == pytest.approx((21.0, 0.3, 60.0))
    assert shares["c"][:3] == pytest.approx((7.0, 0.1, 20.0))
    assert unit.unattributed_sm_pct == pytest.approx(7.0)
    assert unit.unattributed_power_w == pytest.approx(20.0)
    assert {o.owner.pod: o.gpm_sm_active_pct for o in unit.owners} == pytest.approx({"a": 20.0, "b": 12.0, "c": 4.0})
    # Used memory 4000 MiB, the pods hold 3000 MiB: 1000 MiB is the driver's and contexts' own.
    assert unit.unattributed_memory_bytes == 1000 * MiB
    assert [o.memory_bytes for o in unit.owners] == [1000 * MiB] * 3
    assert [o.owner.label for o in unit.owners] == ["team/a/main", "team/b/main", "team/c/main"]


def test_mps_clients_above_the_utilization_are_scaled_down_to_it() -> None:
    tracker = ShareTracker()
    reading = usage(0.0, (pod_process(11, "a", 40.0, kinds=("compute", "mps")),
                          pod_process(12, "b", 60.0, kinds=("compute", "mps"))))
    unit = only(tracker.update(0.0, (gpu(50.0, 0),), reading))
    assert by_pod(unit)["a"][:2] == pytest.approx((20.0, 0.4))
    assert by_pod(unit)["b"][:2] == pytest.approx((30.0, 0.6))
    assert unit.unattributed_sm_pct == pytest.approx(0.0)
    assert scale_to(50.0, {ShareOwner("process", pid=1): 10.0}) == {ShareOwner("process", pid=1): 10.0}


def test_energy_follows_the_fractions_and_survives_a_counter_reset() -> None:
    tracker = ShareTracker()
    reading = usage(0.0, (pod_process(11, "a", 50.0), pod_process(12, "b", 30.0)))
    tracker.update(0.0, (gpu(100.0, 1_000_000),), reading)  # window's mean 100 %: fractions 0.5 and 0.3
    tracker.update(1.0, (gpu(100.0, 1_005_000),), reading)  # +5 J
    tracker.update(2.0, (gpu(100.0, 200),), reading)  # the driver reloaded: no delta, the count restarts
    unit = only(tracker.update(3.0, (gpu(100.0, 2_200),), reading))  # +2 J
    assert by_pod(unit)["a"][3] == pytest.approx(3.5)
    assert by_pod(unit)["b"][3] == pytest.approx(2.1)
    assert unit.unattributed_energy_j == pytest.approx(1.4)
    assert sum(o.energy_j for o in unit.owners) + unit.unattributed_energy_j == pytest.approx(7.0)


def test_a_missing_energy_reading_apportions_nothing_and_restarts_the_count() -> None:
    tracker = ShareTracker()
    reading = usage(0.0, (pod_process(11, "a", 100.0),))
    tracker.update(0.0, (gpu(100.0, 10_000),), reading)
    tracker.update(1.0, (gpu(100.0, None),), reading)
    tracker.update(2.0, (gpu(100.0, 90_000),), reading)
    unit = only(tracker.update(3.0, (gpu(100.0, 93_000),), reading))
    assert by_pod(unit)["a"][3] == pytest.approx(3.0)
    assert unit.unattributed_energy_j == pytest.approx(0.0)


def test_an_idle_gpu_leaves_all_its_energy_unattributed() -> None:
    tracker = ShareTracker()
    reading = usage(0.0, (pod_process(11, "a", 0.0),))
    tracker.update(0.0, (gpu(0.0, 0, power_w=40.0),), reading)
    unit = only(tracker.update(1.0, (gpu(0.0, 40_000, power_w=40.0),), reading))
    assert by_pod(unit)["a"] == pytest.approx((0.0, 0.0, 0.0, 0.0))
    assert unit.unattributed_energy_j == pytest.approx(40.0)
    assert unit.unattributed_power_w == pytest.approx(40.0)


def test_shares_change_only_with_a_new_process_reading() -> None:
    tracker = ShareTracker()
    reading = usage(0.0, (pod_process(11, "a", 30.0),))
    tracker.update(0.0, (gpu(60.0, 0),), reading)
    # Same reading: the split stays that of the first window (util 60 %) whatever the GPU does meanwhile.
    unit = only(tracker.update(0.5, (gpu(90.0, 1_000),), reading))
    assert unit.utilization_pct == pytest.approx(60.0)
    assert by_pod(unit)["a"][1] == pytest.approx(0.5)
    assert by_pod(unit)["a"][3] == pytest.approx(0.5)  # 1 J x 0.5
    newer = usage(1.0, (pod_process(11, "a", 30.0),))
    unit = only(tracker.update(1.0, (gpu(30.0, 2_000),), newer))
    assert unit.utilization_pct == pytest.approx(60.0)  # mean of 90 and 30: the snapshots since the last reading
    assert unit.window_s == pytest.approx(1.0)


def test_owners_are_pods_then_containers_then_processes() -> None:
    in_container = HostProcess(7, cgroup=CgroupIdentity(runtime="docker", container_id=CONTAINER))
    bare = HostProcess(8)
    assert owner_of(pod_process(1, "a", None)) == ShareOwner("pod", "team", "a", "main")
    assert owner_of(GpuProcess(0, UUID, 7, ("compute",), host=in_container)) == ShareOwner(
        "container", container="4f2b4f2b4f2b")
    assert owner_of(GpuProcess(0, UUID, 8, ("compute",), host=bare)) == ShareOwner("process", pid=8)
    assert owner_of(GpuProcess(0, UUID, 9, ("compute",))) == ShareOwner("process", pid=9)


def test_two_processes_of_one_pod_are_one_owner() -> None:
    tracker = ShareTracker()
    reading = usage(0.0, (pod_process(11, "a", 20.0, memory_mib=100), pod_process(12, "a", 10.0, memory_mib=200)))
    unit = only(tracker.update(0.0, (gpu(60.0, 0),), reading))
    (owner,) = unit.owners
    assert (owner.sm_pct, owner.fraction, owner.memory_bytes, owner.processes) == (30.0, 0.5, 300 * MiB, 2)


def test_sharing_comes_from_the_allocations_and_mps_clients_make_a_shared_replica_mps() -> None:
    replicas = tuple(PodDevice("team", p, "main", "nvidia.com/gpu", f"{UUID}::{n}", "shared")
                     for n, p in enumerate("ab"))
    whole = PodDevice("team", "c", "main", "nvidia.com/gpu", OTHER, "whole")
    assert sharing_of(UUID, (*replicas, whole)) == "shared"
    assert sharing_of(OTHER, (*replicas, whole)) == "whole"
    assert sharing_of(MIG3, replicas) == "whole"
    assert sharing_of(MIG3, replicas, "mig") == "mig"  # a MIG instance no pod holds is still a MIG instance
    pods = PodResources((*replicas, whole), available=True, status="")
    mps = (pod_process(11, "a", 10.0, kinds=("compute", "mps")),)
    assert [d.sharing for d in with_mps(pods, mps).devices] == ["mps", "mps", "whole"]
    assert with_mps(pods, (pod_process(11, "a", 10.0),)) is pods
    tracker = ShareTracker()
    unit = only(tracker.update(0.0, (gpu(50.0, 0),), usage(0.0, mps, devices=with_mps(pods, mps).devices)))
    assert unit.sharing == "mps"


def test_mig_instances_one_owner_gets_the_instance_several_owners_memory_only() -> None:
    big = MigInstance(0, MIG3, 1, 0, "3g.20gb", memory_used_bytes=9000 * MiB, sm_active_pct=42.0)
    small = MigInstance(0, MIG1, 13, 0, "1g.5gb", memory_used_bytes=3000 * MiB, sm_active_pct=30.0)
    gpus = (GpuUsage(0, UUID, mig_enabled=True, instances=(big, small), process_utilization=False),)
    processes = (
        pod_process(11, "a", None, memory_mib=8000, mig=MIG3),
        pod_process(12, "b", None, memory_mib=1000, mig=MIG1),
        pod_process(13, "c", None, memory_mib=1500, mig=MIG1),
    )
    tracker = ShareTracker()
    tracker.update(0.0, (gpu(None, 0, power_w=140.0),), usage(0.0, processes, gpus=gpus))
    shares = tracker.update(1.0, (gpu(None, 7_000, power_w=140.0),), usage(0.0, processes, gpus=gpus))
    one = only(shares, MIG3)
    assert one.measured
    assert one.sharing == "mig"  # no pod holds it, and it is still a MIG instance
    assert one.utilization_pct == 42.0
    assert by_pod(one)["a"] == pytest.approx((42.0, 1.0, 60.0, 3.0))  # 3/7 of 140 W and of 7 J
    assert one.unattributed_memory_bytes == 1000 * MiB
    assert one.unattributed_energy_j == pytest.approx(0.0)
    two = only(shares, MIG1)
    assert not two.measured
    assert {o.owner.pod: (o.sm_pct, o.fraction, o.energy_j) for o in two.owners} == {
        "b": (None, None, 0.0), "c": (None, None, 0.0)}
    assert two.unattributed_sm_pct == 30.0
    assert two.unattributed_energy_j == pytest.approx(1.0)  # 1/7 of 7 J, nobody's
    assert two.unattributed_power_w == pytest.approx(20.0)
    assert mig_part("1c.3g.20gb") == pytest.approx(3 / 7)
    assert mig_part("unknown") is None


def test_a_lost_gpu_has_no_shares_and_the_others_keep_theirs() -> None:
    gpus = (GpuUsage(0, UUID, process_utilization=True), GpuUsage(1, OTHER, process_utilization=True))
    processes = (pod_process(11, "a", 10.0), pod_process(12, "b", 10.0, gpu_uuid=OTHER))
    tracker = ShareTracker()
    shares = tracker.update(0.0, (gpu(20.0, 0, lost=True), gpu(20.0, 0, index=1)), usage(0.0, processes, gpus=gpus))
    assert [s.unit for s in shares] == [OTHER]


def test_an_owner_that_left_keeps_its_energy_until_pruned() -> None:
    tracker = ShareTracker(prune_after_s=10.0)
    tracker.update(0.0, (gpu(100.0, 0),), usage(0.0, (pod_process(11, "a", 100.0),)))
    tracker.update(1.0, (gpu(100.0, 4_000),), usage(0.0, (pod_process(11, "a", 100.0),)))
    empty = usage(2.0, ())
    unit = only(tracker.update(2.0, (gpu(0.0, 5_000),), empty))
    assert by_pod(unit) == {"a": (0.0, 0.0, 0.0, pytest.approx(4.0))}
    assert unit.unattributed_energy_j == pytest.approx(1.0)
    assert only(tracker.update(11.0, (gpu(0.0, 5_000),), empty)).owners != ()
    assert only(tracker.update(11.5, (gpu(0.0, 5_000),), empty)).owners == ()


def test_no_shares_before_the_first_process_reading() -> None:
    assert ShareTracker().update(0.0, (gpu(50.0, 0),), None) == ()


def test_a_pods_container_named_later_keeps_both_owners_in_the_shares() -> None:
    # At start the kubelet may not have named the container of a pod's process yet (container None); at the next
    # reading it has ("main"). The owner seen first is kept for its energy until pruned, beside the named one: the
    # shares must still be computed (ordering them once compared None with "main" and lost every later share).
    tracker = ShareTracker()
    unnamed = GpuProcess(0, UUID, 11, ("compute",), 1000 * MiB, sm_pct=40.0, pod_namespace="team", pod_name="a")
    tracker.update(0.0, (gpu(80.0, 1_000_000),), usage(0.0, (unnamed,)))
    tracker.update(1.0, (gpu(80.0, 1_002_000),), usage(0.0, (unnamed,)))
    named = usage(2.0, (pod_process(11, "a", 40.0),))
    unit = only(tracker.update(2.0, (gpu(80.0, 1_004_000),), named))
    labels = [owner.owner.label for owner in unit.owners]
    assert labels == ["team/a", "team/a/main"]
    assert unit.owners[1].sm_pct == pytest.approx(40.0)
    assert sum(o.energy_j for o in unit.owners) + unit.unattributed_energy_j == pytest.approx(4.0)
