"""Opening the history for a server: the writer (or read-only when another nvdash writes the file), or a replay.

The writer thread and the query threads run under the server's :class:`~nvdash.supervision.Supervisor`: a death
is logged, counted and the thread restarted, and one stuck in a round shows as overdue on ``/health``.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvdash.history.database import HistoryError, HistoryLocked, default_path
from nvdash.history.query import HistoryBackend, SqliteHistory
from nvdash.history.replay import recent_events, recent_snapshots
from nvdash.history.writer import AccountingSource, HistoryWriter
from nvdash.sampling.daemon_pool import DaemonPool
from nvdash.sampling.records import Inventory
from nvdash.settings import Settings
from nvdash.store import DEFAULT_EVENT_CAPACITY, Store
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)

QUERY_WORKERS = 2
"""Threads that answer history queries, each through its own read-only connection."""
QUERY_THREAD = "history-query"
QUERY_EXPECT_EVERY_S = 20.0
"""An idle query thread beats this often; one busy with one call for three times as long is overdue."""


@dataclass
class HistoryRuntime:
    """The server's history: where queries go, who writes, and one line saying which."""

    backend: HistoryBackend | None = None
    writer: HistoryWriter | None = None
    status: str = "off (--no-history)"
    path: Path | None = None
    executor: DaemonPool = field(default_factory=lambda: DaemonPool(QUERY_WORKERS, QUERY_THREAD, start=False))
    clock: Callable[[], float] = time.time
    replay: bool = False

    @property
    def connect(self) -> Callable[[], sqlite3.Connection] | None:
        """The calling thread's read connection to the history file; ``None`` where no file is read."""
        return self.backend.connection if isinstance(self.backend, SqliteHistory) else None

    def start_query_workers(self, supervisor: Supervisor | None = None) -> None:
        """Start every query thread now (under ``supervisor`` when given), each opening its read connection, so
        that the server holds the same threads and descriptors from its first second instead of growing on the
        first pages that ask."""
        connect = self.connect

        def warm_up() -> None:
            if connect is None:
                return
            try:
                connect()
            except Exception as error:  # a damaged file says so on its first query; this is only a warm-up
                log.debug("history query thread could not open %s: %s", self.path, error)

        self.executor.start(supervisor, expect_every_s=QUERY_EXPECT_EVERY_S, on_start=warm_up)

    def health(self) -> dict[str, Any]:
        """The writer's clock and failure state for ``/health``'s history part (empty when nothing is written):
        readings stamped ahead of the server's own clock, how far the wall clock moved since start, and since
        when writes fail (their readings wait in the queue)."""
        writer = self.writer
        if writer is None:
            return {}
        clock = writer.retention_clock
        stats = writer.stats
        return {"ahead_readings": clock.ahead_readings, "wall_clock_offset_s": round(clock.wall_offset_s, 3),
                "retention_clock_at": round(clock.retention_now_s(), 3), "prunes": stats.prunes,
                "queued": stats.queued, "failing_since": stats.failing_since, "failed_writes": stats.failed_writes}

    def close(self) -> None:
        """Stop the writer (writing what is queued) and the query threads."""
        if self.writer is not None:
            self.writer.stop()
        self.executor.shutdown()


def history_path(settings: Settings) -> Path:
    """The file the settings name, else the per-user default."""
    return Path(settings.history_path).expanduser() if settings.history_path else default_path()


def source_name(inventory: Inventory) -> str:
    """How a session's readings were made: ``nvml`` or ``simulated:<profile>``."""
    return f"simulated:{inventory.simulated}" if inventory.simulated else "nvml"


def open_history(settings: Settings, store: Store, accounting: AccountingSource | None = None,
                 supervisor: Supervisor | None = None) -> HistoryRuntime:
    """Start recording into the history file (raises ``HistoryError`` for an unusable file), with the
    ``accounting``'s tallies; the writer and query threads run under ``supervisor``.

    When another nvdash already writes the file, this server reads it without writing, and says so.
    """
    if not settings.history:
        runtime = HistoryRuntime()
        runtime.start_query_workers(supervisor)
        return runtime
    path = history_path(settings)
    writer = HistoryWriter(path, store.inventory, source_name(store.inventory), settings.interval_s,
                           retention_s=settings.retention_s, accounting=accounting, supervisor=supervisor,
                           prune_every_s=settings.prune_every_s)
    try:
        writer.open()
    except HistoryLocked as error:
        log.warning("%s; this server reads it without writing", error)
        runtime = HistoryRuntime(backend=SqliteHistory(path), status=f"read-only: {error}", path=path)
        runtime.start_query_workers(supervisor)
        return runtime
    store.add_listener(writer)
    writer.start()
    runtime = HistoryRuntime(backend=SqliteHistory(path), writer=writer, status=f"recording to {path}", path=path)
    runtime.start_query_workers(supervisor)
    return runtime


def open_replay(path_text: str, live_samples: int,
                supervisor: Supervisor | None = None) -> tuple[Store, HistoryRuntime]:
    """A store holding the end of the recording, and the recording as the history; raises ``HistoryError``."""
    path = Path(path_text).expanduser()
    history = SqliteHistory(path)
    inventory = history.inventory()
    extent = history.extent()
    if inventory is None or extent is None:
        raise HistoryError(f"{path} holds no readings to replay")
    store = Store(inventory, capacity=live_samples, event_capacity=DEFAULT_EVENT_CAPACITY)
    connection = history.connection()
    for snapshot in recent_snapshots(connection, live_samples):
        store.append(snapshot)
    store.add_events(recent_events(connection, DEFAULT_EVENT_CAPACITY))
    end = extent[1]
    runtime = HistoryRuntime(backend=history, status=f"replaying {path}", path=path, clock=lambda: end, replay=True)
    runtime.start_query_workers(supervisor)
    return store, runtime
