"""The server's history query threads: all started, each with its read connection, before any query asks."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from nvdash.history.database import open_database
from nvdash.history.query import SqliteHistory
from nvdash.server.history_setup import QUERY_WORKERS, HistoryRuntime
from tests.conftest import wait_for


def _query_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith("history-query"))


def _descriptors_on(path: Path) -> int:
    """This process's open descriptors on ``path`` itself (not its -wal or -shm)."""
    fd_dir = "/proc/self/fd"
    count = 0
    for name in os.listdir(fd_dir):
        try:
            if os.readlink(os.path.join(fd_dir, name)) == str(path):
                count += 1
        except OSError:  # closed between the listing and the read
            continue
    return count


def test_every_query_thread_starts_and_opens_its_connection_at_once(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    open_database(path).close()
    runtime = HistoryRuntime(backend=SqliteHistory(path))
    try:
        assert _query_threads() == 0
        runtime.start_query_workers()
        wait_for(lambda: (_query_threads(), _descriptors_on(path)), lambda seen: seen == (QUERY_WORKERS, QUERY_WORKERS),
                 timeout_s=10)
        # Queries after that reuse them: no more threads, no more connections.
        results = [runtime.executor.submit(lambda: runtime.backend.raw_interval_s() if runtime.backend else None)
                   for _ in range(20)]
        assert [future.result(timeout=10) for future in results] == [1.0] * 20, "no session yet: 1 s"
        assert (_query_threads(), _descriptors_on(path)) == (QUERY_WORKERS, QUERY_WORKERS)
    finally:
        runtime.executor.shutdown(wait=True)


def test_a_missing_file_still_starts_the_threads_and_the_first_query_says_what_is_wrong(tmp_path: Path) -> None:
    runtime = HistoryRuntime(backend=SqliteHistory(tmp_path / "absent.sqlite"))
    try:
        runtime.start_query_workers()
        wait_for(_query_threads, lambda threads: threads == QUERY_WORKERS, timeout_s=20)
        backend = runtime.backend
        assert isinstance(backend, SqliteHistory)
        future = runtime.executor.submit(backend.raw_interval_s)
        error = future.exception(timeout=10)
        assert error is not None
        assert "absent.sqlite" in str(error)
    finally:
        runtime.executor.shutdown(wait=True)
