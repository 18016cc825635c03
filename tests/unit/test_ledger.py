"""GPU-seconds, busy seconds and joules add up per owner from one reading to the next."""

from __future__ import annotations

import pytest

from nvdash.accounting.attribution import Owner, Share
from nvdash.accounting.ledger import Ledger
from nvdash.sampling.records import GpuSample

GiB = 1 << 30
ALICE = Owner("user", "alice", "alice", "physics")
BOB = Owner("slurm", "77", "bob", "chemistry")


def gpu(index: int, energy_mj: int | None, lost: bool = False) -> GpuSample:
    return GpuSample(index=index, lost=True) if lost else GpuSample(index=index, energy_mj=energy_mj)


def share(owner: Owner, fraction: float = 1.0, *, util: float | None = 50.0, memory: int | None = GiB,
          sm: float | None = None, index: int = 0, unit: str = "GPU-a") -> Share:
    return Share(index, unit, fraction, owner, memory, util, sm)


def test_an_owner_gets_the_interval_its_reading_closes() -> None:
    ledger = Ledger()
    ledger.step(100.0, [gpu(0, 10_000)], [share(ALICE)])  # the first reading opens the count
    assert ledger.tallies == {}
    ledger.step(100.5, [gpu(0, 11_000)], [share(ALICE, util=40.0, memory=2 * GiB, sm=20.0)])
    ledger.step(101.0, [gpu(0, 11_600)], [share(ALICE, util=0.0, memory=GiB, sm=0.0)])
    tally = ledger.tallies[(ALICE, 0, 0.0)]
    assert (tally.start_s, tally.end_s) == (100.0, 101.0)
    assert tally.allocated_s == pytest.approx(1.0)
    assert tally.busy_s == pytest.approx(0.5), "utilization 0 is allocated but not busy"
    assert tally.efficiency == pytest.approx(0.5)
    assert tally.mean_utilization_pct == pytest.approx(20.0)
    assert tally.mean_sm_active_pct == pytest.approx(10.0)
    assert tally.energy_j == pytest.approx(1.6), "(11,600 - 10,000) mJ"
    assert tally.peak_memory_bytes == 2 * GiB
    assert tally.mean_memory_bytes == pytest.approx(1.5 * GiB)


def test_owners_sharing_a_gpu_split_its_seconds_and_energy_once() -> None:
    ledger = Ledger()
    ledger.step(0.0, [gpu(0, 0)], [])
    ledger.step(2.0, [gpu(0, 8_000)], [share(ALICE, 0.75), share(BOB, 0.25)])
    alice, bob = ledger.tallies[(ALICE, 0, 0.0)], ledger.tallies[(BOB, 0, 0.0)]
    assert (alice.allocated_s, bob.allocated_s) == pytest.approx((1.5, 0.5))
    assert (alice.energy_j, bob.energy_j) == pytest.approx((6.0, 2.0))
    assert alice.energy_j + bob.energy_j == pytest.approx(8.0), "the GPU's energy, counted once"


def test_mig_instances_take_their_part_of_the_gpus_energy_not_all_of_it() -> None:
    ledger = Ledger()
    ledger.step(0.0, [gpu(0, 0)], [])
    ledger.step(1.0, [gpu(0, 7_000)], [share(ALICE, 3 / 7, unit="MIG-3g"), share(BOB, 1 / 7, unit="MIG-1g")])
    assert ledger.tallies[(ALICE, 0, 0.0)].energy_j == pytest.approx(3.0)
    assert ledger.tallies[(BOB, 0, 0.0)].energy_j == pytest.approx(1.0)
    assert ledger.tallies[(ALICE, 0, 0.0)].allocated_s == pytest.approx(3 / 7)


def test_a_driver_reload_counts_the_new_reading_and_a_lost_gpu_leaves_energy_unknown() -> None:
    ledger = Ledger()
    ledger.step(0.0, [gpu(0, 5_000_000)], [])
    ledger.step(1.0, [gpu(0, 2_000)], [share(ALICE)])  # counter restarted: 2,000 mJ since the reload
    assert ledger.tallies[(ALICE, 0, 0.0)].energy_j == pytest.approx(2.0)
    ledger.step(2.0, [gpu(0, None, lost=True)], [])
    ledger.step(3.0, [gpu(0, 9_000)], [share(ALICE)])
    tally = ledger.tallies[(ALICE, 0, 0.0)]
    assert tally.energy_j == pytest.approx(2.0), "nothing compared across the lost reading"
    assert tally.allocated_s == pytest.approx(2.0)
    assert tally.energy_known_s == pytest.approx(1.0)


def test_a_gap_longer_than_the_limit_and_a_reading_out_of_order_are_not_counted() -> None:
    ledger = Ledger(max_gap_s=10.0)
    ledger.step(0.0, [gpu(0, 0)], [])
    ledger.step(100.0, [gpu(0, 50_000)], [share(ALICE)])
    assert ledger.tallies == {}
    ledger.step(99.0, [gpu(0, 1)], [share(ALICE)])
    assert ledger.tallies == {}
    ledger.step(101.0, [gpu(0, 51_000)], [share(ALICE)])
    tally = ledger.tallies[(ALICE, 0, 0.0)]
    assert (tally.allocated_s, tally.energy_j) == pytest.approx((1.0, 1.0))


def test_unknown_readings_leave_their_averages_out() -> None:
    ledger = Ledger()
    ledger.step(0.0, [gpu(0, None)], [])
    ledger.step(1.0, [gpu(0, None)], [share(ALICE, util=None, memory=None)])
    tally = ledger.tallies[(ALICE, 0, 0.0)]
    assert tally.allocated_s == 1.0
    assert tally.efficiency is None
    assert tally.mean_utilization_pct is None
    assert tally.mean_memory_bytes is None
    assert tally.peak_memory_bytes is None
    assert tally.energy_known_s == 0.0


def test_intervals_are_counted_in_the_hour_of_the_reading_that_closes_them_and_drained_once() -> None:
    ledger = Ledger()
    ledger.step(3599.0, [gpu(0, 0)], [])
    ledger.step(3600.5, [gpu(0, 1_500)], [share(ALICE)])  # closes 3599-3600.5: counted in the hour from 3600
    ledger.step(3601.0, [gpu(0, 2_000)], [share(ALICE)])
    assert set(ledger.tallies) == {(ALICE, 0, 3600.0)}
    assert ledger.tallies[(ALICE, 0, 3600.0)].allocated_s == pytest.approx(2.0)
    drained = ledger.drain()
    assert ledger.tallies == {}
    ledger.step(7201.0, [gpu(0, 2_000)], [share(ALICE)])  # a gap over the limit: nothing counted
    ledger.step(7202.0, [gpu(0, 3_000)], [share(ALICE)])
    assert ledger.tallies[(ALICE, 0, 7200.0)].energy_j == pytest.approx(1.0)
    ledger.restore(drained)
    ledger.restore({(ALICE, 0, 3600.0): drained[(ALICE, 0, 3600.0)]})
    assert ledger.tallies[(ALICE, 0, 3600.0)].allocated_s == pytest.approx(4.0), "a restore adds to what is there"
    ledger.forget_before(7200.0)
    assert set(ledger.tallies) == {(ALICE, 0, 7200.0)}
