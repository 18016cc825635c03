"""Opening the history for a server: the writer (or read-only when another nvdash writes the file), or a replay."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from nvdash.history.database import HistoryError, HistoryLocked, default_path
from nvdash.history.query import HistoryBackend, SqliteHistory
from nvdash.history.replay import recent_events, recent_snapshots
from nvdash.history.writer import AccountingSource, HistoryWriter
from nvdash.sampling.records import Inventory
from nvdash.settings import Settings
from nvdash.store import DEFAULT_EVENT_CAPACITY, Store

log = logging.getLogger(__name__)

QUERY_WORKERS = 2
"""Threads that answer history queries, each through its own read-only connection."""
WORKER_START_TIMEOUT_S = 10.0


@dataclass
class HistoryRuntime:
    """The server's history: where queries go, who writes, and one line saying which."""

    backend: HistoryBackend | None = None
    writer: HistoryWriter | None = None
    status: str = "off (--no-history)"
    path: Path | None = None
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(QUERY_WORKERS, thread_name_prefix="nvdash-history-query"))
    clock: Callable[[], float] = time.time
    replay: bool = False

    @property
    def connect(self) -> Callable[[], sqlite3.Connection] | None:
        """The calling thread's read connection to the history file; ``None`` where no file is read."""
        return self.backend.connection if isinstance(self.backend, SqliteHistory) else None

    def start_query_workers(self) -> None:
        """Start every query thread now, each opening its read connection, so that the server holds the same
        threads and descriptors from its first second instead of growing on the first pages that ask.

        Each start waits at a barrier for the others: a pool hands a task to an idle thread before it starts a
        new one, and no thread is idle until all have started.
        """
        connect = self.connect
        if connect is None:
            return
        barrier = threading.Barrier(QUERY_WORKERS)

        def start() -> None:
            try:
                connect()
            except Exception as error:  # a damaged file says so on its first query; this is only a warm-up
                log.debug("history query thread could not open %s: %s", self.path, error)
            finally:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(WORKER_START_TIMEOUT_S)

        for _ in range(QUERY_WORKERS):
            self.executor.submit(start)

    def close(self) -> None:
        """Stop the writer (writing what is queued) and the query threads."""
        if self.writer is not None:
            self.writer.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)


def history_path(settings: Settings) -> Path:
    """The file the settings name, else the per-user default."""
    return Path(settings.history_path).expanduser() if settings.history_path else default_path()


def source_name(inventory: Inventory) -> str:
    """How a session's readings were made: ``nvml`` or ``simulated:<profile>``."""
    return f"simulated:{inventory.simulated}" if inventory.simulated else "nvml"


def open_history(settings: Settings, store: Store, accounting: AccountingSource | None = None) -> HistoryRuntime:
    """Start recording into the history file (raises ``HistoryError`` for an unusable file), with the
    ``accounting``'s tallies.

    When another nvdash already writes the file, this server reads it without writing, and says so.
    """
    if not settings.history:
        return HistoryRuntime()
    path = history_path(settings)
    writer = HistoryWriter(path, store.inventory, source_name(store.inventory), settings.interval_s,
                           retention_s=settings.retention_s, accounting=accounting)
    try:
        writer.open()
    except HistoryLocked as error:
        log.warning("%s; this server reads it without writing", error)
        runtime = HistoryRuntime(backend=SqliteHistory(path), status=f"read-only: {error}", path=path)
        runtime.start_query_workers()
        return runtime
    store.add_listener(writer)
    writer.start()
    runtime = HistoryRuntime(backend=SqliteHistory(path), writer=writer, status=f"recording to {path}", path=path)
    runtime.start_query_workers()
    return runtime


def open_replay(path_text: str, live_samples: int) -> tuple[Store, HistoryRuntime]:
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
    runtime.start_query_workers()
    return store, runtime
