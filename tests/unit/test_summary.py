"""Accounting rows add up the tallies of each job, pod, user or project across its GPUs."""

from __future__ import annotations

import pytest

from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import Tally
from nvdash.accounting.summary import summarize

GiB = 1 << 30
TRAIN = Owner("slurm", "1001", "alice", "physics")
SERVE = Owner("pod", "web/server-0", "bob", "web")
NOTEBOOK = Owner("user", "alice", "alice", "physics")


def tally(start: float, end: float, allocated: float, busy: float, energy_j: float, *,
          peak: int | None = None) -> Tally:
    return Tally(start_s=start, end_s=end, allocated_s=allocated, busy_s=busy, activity_known_s=allocated,
                 utilization_s=busy / 2, energy_j=energy_j, energy_known_s=allocated, peak_memory_bytes=peak)


TALLIES = [
    (TRAIN, 0, tally(0, 7200, 7200, 5400, 3_600_000, peak=40 * GiB)),
    (TRAIN, 1, tally(60, 7200, 7140, 7140, 3_600_000, peak=30 * GiB)),
    (SERVE, 2, tally(0, 3600, 3600, 0, 360_000, peak=GiB)),
    (NOTEBOOK, 3, tally(100, 1900, 1800, 900, 180_000)),
]


def test_a_job_on_two_gpus_is_one_row_with_both() -> None:
    rows = summarize(TALLIES, "job")
    assert [row.key for row in rows] == ["1001", "web/server-0", "alice"]
    train = rows[0]
    assert train.gpus == {0, 1}
    assert train.gpu_hours == pytest.approx((7200 + 7140) / 3600)
    assert train.energy_kwh == pytest.approx(2.0), "3.6 MJ per GPU = 1 kWh each"
    assert train.total.efficiency == pytest.approx((5400 + 7140) / (7200 + 7140))
    assert train.total.peak_memory_bytes == 40 * GiB
    assert (train.total.start_s, train.total.end_s) == (0, 7200)
    assert train.total.energy_complete


def test_users_projects_and_pods_group_the_same_tallies() -> None:
    users = {row.key: row for row in summarize(TALLIES, "user")}
    assert set(users) == {"alice", "bob"}
    assert users["alice"].gpu_hours == pytest.approx((7200 + 7140 + 1800) / 3600)
    assert users["alice"].kinds == {"slurm", "user"}
    assert users["bob"].wasted_hours == pytest.approx(1.0), "an hour allocated at utilization 0"
    assert users["bob"].total.efficiency == 0.0
    assert [row.key for row in summarize(TALLIES, "namespace")] == ["physics", "web"]
    assert [row.key for row in summarize(TALLIES, "pod")] == ["web/server-0"]


def test_energy_read_over_part_of_the_time_is_marked_incomplete() -> None:
    partial = Tally(start_s=0, end_s=10, allocated_s=10, energy_j=5, energy_known_s=4)
    (row,) = summarize([(NOTEBOOK, 0, partial)], "job")
    assert not row.total.energy_complete
    assert row.total.efficiency is None
