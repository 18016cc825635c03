"""The history writer: one thread that takes snapshots and events off a queue and writes them in batches.

The sampler (and the XID thread) only append to an in-memory queue, so a slow or full disk delays history
writes and never a sweep or a dashboard. Each batch is one transaction; after it, the tiers' buckets it touched
are recomputed; once a minute, rows older than the retention are deleted and their pages returned for reuse.

What is old is decided by :class:`~nvdash.history.retention_clock.RetentionClock`, never by the wall clock alone:
a jump of the wall clock deletes nothing early, readings stamped in the future are kept and counted. A batch that
cannot be written (a full disk, an I/O error) goes back to the front of the queue with its accounting tallies and
is tried again on the next round; the failure shows on ``/health`` until a write succeeds. The thread runs under a
:class:`~nvdash.supervision.Supervisor` and beats once a round.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nvdash.history import accounting_table, inventory_json, notebook_table, share_table
from nvdash.history.accounting_table import StoredTally
from nvdash.history.catalog import gpu_raw_columns, gpu_row, host_raw_columns, host_row
from nvdash.history.database import WriteLock, lock_for_writing, open_database, transaction
from nvdash.history.retention_clock import Observation, RetentionClock
from nvdash.history.tiers import DEFAULT_RETENTION_S, prune, register_functions, rollup
from nvdash.sampling.records import GpuEvent, GpuSample, Inventory, Snapshot
from nvdash.sampling.usage_records import Usage
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)

FLUSH_S = 1.0
"""The longest a reading waits in memory before it is written (what a ``kill -9`` can lose, plus one batch)."""
PRUNE_EVERY_S = 60.0
LINK_COUNTERS_EVERY_S = 60.0
"""NVLink error counters are logged at most this often per GPU; link state changes at once."""
QUEUE_LIMIT = 20_000
"""Snapshots held while the disk lags (about 3 h at 0.5 s); beyond it the oldest are dropped and counted."""
THREAD_NAME = "history-writer"
EXPECT_ROUND_S = 5.0
"""A round (wait ``FLUSH_S``, write, maybe prune) is expected at least this often; three missed: overdue."""
TRUSTED_UNTIL_KEY = "trusted_until_s"
"""``meta`` key: the newest stamp known to have been in the past of its writer's clock (see the retention clock)."""


def gpu_insert_sql() -> str:
    """The ``gpu_raw`` insert; a reading already stored (same time and GPU) is kept, not duplicated."""
    columns = ("t", "gpu", *gpu_raw_columns(), "error")
    return f"INSERT OR IGNORE INTO gpu_raw ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _host_insert() -> str:
    columns = ("t", *host_raw_columns())
    return f"INSERT OR IGNORE INTO host_raw ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


PROCESS_INSERT = (
    "INSERT OR IGNORE INTO processes (t, gpu, pid, started_s, mig_uuid, kinds, gpu_memory_bytes, sm_pct,"
    " memory_pct, user, command, container_id, pod_namespace, pod_name, container_name, slurm_job)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
EVENT_INSERT = "INSERT INTO events (t, gpu, kind, severity, code, counter, message) VALUES (?, ?, ?, ?, ?, ?, ?)"


def gpu_rows(snapshot: Snapshot) -> list[tuple[Any, ...]]:
    """The ``gpu_raw`` rows of one snapshot."""
    return [(snapshot.time_s, sample.index, *gpu_row(sample), sample.error) for sample in snapshot.gpus]


def process_rows(usage: Usage) -> list[tuple[Any, ...]]:
    """The ``processes`` rows of one usage reading."""
    rows = []
    for process in usage.processes:
        host = process.host
        cgroup = host.cgroup if host is not None else None
        rows.append((
            usage.time_s, process.gpu_index, process.pid, host.started_s if host else None, process.mig_uuid,
            ",".join(process.kinds), process.gpu_memory_bytes, process.sm_pct, process.memory_pct,
            host.user if host else None, host.command if host else None,
            cgroup.container_id if cgroup else None, process.pod_namespace, process.pod_name,
            process.container_name, cgroup.slurm_job if cgroup else None,
        ))
    return rows


def _links_json(sample: GpuSample) -> str:
    return json.dumps([[link.link, link.active, link.crc_flit_errors, link.crc_data_errors, link.replay_errors,
                        link.recovery_errors] for link in sample.nvlinks], separators=(",", ":"))


class AccountingSource(Protocol):
    """Where the accounting's hourly tallies come from (the accountant). The writer knows them by shape only: it
    stores what :meth:`drain` hands it, keyed by ``(owner, GPU index, hour)``, in the accounting table (see
    :func:`~nvdash.history.accounting_table.store`), and hands exactly that back to :meth:`restore` when the write
    failed."""

    retention_s: float
    """How long the table keeps an hour."""

    def drain(self) -> Mapping[Any, StoredTally]: ...

    def restore(self, tallies: Any) -> None: ...


@dataclass
class WriterStats:
    """What the writer did so far (reported by ``/health``)."""

    snapshots: int = 0
    events: int = 0
    batches: int = 0
    dropped: int = 0
    errors: int = 0
    last_error: str | None = None
    last_batch_ms: float = 0.0
    max_batch_ms: float = 0.0
    pruned_rows: int = 0
    queued: int = 0
    prunes: int = 0
    failing_since: float | None = None
    """Wall-clock time of the first failed write of the current run of failures; ``None`` once one succeeds."""
    failed_writes: int = 0
    """Writes failed in a row (their readings wait in the queue)."""


class HistoryWriter:
    """Owns the history file for writing: its lock, its one connection and its thread."""

    def __init__(self, path: Path, inventory: Inventory, source: str, interval_s: float, *,
                 retention_s: float = DEFAULT_RETENTION_S, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, accounting: AccountingSource | None = None,
                 supervisor: Supervisor | None = None, prune_every_s: float = PRUNE_EVERY_S) -> None:
        self.path = path
        self._prune_every_s = prune_every_s
        self.retention_s = retention_s
        self.accounting = accounting
        """The accountant whose tallies each batch stores (set before :meth:`start`)."""
        self._inventory = inventory
        self._source = source
        self._interval_s = interval_s
        self._clock = clock
        self._monotonic = monotonic
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self.retention_clock = RetentionClock(clock, monotonic)
        self._snapshots: deque[Snapshot] = deque()
        self._events: deque[GpuEvent] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_lock: WriteLock | None = None
        self._connection: sqlite3.Connection | None = None
        self._links: dict[int, tuple[float, tuple[Any, ...], tuple[Any, ...]]] = {}
        self._usage_time: float | None = None
        self._notebook_time: float | None = None
        self._next_prune = 0.0
        self.stats = WriterStats()

    def open(self) -> None:
        """Lock and open the file and record this session; raises ``HistoryError`` with a one-line message."""
        self._write_lock = lock_for_writing(self.path)
        try:
            self._connection = open_database(self.path)
            register_functions(self._connection)
            self.retention_clock.start(_stored_trusted_until(self._connection))
            with transaction(self._connection) as connection:
                connection.execute(
                    "INSERT INTO sessions (started_s, source, interval_s, inventory) VALUES (?, ?, ?, ?)",
                    (self._clock(), self._source, self._interval_s, inventory_json.dumps(self._inventory)))
        except BaseException:
            self._write_lock.release()
            raise

    def start(self) -> None:
        """Open (when not yet) and start the writer thread."""
        if self._connection is None:
            self.open()
        self._thread = self._supervisor.spawn(THREAD_NAME, self._run, self._stop, expect_every_s=EXPECT_ROUND_S)

    def submit(self, snapshot: Snapshot) -> None:
        """Queue a snapshot (any thread; never blocks on the disk)."""
        with self._lock:
            if len(self._snapshots) >= QUEUE_LIMIT:
                self._snapshots.popleft()
                self.stats.dropped += 1
            self._snapshots.append(snapshot)
            self.stats.queued = len(self._snapshots)

    def submit_events(self, events: Iterable[GpuEvent]) -> None:
        """Queue events (any thread)."""
        with self._lock:
            self._events.extend(events)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, stop the thread, close the file and release the lock."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return  # still writing (a stalled disk): keep the file and its lock until the process ends
        if self._connection is not None:
            self.flush()  # what a never-started thread, or one that died, left queued
            self._connection.close()
            self._connection = None
        if self._write_lock is not None:
            self._write_lock.release()

    def flush(self) -> None:
        """Write everything queued now, on the calling thread (tests, import, and the thread's own loop)."""
        with self._lock:
            snapshots = list(self._snapshots)
            events = list(self._events)
            self._snapshots.clear()
            self._events.clear()
        self.stats.queued = 0
        tallies = self.accounting.drain() if self.accounting is not None else {}
        if snapshots or events or tallies:
            try:
                written = self._write(snapshots, events, tallies)
            except Exception:  # not the disk: a bug, for the supervisor to log; retrying the batch would repeat it
                self.stats.dropped += len(snapshots)
                if tallies and self.accounting is not None:
                    self.accounting.restore(tallies)
                raise
            if not written:
                self._requeue(snapshots, events)
                return
        now = self._monotonic()
        if now >= self._next_prune and snapshots:
            self._next_prune = now + self._prune_every_s
            self._prune()

    def _requeue(self, snapshots: Sequence[Snapshot], events: Sequence[GpuEvent]) -> None:
        """Put a batch that could not be written back in front of what came since (the oldest beyond the queue
        limit dropped and counted, as when the queue overflows)."""
        with self._lock:
            self._snapshots.extendleft(reversed(snapshots))
            self._events.extendleft(reversed(events))
            while len(self._snapshots) > QUEUE_LIMIT:
                self._snapshots.popleft()
                self.stats.dropped += 1
            self.stats.queued = len(self._snapshots)

    def _links_changed(self, time_s: float, sample: GpuSample) -> bool:
        """Whether to log the GPU's links now: at once when a link goes up or down, and at most once a
        ``LINK_COUNTERS_EVERY_S`` when only error counters rose (a flaky link raises them every read)."""
        states = tuple((link.link, link.active) for link in sample.nvlinks)
        counters = tuple((link.crc_flit_errors, link.crc_data_errors, link.replay_errors, link.recovery_errors)
                         for link in sample.nvlinks)
        last = self._links.get(sample.index)
        if last is not None:
            last_time, last_states, last_counters = last
            if states == last_states and (counters == last_counters or time_s - last_time < LINK_COUNTERS_EVERY_S):
                return False
        self._links[sample.index] = (time_s, states, counters)
        return True

    def _write(self, snapshots: Sequence[Snapshot], events: Sequence[GpuEvent],
               tallies: Mapping[Any, StoredTally] | None = None) -> bool:
        """Write one batch in one transaction; False (the tallies handed back) when it failed."""
        assert self._connection is not None
        started = time.perf_counter()
        links_before, usage_before, notebooks_before = dict(self._links), self._usage_time, self._notebook_time
        gpu: list[tuple[Any, ...]] = []
        host: list[tuple[Any, ...]] = []
        links: list[tuple[Any, ...]] = []
        processes: list[tuple[Any, ...]] = []
        shares: list[tuple[Any, ...]] = []
        notebooks: list[tuple[Any, ...]] = []
        for snapshot in snapshots:
            shares += share_table.share_rows(snapshot.time_s, snapshot.shares)
            view = snapshot.notebooks
            if view is not None and view.time_s != self._notebook_time:
                self._notebook_time = view.time_s
                notebooks += notebook_table.notebook_rows(view)
            gpu += gpu_rows(snapshot)
            host.append((snapshot.time_s, *host_row(snapshot.host)))
            for sample in snapshot.gpus:
                if sample.nvlinks and self._links_changed(snapshot.time_s, sample):
                    links.append((snapshot.time_s, sample.index, _links_json(sample)))
            usage = snapshot.usage
            if usage is not None and usage.time_s != self._usage_time:
                self._usage_time = usage.time_s
                processes += process_rows(usage)
        observation = self.retention_clock.observe([snapshot.time_s for snapshot in snapshots])
        try:
            with transaction(self._connection) as connection:
                self._store_trusted_until(connection, observation)
                connection.executemany(gpu_insert_sql(), gpu)
                connection.executemany(_host_insert(), host)
                connection.executemany("INSERT OR IGNORE INTO nvlink_state (t, gpu, links) VALUES (?, ?, ?)", links)
                connection.executemany(PROCESS_INSERT, processes)
                connection.executemany(share_table.UPSERT, shares)
                connection.executemany(notebook_table.UPSERT, notebooks)
                connection.executemany(EVENT_INSERT, [
                    (e.time_s, e.gpu_index, e.kind, e.severity, e.code, e.counter, e.message) for e in events])
                if tallies:
                    accounting_table.store(connection, tallies)
                if snapshots:
                    rollup(connection, min(s.time_s for s in snapshots), max(s.time_s for s in snapshots))
        except sqlite3.Error as error:
            if tallies and self.accounting is not None:
                self.accounting.restore(tallies)
            self._links, self._usage_time, self._notebook_time = links_before, usage_before, notebooks_before
            self._failed(error)
            if self.stats.failing_since is None:
                self.stats.failing_since = self._clock()
            self.stats.failed_writes += 1
            return False
        self.retention_clock.record(observation)
        self.stats.failing_since = None
        self.stats.failed_writes = 0
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.stats.snapshots += len(snapshots)
        self.stats.events += len(events)
        self.stats.batches += 1
        self.stats.last_batch_ms = elapsed_ms
        self.stats.max_batch_ms = max(self.stats.max_batch_ms, elapsed_ms)
        return True

    def _store_trusted_until(self, connection: sqlite3.Connection, observation: Observation) -> None:
        newest = observation.newest_trusted_s
        if newest is not None and newest != self.retention_clock.trusted_until_s:
            connection.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                               (TRUSTED_UNTIL_KEY, repr(newest)))

    def _prune(self) -> None:
        """Delete what is older than the retention before the retention clock's horizon (never before one
        reading of this process was written)."""
        assert self._connection is not None
        horizon = self.retention_clock.horizon_s()
        if horizon is None:
            return
        try:
            with transaction(self._connection) as connection:
                self.stats.pruned_rows += prune(connection, horizon, self.retention_s)
                self.stats.pruned_rows += share_table.prune(connection, horizon - self.retention_s)
                self.stats.pruned_rows += notebook_table.prune(connection, horizon - self.retention_s)
                if self.accounting is not None:
                    self.stats.pruned_rows += accounting_table.prune(
                        connection, horizon - self.accounting.retention_s)
            # executescript runs the pragma to completion (execute() would free one page per step).
            self._connection.executescript("PRAGMA incremental_vacuum(256);")
        except sqlite3.Error as error:
            self._failed(error)
            return
        self.stats.prunes += 1

    def _failed(self, error: sqlite3.Error) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{self.path}: {error}"
        if self.stats.errors == 1 or self.stats.errors % 100 == 0:
            log.warning("writing history failed (%d so far): %s", self.stats.errors, self.stats.last_error)

    def _run(self) -> None:
        """The thread's loop (restarted by the supervisor if it raises): a write each ``FLUSH_S``, then a beat."""
        while not self._stop.is_set():
            self._stop.wait(FLUSH_S)
            self.flush()
            self._supervisor.beat(THREAD_NAME)
        self.flush()


def _stored_trusted_until(connection: sqlite3.Connection) -> float | None:
    """The file's newest trusted stamp; for a file written before it was kept, its newest host reading."""
    row = connection.execute("SELECT value FROM meta WHERE key = ?", (TRUSTED_UNTIL_KEY,)).fetchone()
    if row is not None:
        return float(row[0])
    newest = [connection.execute(f"SELECT max(t) FROM {table}").fetchone()[0]
              for table in ("host_raw", "host_10m", "processes")]
    known = [float(value) for value in newest if value is not None]
    return max(known) if known else None
