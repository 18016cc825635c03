"""The XID waiter over a simulated driver whose event wait does not block: it backs off instead of spinning."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pynvml
import pytest

from nvdash.sampling import xid_watcher
from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.nvml_device import Device, NvmlCaller
from nvdash.sampling.nvml_source import install_library
from nvdash.sampling.records import GpuEvent, GpuInfo
from nvdash.sampling.xid_watcher import XidWatcher
from nvdash.supervision import Supervisor
from tests.conftest import wait_for

WAIT = "nvmlEventSetWait_v2"


@pytest.fixture
def fake() -> Iterator[FakeNvmlLibrary]:
    """The simulated dgx-h100 under the real pynvml, initialised."""
    library = FakeNvmlLibrary("dgx-h100", seed=1, latency_scale=0.0)
    restore = install_library(pynvml, library)
    pynvml.nvmlInit()
    try:
        yield library
    finally:
        pynvml.nvmlShutdown()
        restore()


def _devices() -> list[Device]:
    return [Device(i, pynvml.nvmlDeviceGetHandleByIndex(i), GpuInfo(i, "GPU", "", None, None, None, None, 0, None))
            for i in range(2)]


def _waits(fake: FakeNvmlLibrary) -> int:
    return fake.call_counts().get(WAIT, 0)


def _ignore(event: GpuEvent) -> None:
    pass


def test_the_simulated_wait_can_return_at_once_with_pynvmls_timeout_error(fake: FakeNvmlLibrary) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    fake.event_wait_returns_at_once()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 60_000)  # an hour's timeout: the test would hang if it blocked
    fake.xid(48, 0)
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(1), pynvml.nvmlEventTypeXidCriticalError,
                                    event_set)
    fake.xid(63, 1)
    assert pynvml.nvmlEventSetWait_v2(event_set, 60_000).eventData == 63, "a due event still comes at once"
    pynvml.nvmlEventSetFree(event_set)


def test_a_wait_that_does_not_block_backs_off_doubling_up_to_the_cap(fake: FakeNvmlLibrary) -> None:
    fake.event_wait_returns_at_once()
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        return len(pauses) == 10  # then stop

    watcher = XidWatcher(NvmlCaller(pynvml), _devices(), _ignore, monotonic=lambda: 100.0, pause=pause)
    assert watcher.start()
    wait_for(lambda: len(pauses), lambda n: n == 10)
    watcher.stop()
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, *[xid_watcher.MAX_BACKOFF_S] * 4]
    assert _waits(fake) == 10, "one wait per pause: never two in a row without one"


def test_a_wait_that_lasted_its_timeout_is_not_a_failure(fake: FakeNvmlLibrary) -> None:
    readings = iter(range(0, 10**6, 1))  # each reading one second on: every wait took its whole timeout and more
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        return True

    watcher = XidWatcher(NvmlCaller(pynvml), _devices(), _ignore, monotonic=lambda: float(next(readings)),
                         pause=pause, timeout_ms=50)
    fake.event_wait_returns_at_once()
    assert watcher.start()
    wait_for(lambda: _waits(fake), lambda n: n >= 20)
    watcher.stop()
    assert pauses == []


def test_failures_in_a_row_pause_at_least_the_schedule_on_the_real_clock(fake: FakeNvmlLibrary) -> None:
    """Without injection: five waits that return at once take at least the first four pauses (a lower bound that a
    loaded machine only makes longer); a spinning waiter makes them in microseconds."""
    fake.event_wait_returns_at_once()
    watcher = XidWatcher(NvmlCaller(pynvml), _devices(), _ignore)
    started = time.monotonic()
    assert watcher.start()
    wait_for(lambda: _waits(fake), lambda n: n >= 5)
    elapsed = time.monotonic() - started
    watcher.stop()
    assert elapsed >= 0.1 + 0.2 + 0.4 + 0.8


def test_the_waiter_is_supervised_and_beats_each_round(fake: FakeNvmlLibrary) -> None:
    supervisor = Supervisor()
    watcher = XidWatcher(NvmlCaller(pynvml), _devices(), _ignore, supervisor=supervisor, timeout_ms=50)
    assert watcher.start()
    report = wait_for(supervisor.report, lambda r: r.get("nvdash-xid", {}).get("last_beat_at") is not None)
    assert report["nvdash-xid"]["running"] is True
    assert report["nvdash-xid"]["deaths"] == 0
    watcher.stop()
    wait_for(supervisor.report, lambda r: r["nvdash-xid"]["running"] is False)


def test_the_backoff_schedule() -> None:
    assert [xid_watcher.backoff_s(n) for n in range(1, 9)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert xid_watcher.backoff_s(10**6) == xid_watcher.MAX_BACKOFF_S
