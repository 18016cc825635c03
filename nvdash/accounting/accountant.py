"""Following the sampler's snapshots into the ledger: who owns each GPU at each reading, and what they used.

The job-mapping directory is read again whenever a new usage reading arrives (the processes' cadence), not at
every GPU reading: a prolog's file appears seconds before the job's processes do.

With a history writer, the writer drains the tallies into the history's accounting table about once a second;
without one they stay in memory, each hour kept for ``retention_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from nvdash.accounting.attribution import Names, Owner, Share, attribute
from nvdash.accounting.idle import DEFAULT_IDLE_AFTER_S, IdleAllocation, IdleTracker
from nvdash.accounting.ledger import DEFAULT_MAX_GAP_S, Key, Ledger, Tally, hour_of
from nvdash.sampling.job_mapping import JobMapping, read_job_mapping
from nvdash.sampling.records import GpuEvent, Snapshot
from nvdash.sampling.usage_records import Usage
from nvdash.sampling.user_names import NameResolver
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)
DEFAULT_ACCOUNTING_RETENTION_S = 365 * 86_400.0
"""How long the accounting's hourly tallies are kept (``--accounting-retention``)."""


class Accountant:
    """Feeds each snapshot's shares into a :class:`Ledger`; safe to read from other threads."""

    def __init__(self, uuids: dict[int, str], *, job_mapping_dir: Path | None = None,
                 names: Names | None = None, max_gap_s: float = DEFAULT_MAX_GAP_S,
                 idle_after_s: float = DEFAULT_IDLE_AFTER_S, retention_s: float = DEFAULT_ACCOUNTING_RETENTION_S,
                 read_mapping: Callable[[Path], JobMapping] = read_job_mapping,
                 supervisor: Supervisor | None = None) -> None:
        """``names`` (default: a :class:`NameResolver` under ``supervisor``) must answer without blocking: the
        accountant runs on the sampler's thread."""
        self._uuids = dict(uuids)
        self._mapping_dir = job_mapping_dir
        self._read_mapping = read_mapping
        self._names: Names = names if names is not None else NameResolver(supervisor=supervisor)
        self._ledger = Ledger(max_gap_s=max_gap_s)
        self._idle = IdleTracker(idle_after_s)
        self.retention_s = retention_s
        self._hour = 0.0
        self._failures = 0
        self._lock = threading.Lock()
        self._usage: Usage | None = None
        self._mapping: JobMapping | None = None
        self._logged_refusals: set[tuple[str, str]] = set()
        self.shares: list[Share] = []
        """The owners of the latest reading."""

    def _refresh_mapping(self, usage: Usage | None) -> None:
        if self._mapping_dir is None or (usage is self._usage and self._mapping is not None):
            return
        self._mapping = self._read_mapping(self._mapping_dir)
        for name, reason in self._mapping.refused.items():
            if (name, reason) not in self._logged_refusals:
                self._logged_refusals.add((name, reason))
                log.warning("job-mapping directory %s: not reading %s: %s", self._mapping_dir, name, reason)

    def step(self, snapshot: Snapshot) -> list[Share]:
        """Count the interval ``snapshot`` closes; returns its shares."""
        self._refresh_mapping(snapshot.usage)
        self._usage = snapshot.usage
        shares = attribute(snapshot.gpus, self._uuids, snapshot.usage, self._mapping, self._names,
                           unit_shares=snapshot.shares)
        with self._lock:
            self._ledger.step(snapshot.time_s, snapshot.gpus, shares)
            self._idle.step(snapshot.time_s, shares)
            self.shares = shares
            hour = hour_of(snapshot.time_s)
            if hour != self._hour:
                self._hour = hour
                self._ledger.forget_before(hour_of(snapshot.time_s - self.retention_s))
        return shares

    def submit(self, snapshot: Snapshot) -> None:
        """A store listener's entry: count the snapshot (on the sampler's thread; never raises)."""
        try:
            self.step(snapshot)
        except Exception:
            self._failures += 1
            if self._failures == 1 or self._failures % 1000 == 0:
                log.exception("accounting a reading failed (%d so far)", self._failures)

    def submit_events(self, events: Iterable[GpuEvent]) -> None:
        """Events are not accounted."""

    def idle(self) -> tuple[float, list[IdleAllocation]]:
        """The latest reading's time and the allocations idle for long enough at it."""
        with self._lock:
            return self._idle.now_s, self._idle.flagged()

    @property
    def idle_after_s(self) -> float:
        """How long a share must be idle to be flagged."""
        return self._idle.after_s

    def drain(self) -> dict[Key, Tally]:
        """Hand the hourly tallies counted so far to the history writer (see :meth:`Ledger.drain`)."""
        with self._lock:
            return self._ledger.drain()

    def restore(self, tallies: dict[Key, Tally]) -> None:
        """Take back tallies the writer could not store."""
        with self._lock:
            self._ledger.restore(tallies)

    def status(self) -> dict[str, object]:
        """What ``/health`` reports: the job-mapping directory and whether it could be read, the jobs it names,
        the files in it that were refused (name -> why), readings that could not be accounted, and the idle
        threshold."""
        mapping = self._mapping
        jobs = sorted({job.job_id for jobs in (*mapping.by_index.values(), *mapping.by_uuid.values())
                       for job in jobs}) if mapping is not None else []
        return {
            "job_mapping_dir": None if self._mapping_dir is None else str(self._mapping_dir),
            "job_mapping_readable": None if mapping is None else mapping.available,
            "mapped_jobs": jobs,
            "job_mapping_refused": dict(mapping.refused) if mapping is not None else {},
            "failed_readings": self._failures,
            "idle_after_s": self._idle.after_s,
        }

    @property
    def mapping(self) -> JobMapping | None:
        """The job mapping last read; ``None`` without a directory."""
        return self._mapping

    def running_totals(self) -> dict[Owner, Tally]:
        """Per owner, a copy of everything counted since the accountant started (all GPUs, all hours)."""
        with self._lock:
            return {owner: Tally(**vars(tally)) for owner, tally in self._ledger.running.items()}

    def tallies(self, start_s: float | None = None, end_s: float | None = None) -> list[tuple[Owner, int, Tally]]:
        """Per (owner, GPU), the tallies in memory of the hours overlapping ``[start_s, end_s)``, added up."""
        low = -float("inf") if start_s is None else hour_of(start_s)
        high = float("inf") if end_s is None else end_s
        merged: dict[tuple[Owner, int], Tally] = {}
        with self._lock:
            for (owner, index, hour), tally in self._ledger.tallies.items():
                if not low <= hour < high:
                    continue
                total = merged.get((owner, index))
                if total is None:
                    merged[(owner, index)] = Tally(**vars(tally))
                else:
                    total.merge(tally)
        return [(owner, index, tally) for (owner, index), tally in merged.items()]
