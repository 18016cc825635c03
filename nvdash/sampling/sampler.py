"""The one sampler thread per server: reads every source once per interval into the store.

The store is whatever takes snapshots and events (:class:`SnapshotSink`; the server hands in
:class:`nvdash.store.Store`), so the hardware layer imports nothing above it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nvdash.freshness import Stale, is_stale
from nvdash.sampling.notebook_records import NotebookView
from nvdash.sampling.notebooks import NotebookTracker
from nvdash.sampling.nvml_modes import Reprobe
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, Snapshot
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.shares import ShareTracker
from nvdash.sampling.usage_records import Usage
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.1
SAMPLER_PART = "sampler"
"""The sampler's thread, and its part in staleness reports: the sweeps."""
PROCESSES_PART = "processes"
"""The part of the sweeps that reads the GPU processes (at the usage interval)."""


class GpuReader(Protocol):
    """Anything that yields one sample per GPU within a time budget (the NVML source)."""

    def read(self, timeout_s: float) -> tuple[GpuSample, ...]: ...


EventDeriver = Callable[[Snapshot | None, Snapshot], list[GpuEvent]]
"""Turns the previous and the new snapshot into events (ECC increments, throttling episodes...)."""


class UsageReader(Protocol):
    """Anything that says who uses the GPUs (the usage collector)."""

    def collect(self, time_s: float, timeout_s: float) -> Usage: ...


class SnapshotSink(Protocol):
    """Where the sweeps go (the store): one snapshot per sweep, and the events derived from them."""

    def append(self, snapshot: Snapshot) -> int: ...

    def add_events(self, events: list[GpuEvent]) -> int: ...


class HostReader(Protocol):
    """Anything that yields one host sample (the host source)."""

    def read(self) -> HostSample: ...


@dataclass(frozen=True, slots=True)
class SamplerStats:
    """How the sampler is keeping up."""

    sweeps: int
    errors: int
    last_sweep_s: float
    max_sweep_s: float
    skipped_device_reads: int = 0
    """GPU reads left out of a sweep because the GPU's read of an earlier sweep had not returned (a slow call)."""
    last_sweep_at: float | None = None
    """Unix time of the newest completed sweep (its snapshot's time); ``None`` before the first."""
    last_usage_at: float | None = None
    """Unix time of the newest successful process reading; ``None`` before the first or when it is off."""
    relearned: int = 0
    """GPUs probed again because their mode changed (MIG mode, a driver reload); see :mod:`nvml_modes`."""
    last_relearn: Reprobe | None = None
    """The newest of those re-probes."""


class Sampler:
    """Appends one :class:`Snapshot` per interval to the store from a single background thread.

    The GPU read gets at most 80 % of the interval, so a slow NVML call cannot push a sweep past it. The thread runs
    under ``supervisor`` (an escaping error is logged, counted and the loop restarted) and beats after each sweep;
    :meth:`stale` says when sweeps or process readings have stopped completing. With process collection on, each
    snapshot carries the GPUs' shares (:class:`~nvdash.sampling.shares.ShareTracker`: SM shares from the latest
    process reading, energy counted at every sweep) and, given a ``notebooks`` tracker, the Jupyter kernels joined to
    each new process reading (:class:`~nvdash.sampling.notebooks.NotebookTracker`; its latest view in every snapshot).
    """

    def __init__(
        self,
        store: SnapshotSink,
        host: HostReader,
        gpus: GpuReader | None = None,
        interval_s: float = 0.5,
        *,
        wall_clock: Callable[[], float] = time.time,
        derive_events: EventDeriver | None = None,
        usage: UsageReader | None = None,
        usage_interval_s: float = 2.0,
        supervisor: Supervisor | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        notebooks: NotebookTracker | None = None,
    ) -> None:
        if interval_s < MIN_INTERVAL_S:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_S} s")
        self._store = store
        self._host = host
        self._gpus = gpus
        self._interval_s = interval_s
        self._wall_clock = wall_clock
        self._derive_events = derive_events
        self._usage = usage
        self._usage_interval_s = usage_interval_s
        self._usage_due_s = 0.0
        self._latest_usage: Usage | None = None
        self._usage_errors = 0
        self._shares = ShareTracker() if usage is not None else None
        self._share_errors = 0
        self._notebooks = notebooks
        self._notebook_view: NotebookView | None = None if notebooks is None else notebooks.view
        self._notebook_errors = 0
        self._usage_fresh = False
        self._previous: Snapshot | None = None
        self._derive_errors = 0
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_mono: float | None = None
        self._started_wall = 0.0
        self._last_sweep_mono: float | None = None
        self._last_sweep_wall: float | None = None
        self._last_usage_mono: float | None = None
        self._last_usage_wall: float | None = None
        self._sweeps = 0
        self._errors = 0
        self._last_sweep_s = 0.0
        self._max_sweep_s = 0.0

    @property
    def interval_s(self) -> float:
        """Seconds between sweeps."""
        return self._interval_s

    def stats(self) -> SamplerStats:
        """Counts and durations of the sweeps so far."""
        skipped = getattr(self._gpus, "skipped_reads", 0)
        relearned = getattr(self._gpus, "relearned", 0)
        last_relearn = getattr(self._gpus, "last_relearn", None)
        return SamplerStats(self._sweeps, self._errors, self._last_sweep_s, self._max_sweep_s,
                            skipped if isinstance(skipped, int) else 0, self._last_sweep_wall, self._last_usage_wall,
                            relearned if isinstance(relearned, int) else 0,
                            last_relearn if isinstance(last_relearn, Reprobe) else None)

    def stale(self) -> list[Stale]:
        """The parts that stopped completing: the sweeps after ``STALE_ROUNDS`` intervals without one, the process
        readings after as many usage intervals (counted from the start when none completed yet; nothing before
        :meth:`start`)."""
        started = self._started_mono
        if started is None:
            return []
        now = self._monotonic()
        found: list[Stale] = []
        parts = [(SAMPLER_PART, self._last_sweep_mono, self._last_sweep_wall, self._interval_s)]
        if self._usage is not None:
            every = max(self._usage_interval_s, self._interval_s)
            parts.append((PROCESSES_PART, self._last_usage_mono, self._last_usage_wall, every))
        for part, last_mono, last_wall, every in parts:
            age = now - (last_mono if last_mono is not None else started)
            if is_stale(age, every):
                found.append(Stale(part, last_wall if last_wall is not None else self._started_wall))
        return found

    def sample_once(self) -> Snapshot:
        """Read every source once and append the snapshot to the store."""
        started = time.monotonic()
        time_s = self._wall_clock()
        gpus = self._gpus.read(self._interval_s * 0.8) if self._gpus is not None else ()
        host = self._host.read()
        usage = self._read_usage(time_s)
        snapshot = Snapshot(time_s=time_s, gpus=gpus, host=host, usage=usage, shares=self._share(time_s, gpus, usage),
                            notebooks=self._join_notebooks(gpus, usage))
        self._store.append(snapshot)
        self._record_events(snapshot)
        elapsed = time.monotonic() - started
        self._sweeps += 1
        self._last_sweep_mono = self._monotonic()
        self._last_sweep_wall = time_s
        self._last_sweep_s = elapsed
        self._max_sweep_s = max(self._max_sweep_s, elapsed)
        return snapshot

    def _read_usage(self, time_s: float) -> Usage | None:
        """The latest usage, read anew when its interval has passed; a failing read keeps the previous one."""
        if self._usage is None:
            return None
        now = time.monotonic()
        if now < self._usage_due_s:
            return self._latest_usage
        self._usage_due_s = now + self._usage_interval_s
        try:
            self._latest_usage = self._usage.collect(time_s, self._interval_s * 0.5)
            self._usage_fresh = True
            self._last_usage_mono = self._monotonic()
            self._last_usage_wall = time_s
        except Exception:
            self._usage_errors += 1
            if self._usage_errors == 1:
                log.exception("reading the GPU processes failed")
        return self._latest_usage

    def _share(self, time_s: float, gpus: tuple[GpuSample, ...], usage: Usage | None) -> tuple[UnitShares, ...]:
        """How the GPUs divide among their owners; a failing computation costs the shares, never the sweep."""
        if self._shares is None:
            return ()
        try:
            return self._shares.update(time_s, gpus, usage)
        except Exception:
            self._share_errors += 1
            if self._share_errors == 1:
                log.exception("computing the GPU shares failed")
            return ()

    def _join_notebooks(self, gpus: tuple[GpuSample, ...], usage: Usage | None) -> NotebookView | None:
        """The kernels joined to the process reading when it is new, else the latest join; a failing join costs the
        view (``None`` until the next reading joins), never the sweep."""
        if self._notebooks is None or not self._usage_fresh or usage is None:
            return self._notebook_view
        self._usage_fresh = False
        try:
            self._notebook_view = self._notebooks.update(usage.time_s, usage, gpus)
        except Exception:
            self._notebook_view = None
            self._notebook_errors += 1
            if self._notebook_errors == 1:
                log.exception("joining the Jupyter kernels to the GPU processes failed")
        return self._notebook_view

    def _record_events(self, snapshot: Snapshot) -> None:
        """Derive this sweep's events; a failing rule costs the events, never the sweep."""
        if self._derive_events is None:
            return
        previous, self._previous = self._previous, snapshot
        try:
            events = self._derive_events(previous, snapshot)
        except Exception:
            self._derive_errors += 1
            if self._derive_errors == 1:
                log.exception("deriving health events failed")
            return
        if events:
            self._store.add_events(events)

    def start(self) -> None:
        """Start the supervised thread (once); the first snapshot is taken at once."""
        if self._thread is not None:
            raise RuntimeError("the sampler is already started")
        self._started_mono = self._monotonic()
        self._started_wall = self._wall_clock()
        self._thread = self._supervisor.spawn(SAMPLER_PART, self._run, self._stop, expect_every_s=self._interval_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to stop and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        """The loop: a sweep per interval; a failing sweep is counted and logged, and the next one tried."""
        next_due = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:
                self._errors += 1
                if self._errors == 1 or self._errors % 100 == 0:
                    log.exception("nvdash sampler sweep failed (%d so far)", self._errors)
            else:
                self._supervisor.beat(SAMPLER_PART)
            next_due += self._interval_s
            now = time.monotonic()
            if next_due < now:
                next_due = now + self._interval_s
            self._stop.wait(next_due - now)
