"""The sampler thread: one snapshot per interval, time budget for GPUs, survives failing sweeps."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from nvdash.freshness import Stale
from nvdash.sampling import sampler as sampler_module
from nvdash.sampling.records import GpuSample, HostInfo, HostSample, Inventory
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.shares import ShareTracker
from nvdash.sampling.usage_records import GpuProcess, GpuUsage, Usage
from nvdash.store import Store
from nvdash.supervision import Supervisor
from tests.conftest import wait_for


class Host:
    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> HostSample:
        self.calls += 1
        return HostSample(cpu_pct=float(self.calls))


class Gpus:
    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def read(self, timeout_s: float) -> tuple[GpuSample, ...]:
        self.timeouts.append(timeout_s)
        return (GpuSample(0, utilization_pct=50.0),)


def _store(capacity: int = 100) -> Store:
    return Store(Inventory(host=HostInfo("h", 1, 1)), capacity=capacity)


def test_sample_once_appends_one_snapshot_with_wall_time() -> None:
    store = _store()
    gpus = Gpus()
    sampler = Sampler(store, Host(), gpus, interval_s=0.5, wall_clock=lambda: 1234.5)
    snapshot = sampler.sample_once()
    assert store.latest() is snapshot
    assert snapshot.time_s == 1234.5
    assert snapshot.gpus[0].utilization_pct == 50.0
    assert gpus.timeouts == [pytest.approx(0.4)]


def test_thread_samples_until_stopped_and_then_no_more() -> None:
    store = _store()
    sampler = Sampler(store, Host(), None, interval_s=0.1)
    sampler.start()
    wait_for(lambda: len(store), lambda rows: rows >= 10)
    sampler.stop()
    # The thread has ended, so nothing can append any more.
    assert not any(thread.name == "sampler" for thread in threading.enumerate())
    assert sampler.stats().sweeps == len(store) >= 10
    assert sampler.stats().errors == 0


class SteppedClock:
    """A monotonic clock that moves only when a reading takes time or the sampler waits."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def monotonic(self) -> float:
        return self.now_s


class SteppedStop:
    """Stands in for the sampler's stop event: a wait moves the clock instead of sleeping; set after ``waits``."""

    def __init__(self, clock: SteppedClock, waits: int) -> None:
        self._clock = clock
        self._waits = waits
        self._set = False
        self.timeouts: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        self._clock.now_s += timeout
        self._set = self._set or len(self.timeouts) >= self._waits
        return self._set

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def test_thread_sweeps_once_per_interval_counted_from_each_start_and_never_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = SteppedClock()
    durations_s = [0.03, 0.03, 0.03, 0.25, 0.03, 0.03]

    class SlowHost(Host):
        def read(self) -> HostSample:
            clock.now_s += durations_s[self.calls]
            return super().read()

    stop = SteppedStop(clock, waits=len(durations_s))
    monkeypatch.setattr(sampler_module, "time", clock)
    monkeypatch.setattr(sampler_module, "threading", SimpleNamespace(Event=lambda: stop, Thread=threading.Thread))
    store = _store()
    sampler = Sampler(store, SlowHost(), None, interval_s=0.1, wall_clock=clock.monotonic)
    sampler.start()
    wait_for(lambda: len(stop.timeouts), lambda waits: waits == len(durations_s))
    sampler.stop()
    # Each sweep waits out the rest of its interval; the one that overran it is followed by a full interval,
    # not by a burst of sweeps to make up for the ones it missed.
    assert [snapshot.time_s for snapshot in store.since(0)[0]] == pytest.approx(
        [100.0, 100.1, 100.2, 100.3, 100.65, 100.75]
    )
    assert stop.timeouts == pytest.approx([0.07, 0.07, 0.07, 0.1, 0.07, 0.07])
    assert sampler.stats().sweeps == 6
    assert sampler.stats().max_sweep_s == pytest.approx(0.25)


def test_a_failing_sweep_is_counted_and_sampling_goes_on() -> None:
    class Flaky(Host):
        def read(self) -> HostSample:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("boom")
            return HostSample()

    store = _store()
    host = Flaky()
    sampler = Sampler(store, host, None, interval_s=0.1)
    sampler.start()
    wait_for(lambda: len(store), lambda rows: rows >= 3)
    sampler.stop()
    assert sampler.stats().errors == 1
    assert sampler.stats().sweeps == len(store) == host.calls - 1


def test_interval_below_minimum_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least"):
        Sampler(_store(), Host(), None, interval_s=0.05)


class Usages:
    """Counts collections; fails when told to."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []
        self.fail = False

    def collect(self, time_s: float, timeout_s: float) -> Usage:
        self.calls.append((time_s, timeout_s))
        if self.fail:
            raise RuntimeError("boom")
        return Usage(time_s=time_s)


def test_usage_is_read_at_its_own_cadence_and_carried_in_every_snapshot() -> None:
    store = _store()
    usages = Usages()
    clock = iter(range(100, 200))
    sampler = Sampler(store, Host(), Gpus(), interval_s=0.5, wall_clock=lambda: float(next(clock)),
                      usage=usages, usage_interval_s=3600.0)
    first = sampler.sample_once()
    second = sampler.sample_once()
    assert first.usage is not None
    assert first.usage.time_s == 100.0
    assert second.usage is first.usage
    assert usages.calls == [(100.0, pytest.approx(0.25))]


def test_usage_is_read_every_sweep_when_its_interval_has_always_passed() -> None:
    usages = Usages()
    sampler = Sampler(_store(), Host(), Gpus(), interval_s=0.5, usage=usages, usage_interval_s=0.0)
    for _ in range(3):
        sampler.sample_once()
    assert len(usages.calls) == 3


def test_a_failing_usage_read_keeps_the_previous_usage_and_the_sweep() -> None:
    usages = Usages()
    sampler = Sampler(_store(), Host(), Gpus(), interval_s=0.5, usage=usages, usage_interval_s=0.0)
    before = sampler.sample_once().usage
    usages.fail = True
    after = sampler.sample_once()
    assert after.usage is before
    assert after.gpus[0].utilization_pct == 50.0


class SharedUsages(Usages):
    """One GPU with one process doing 20 % of its SM time."""

    def collect(self, time_s: float, timeout_s: float) -> Usage:
        super().collect(time_s, timeout_s)
        process = GpuProcess(0, "GPU-x", 4321, ("compute",), sm_pct=20.0)
        return Usage(time_s=time_s, gpus=(GpuUsage(0, "GPU-x", process_utilization=True),), processes=(process,))


def test_snapshots_carry_the_shares_of_the_latest_usage() -> None:
    sampler = Sampler(_store(), Host(), Gpus(), interval_s=0.5, usage=SharedUsages(), usage_interval_s=0.0)
    (unit,) = sampler.sample_once().shares
    assert unit.utilization_pct == 50.0
    assert [(o.owner.pid, o.sm_pct, o.fraction) for o in unit.owners] == [(4321, 20.0, 0.4)]
    assert unit.unattributed_sm_pct == 30.0
    assert Sampler(_store(), Host(), Gpus(), interval_s=0.5).sample_once().shares == ()


def test_a_failing_share_computation_costs_the_shares_not_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_args: object) -> tuple[()]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(ShareTracker, "update", boom)
    sampler = Sampler(_store(), Host(), Gpus(), interval_s=0.5, usage=SharedUsages(), usage_interval_s=0.0)
    snapshot = sampler.sample_once()
    assert snapshot.shares == ()
    assert snapshot.usage is not None
    assert sampler.stats().errors == 0


def test_without_a_usage_reader_snapshots_have_no_usage() -> None:
    assert Sampler(_store(), Host(), Gpus(), interval_s=0.5).sample_once().usage is None


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 50.0

    def __call__(self) -> float:
        return self.now_s


def test_the_sweeps_are_stale_after_three_intervals_without_one() -> None:
    ticks = Ticks()
    wall = iter(float(t) for t in range(1000, 2000))
    sampler = Sampler(_store(), Host(), Gpus(), interval_s=0.5, wall_clock=lambda: next(wall), monotonic=ticks)
    ticks.now_s += 10
    assert sampler.stale() == [], "not started: nothing is expected of it"
    sampler._started_mono, sampler._started_wall = ticks(), 999.0  # as start() does, without the thread
    ticks.now_s += 5.1
    assert sampler.stale() == [Stale("sampler", 999.0)], "never swept: stale since its start"
    snapshot = sampler.sample_once()
    assert sampler.stale() == []
    assert sampler.stats().last_sweep_at == snapshot.time_s
    ticks.now_s += 5.0
    assert sampler.stale() == []
    ticks.now_s += 0.1
    assert sampler.stale() == [Stale("sampler", snapshot.time_s)]


def test_process_readings_that_keep_failing_are_stale_while_the_sweeps_go_on() -> None:
    ticks = Ticks()
    usages = Usages()
    sampler = Sampler(_store(), Host(), Gpus(), interval_s=0.5, wall_clock=lambda: 100.0 + ticks(),
                      usage=usages, usage_interval_s=0.0, monotonic=ticks)
    sampler._started_mono, sampler._started_wall = ticks(), 150.0
    first = sampler.sample_once()
    assert sampler.stats().last_usage_at == first.time_s
    usages.fail = True
    for _ in range(11):
        ticks.now_s += 0.5
        sampler.sample_once()
    assert sampler.stale() == [Stale("processes", first.time_s)]
    assert sampler.stats().last_sweep_at == 100.0 + ticks()


def test_the_thread_runs_supervised_and_a_held_sweep_makes_it_overdue() -> None:
    release = threading.Event()
    holding = threading.Event()

    class HeldHost(Host):
        def read(self) -> HostSample:
            if self.calls >= 2:
                holding.set()
                release.wait(60)
            return super().read()

    supervisor = Supervisor()
    store = _store()
    sampler = Sampler(store, HeldHost(), None, interval_s=0.1, supervisor=supervisor)
    sampler.start()
    try:
        assert wait_for(lambda: [item.name for item in supervisor.overdue()], bool) == ["sampler"]
        assert holding.is_set()
        assert wait_for(lambda: [item.part for item in sampler.stale()], bool) == ["sampler"]
        assert supervisor.report()["sampler"]["running"] is True
        release.set()
        wait_for(lambda: (supervisor.overdue(), sampler.stale()), lambda found: found == ([], []))
    finally:
        release.set()
        sampler.stop()
