"""The supervisor restarts a dying thread with backoff, counts and reports its deaths, and finds stuck threads."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from nvdash.supervision import OVERDUE_ROUNDS, Supervisor


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_dying_loop_is_restarted_counted_and_logged_once_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor(first_backoff_s=0.01, max_backoff_s=0.02)
    stop = threading.Event()
    runs: list[int] = []

    def run() -> None:
        runs.append(1)
        if len(runs) <= 3:
            raise RuntimeError("boom")
        stop.wait()

    with caplog.at_level(logging.ERROR, logger="nvdash.supervision"):
        thread = supervisor.spawn("nvdash-test", run, stop)
        _until(lambda: len(runs) == 4)
    report = supervisor.report()["nvdash-test"]
    assert report["deaths"] == 3
    assert report["running"] is True
    assert report["last_error"] == "RuntimeError: boom"
    assert supervisor.deaths() == 3
    with_traceback = [record for record in caplog.records if record.exc_info]
    assert len(with_traceback) == 1
    assert len(caplog.records) == 3
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert supervisor.report()["nvdash-test"]["running"] is False


def test_backoff_doubles_up_to_its_cap() -> None:
    waits: list[float] = []

    class Recording(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(float(timeout or 0))
            return len(waits) >= 6

    supervisor = Supervisor(first_backoff_s=1.0, max_backoff_s=4.0, healthy_after_s=1e9)

    def run() -> None:
        raise ValueError("always")

    supervisor.spawn("nvdash-backoff", run, Recording()).join(5)
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]


def test_a_loop_that_returns_ends_its_thread_without_a_death() -> None:
    supervisor = Supervisor()
    thread = supervisor.spawn("nvdash-once", lambda: None, threading.Event())
    thread.join(5)
    assert supervisor.report()["nvdash-once"] == {
        "running": False, "deaths": 0, "last_error": None, "last_error_at": None,
        "last_beat_at": None, "last_beat_age_s": None,
    }


def test_a_thread_without_beats_for_three_rounds_is_overdue() -> None:
    now = [100.0]
    supervisor = Supervisor(monotonic=lambda: now[0], wall_clock=lambda: 1_000_000.0 + now[0])
    stop = threading.Event()
    supervisor.spawn("nvdash-stuck", stop.wait, stop, expect_every_s=1.0)
    supervisor.beat("nvdash-stuck")
    now[0] += OVERDUE_ROUNDS * 1.0 - 0.01
    assert supervisor.overdue() == []
    now[0] += 0.02
    (overdue,) = supervisor.overdue()
    assert overdue.name == "nvdash-stuck"
    assert overdue.since_wall == pytest.approx(1_000_100.0)
    assert overdue.age_s == pytest.approx(3.01)
    supervisor.beat("nvdash-stuck")
    assert supervisor.overdue() == []
    stop.set()
