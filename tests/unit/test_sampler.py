"""The sampler thread: one snapshot per interval, time budget for GPUs, survives failing sweeps."""

from __future__ import annotations

import threading
import time

import pytest

from nvdash.sampling.records import GpuSample, HostInfo, HostSample, Inventory
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.usage_records import Usage
from nvdash.store import Store


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


def test_thread_samples_at_the_interval_and_stops() -> None:
    store = _store()
    sampler = Sampler(store, Host(), None, interval_s=0.1)
    sampler.start()
    time.sleep(1.05)
    sampler.stop()
    count = len(store)
    assert 9 <= count <= 12
    time.sleep(0.3)
    assert len(store) == count
    assert sampler.stats().sweeps == count
    assert not any(thread.name == "nvdash-sampler" for thread in threading.enumerate())


def test_a_failing_sweep_is_counted_and_sampling_goes_on() -> None:
    class Flaky(Host):
        def read(self) -> HostSample:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("boom")
            return HostSample()

    store = _store()
    sampler = Sampler(store, Flaky(), None, interval_s=0.1)
    sampler.start()
    time.sleep(0.55)
    sampler.stop()
    assert sampler.stats().errors == 1
    assert len(store) >= 3


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


def test_without_a_usage_reader_snapshots_have_no_usage() -> None:
    assert Sampler(_store(), Host(), Gpus(), interval_s=0.5).sample_once().usage is None
