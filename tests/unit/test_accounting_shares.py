"""Accounting a shared GPU by what each pod used: its GPU-hours and energy are its share, not the whole GPU's.

Hand-built snapshots carry the sampler's shares (their computation is tested on its own): an L4 time-sliced by three
pods whose processes kept the SMs busy 45 %, 27 % and 9 % of the time while the GPU was 90 % busy, over one hour in
which its energy counter rose by 1,000,000 J. Each pod owns 0.5, 0.3 and 0.1 of the hour and of the energy; the
remaining 0.1 is no one's (unallocated).
"""

from __future__ import annotations

import pytest

from nvdash.accounting.accountant import Accountant
from nvdash.accounting.attribution import attribute
from nvdash.accounting.ledger import Tally
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.sampling.usage_records import GpuProcess, GpuUsage, MigInstance, PodDevice, PodResources, Usage

HOUR_S = 3600.0
DELTA_MJ = 1_000_000_000
"""The L4's energy-counter increase over the hour: 1,000,000 J."""
PODS = ("serve-0", "serve-1", "serve-2")
SM_PCT = {"serve-0": 45.0, "serve-1": 27.0, "serve-2": 9.0}
ENERGY_J = {"serve-0": 500_000.0, "serve-1": 300_000.0, "serve-2": 100_000.0}


class Names:
    def user(self, uid: int) -> str | None:
        return None

    def group_of(self, user: str) -> str | None:
        return None


def usage(*, idle_pod: bool = False) -> Usage:
    """The three pods (and, with ``idle_pod``, a fourth allocated a replica and running nothing) on the L4."""
    pods = (*PODS, "serve-3") if idle_pod else PODS
    devices = tuple(PodDevice("prod", pod, "server", "nvidia.com/gpu.shared", f"GPU-l4::{n}", "shared")
                    for n, pod in enumerate(pods))
    processes = tuple(GpuProcess(0, "GPU-l4", 100 + n, ("compute",), gpu_memory_bytes=(n + 1) << 30,
                                 pod_namespace="prod", pod_name=pod, container_name="server")
                      for n, pod in enumerate(PODS))
    return Usage(time_s=0.0, gpus=(GpuUsage(0, "GPU-l4"),), processes=processes,
                 pods=PodResources(devices=devices, available=True, status="ok"))


def l4_shares(utilization_pct: float, energy_scale: float) -> UnitShares:
    """The sampler's record of the L4: the pods' SM shares of ``utilization_pct``, energy counted so far."""
    busy = utilization_pct > 0
    owners = tuple(
        OwnerShare(ShareOwner("pod", "prod", pod, "server"), sm_pct=SM_PCT[pod] if busy else 0.0,
                   fraction=SM_PCT[pod] / 90.0 if busy else None, memory_bytes=(n + 1) << 30, power_w=None,
                   energy_j=ENERGY_J[pod] * energy_scale if busy else 0.0, gpm_sm_active_pct=None, processes=1)
        for n, pod in enumerate(PODS))
    return UnitShares(0, "GPU-l4", "GPU-l4", "shared", 2.0, utilization_pct, owners,
                      unattributed_sm_pct=utilization_pct - sum(SM_PCT.values()) if busy else 0.0,
                      unattributed_memory_bytes=0, unattributed_power_w=None,
                      unattributed_energy_j=100_000.0 * energy_scale if busy else DELTA_MJ / 1000 * energy_scale,
                      measured=True)


def snapshot(time_s: float, energy_mj: int, utilization_pct: float, *, idle_pod: bool = False,
             shares: bool = True) -> Snapshot:
    gpu = GpuSample(0, utilization_pct=utilization_pct, memory_used_bytes=7 << 30, energy_mj=energy_mj)
    scale = energy_mj / DELTA_MJ
    return Snapshot(time_s, (gpu,), HostSample(), usage=usage(idle_pod=idle_pod),
                    shares=(l4_shares(utilization_pct, scale),) if shares else ())


def hour(utilization_pct: float, *, idle_pod: bool = False, shares: bool = True) -> tuple[Accountant, dict[str, Tally]]:
    accountant = Accountant({0: "GPU-l4"}, names=Names(), max_gap_s=2 * HOUR_S)
    accountant.step(snapshot(0.0, 0, utilization_pct, idle_pod=idle_pod, shares=shares))
    accountant.step(snapshot(HOUR_S, DELTA_MJ, utilization_pct, idle_pod=idle_pod, shares=shares))
    return accountant, {owner.job: tally for owner, _, tally in accountant.tallies()}


def test_pods_time_slicing_a_busy_gpu_own_their_share_of_the_hour_and_of_the_energy() -> None:
    _, tallies = hour(90.0)
    assert set(tallies) == {"prod/serve-0", "prod/serve-1", "prod/serve-2"}
    hours = {job: tally.allocated_s / HOUR_S for job, tally in tallies.items()}
    assert hours == pytest.approx({"prod/serve-0": 0.5, "prod/serve-1": 0.3, "prod/serve-2": 0.1}, rel=1e-12)
    energy = {job: tally.energy_j for job, tally in tallies.items()}
    assert energy == pytest.approx({"prod/serve-0": 500_000.0, "prod/serve-1": 300_000.0, "prod/serve-2": 100_000.0},
                                   rel=1e-12)
    # Owners plus the unallocated tenth add up to the GPU's hour and its energy-counter increase.
    assert sum(hours.values()) == pytest.approx(0.9, rel=1e-12)
    assert sum(energy.values()) + 100_000.0 == pytest.approx(DELTA_MJ / 1000, rel=1e-12)
    assert tallies["prod/serve-1"].mean_memory_bytes == 2 << 30  # the pod's own memory, not the GPU's
    assert tallies["prod/serve-0"].mean_utilization_pct == 90.0


def test_without_the_shares_the_old_rule_gives_each_allocated_pod_a_third() -> None:
    _, tallies = hour(90.0, shares=False)
    assert {job: tally.allocated_s for job, tally in tallies.items()} == pytest.approx(
        dict.fromkeys(("prod/serve-0", "prod/serve-1", "prod/serve-2"), HOUR_S / 3), rel=1e-12)


def test_an_idle_shared_gpu_is_split_equally_among_its_allocated_pods() -> None:
    _, tallies = hour(0.0, idle_pod=True)
    assert {job: tally.allocated_s for job, tally in tallies.items()} == pytest.approx(
        dict.fromkeys(("prod/serve-0", "prod/serve-1", "prod/serve-2", "prod/serve-3"), HOUR_S / 4), rel=1e-12)
    assert all(tally.wasted_s == pytest.approx(HOUR_S / 4, rel=1e-12) for tally in tallies.values())
    assert sum(tally.energy_j for tally in tallies.values()) == pytest.approx(DELTA_MJ / 1000, rel=1e-12)


def test_an_allocated_pod_that_used_nothing_of_a_busy_gpu_owns_none_of_it_but_is_still_followed() -> None:
    accountant, tallies = hour(90.0, idle_pod=True)
    assert "prod/serve-3" not in tallies
    assert tallies["prod/serve-0"].allocated_s == pytest.approx(HOUR_S / 2, rel=1e-12)
    idle = [share for share in accountant.shares if share.owner.job == "prod/serve-3"]
    assert [(share.fraction, share.allocated, share.processes) for share in idle] == [(0.0, True, 0)]


def test_a_mig_instance_with_one_owner_keeps_its_slices() -> None:
    big = MigInstance(0, "MIG-big", 1, 0, "3g.20gb", memory_used_bytes=1 << 30, sm_active_pct=60.0)
    gpu_usage = Usage(time_s=0.0, gpus=(GpuUsage(0, "GPU-a100", mig_enabled=True, instances=(big,)),),
                      processes=(GpuProcess(0, "GPU-a100", 7, ("compute",), gpu_memory_bytes=1 << 30,
                                            mig_uuid="MIG-big", pod_namespace="research", pod_name="finetune"),),
                      pods=PodResources(devices=(PodDevice("research", "finetune", "main", "nvidia.com/mig-3g.20gb",
                                                           "MIG-big", "mig"),), available=True))
    measured = UnitShares(0, "GPU-a100", "MIG-big", "mig", 2.0, 60.0, (
        OwnerShare(ShareOwner("pod", "research", "finetune", "main"), 30.0, 0.5, 1 << 30, None, 0.0, 30.0, 1),),
        30.0, 0, None, 0.0, measured=True)
    gpus = (GpuSample(0, memory_used_bytes=1 << 30),)
    with_shares = attribute(gpus, {0: "GPU-a100"}, gpu_usage, names=Names(), unit_shares=(measured,))
    assert with_shares == attribute(gpus, {0: "GPU-a100"}, gpu_usage, names=Names())
    assert [share.fraction for share in with_shares] == [3 / 7]


def test_a_shared_mig_instance_gives_each_owner_its_fraction_of_the_instances_slices() -> None:
    big = MigInstance(0, "MIG-big", 1, 0, "3g.20gb", memory_used_bytes=2 << 30, sm_active_pct=60.0)
    processes = tuple(GpuProcess(0, "GPU-a100", 7 + n, ("compute",), gpu_memory_bytes=1 << 30, mig_uuid="MIG-big",
                                 pod_namespace="research", pod_name=pod) for n, pod in enumerate(("a", "b")))
    gpu_usage = Usage(time_s=0.0, gpus=(GpuUsage(0, "GPU-a100", mig_enabled=True, instances=(big,)),),
                      processes=processes)
    owners = tuple(OwnerShare(ShareOwner("pod", "research", pod, "main"), sm_pct, sm_pct / 60.0, 1 << 30, None, 0.0,
                              None, 1) for pod, sm_pct in (("a", 45.0), ("b", 15.0)))
    measured = UnitShares(0, "GPU-a100", "MIG-big", "mig", 2.0, 60.0, owners, 0.0, 0, None, 0.0, measured=True)
    shares = attribute((GpuSample(0),), {0: "GPU-a100"}, gpu_usage, names=Names(), unit_shares=(measured,))
    assert {share.owner.job: share.fraction for share in shares} == pytest.approx(
        {"research/a": 3 / 7 * 0.75, "research/b": 3 / 7 * 0.25}, rel=1e-12)
