"""The history's threads under the supervisor: the writer and the query workers are listed, beat each round, are
restarted when they raise, and a query worker stuck in one call shows as overdue."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

from nvdash.history.database import open_database
from nvdash.history.query import SqliteHistory
from nvdash.history.writer import THREAD_NAME, HistoryWriter
from nvdash.sampling.daemon_pool import DaemonPool
from nvdash.sampling.records import Snapshot
from nvdash.server.history_setup import QUERY_WORKERS, HistoryRuntime
from nvdash.supervision import Supervisor
from tests.conftest import wait_for
from tests.unit.test_history_store import T0, count, inventory, simple


def test_the_writer_runs_under_the_supervisor_and_beats_each_round(tmp_path: Path) -> None:
    supervisor = Supervisor()
    writer = HistoryWriter(tmp_path / "h.sqlite", inventory(1), "test", 1.0, supervisor=supervisor)
    writer.start()
    try:
        writer.submit(simple(T0))
        first = wait_for(lambda: supervisor.report().get(THREAD_NAME, {}),
                         lambda seen: seen.get("last_beat_at") is not None, timeout_s=20)
        assert first["running"] is True
        assert first["deaths"] == 0
        wait_for(lambda: supervisor.report()[THREAD_NAME]["last_beat_at"],
                 lambda beat: beat != first["last_beat_at"], timeout_s=20)  # and again, a round later
        assert count(writer.path, "gpu_raw") == 1
    finally:
        writer.stop()
    assert supervisor.report()[THREAD_NAME]["running"] is False


def test_a_writer_round_that_raises_is_restarted_counted_and_writing_goes_on(tmp_path: Path) -> None:
    supervisor = Supervisor(first_backoff_s=0.05)
    writer = HistoryWriter(tmp_path / "h.sqlite", inventory(1), "test", 1.0, supervisor=supervisor)
    writer.start()
    try:
        writer.submit(cast(Snapshot, object()))  # not a snapshot: building its rows raises (a bug, not the disk)
        report = wait_for(lambda: supervisor.report()[THREAD_NAME], lambda seen: seen["deaths"] == 1, timeout_s=20)
        assert report["last_error"].startswith("AttributeError")
        assert writer.stats.dropped == 1
        writer.submit(simple(T0))
        wait_for(lambda: count(writer.path, "gpu_raw"), lambda rows: rows == 1, timeout_s=20)
        assert supervisor.report()[THREAD_NAME]["running"] is True
    finally:
        writer.stop()


def test_query_workers_run_under_the_supervisor_and_open_their_connections(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    open_database(path).close()
    supervisor = Supervisor()
    runtime = HistoryRuntime(backend=SqliteHistory(path))
    runtime.start_query_workers(supervisor)
    try:
        names = [f"history-query-{index}" for index in range(QUERY_WORKERS)]
        report = wait_for(supervisor.report, lambda seen: all(
            seen.get(name, {}).get("last_beat_at") is not None for name in names), timeout_s=20)
        assert sorted(report) == names
        assert runtime.executor.submit(lambda: 6 * 7).result(timeout=10) == 42
    finally:
        runtime.executor.shutdown(wait=True)
    assert all(not item["running"] for item in supervisor.report().values())


def test_a_worker_stuck_in_one_call_is_overdue_and_recovers(tmp_path: Path) -> None:
    supervisor = Supervisor()
    pool = DaemonPool(1, "stuck-test", start=False)
    pool.start(supervisor, expect_every_s=0.1)
    release = threading.Event()
    try:
        wait_for(supervisor.report, lambda seen: seen["stuck-test-0"]["last_beat_at"] is not None, timeout_s=20)
        future = pool.submit(release.wait, 60)
        overdue = wait_for(supervisor.overdue, lambda found: [item.name for item in found] == ["stuck-test-0"],
                           timeout_s=20)
        assert overdue[0].age_s > 0.3
        release.set()
        assert future.result(timeout=10) is True
        wait_for(supervisor.overdue, lambda found: found == [], timeout_s=20)
    finally:
        release.set()
        pool.shutdown(wait=True)


def test_a_worker_whose_warm_up_raises_is_restarted() -> None:
    supervisor = Supervisor(first_backoff_s=0.05)
    attempts: list[int] = []

    def warm_up() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("cannot open the history")

    pool = DaemonPool(1, "warm-test", start=False)
    pool.start(supervisor, expect_every_s=1.0, on_start=warm_up)
    try:
        report: dict[str, Any] = wait_for(lambda: supervisor.report()["warm-test-0"],
                                          lambda seen: seen["deaths"] == 1 and seen["last_beat_at"] is not None,
                                          timeout_s=20)
        assert report["last_error"] == "OSError: cannot open the history"
        assert pool.submit(len, "abc").result(timeout=10) == 3
    finally:
        pool.shutdown(wait=True)
