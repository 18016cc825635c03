"""Allocated but idle: flagged only after a whole window of idle readings, with the reason of the latest."""

from __future__ import annotations

from nvdash.accounting.attribution import Owner, Share
from nvdash.accounting.idle import MEMORY_AT_ZERO, NO_PROCESS, NO_UTILIZATION, IdleTracker, idle_reason

JOB = Owner("slurm", "555", "alice", "physics")
GiB = 1 << 30


def share(*, allocated: bool = True, processes: int = 0, util: float | None = 0.0, memory: int | None = 0,
          owner: Owner = JOB) -> Share:
    return Share(0, "GPU-a", 1.0, owner, memory, util, None, allocated=allocated, processes=processes)


def test_the_reasons_follow_the_definition() -> None:
    assert idle_reason(share(processes=0, util=35.0)) == NO_PROCESS, "allocated, nothing of the job runs on it"
    assert idle_reason(share(processes=1, util=0.0, memory=0)) == NO_UTILIZATION
    assert idle_reason(share(processes=2, util=0.0, memory=4 * GiB)) == MEMORY_AT_ZERO
    assert idle_reason(share(allocated=False, processes=1, util=0.0, memory=GiB)) == MEMORY_AT_ZERO
    assert idle_reason(share(processes=1, util=1.0, memory=GiB)) is None
    assert idle_reason(share(processes=1, util=None, memory=GiB)) is None, "unknown utilization is not idle"


def test_a_share_is_flagged_after_the_window_and_starts_over_when_busy() -> None:
    tracker = IdleTracker(after_s=60.0)
    for second in range(0, 60, 10):
        tracker.step(float(second), [share()])
    assert tracker.flagged() == [], "50 s idle of 60"
    tracker.step(60.0, [share()])
    [flagged] = tracker.flagged()
    assert (flagged.since_s, flagged.reason, flagged.idle_s(tracker.now_s)) == (0.0, NO_PROCESS, 60.0)
    tracker.step(70.0, [share(processes=1, util=20.0)])
    assert tracker.flagged() == []
    tracker.step(80.0, [share(processes=1, util=0.0)])
    tracker.step(139.0, [share(processes=1, util=0.0)])
    assert tracker.flagged() == [], "idle again from 80 s: 59 s"
    tracker.step(150.0, [])
    tracker.step(220.0, [share()])
    assert tracker.flagged() == [], "gone and back: starts over"
