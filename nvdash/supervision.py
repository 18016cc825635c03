"""Supervised background threads: a death is logged, counted, shown on ``/health``, and the thread restarted.

Every long-running thread of a server (sampler, XID waiter, history writer, process collection, kubelet watcher,
cluster poller, history query workers) runs its loop under :meth:`Supervisor.spawn`. When the loop raises, the
traceback is logged the first time that error is seen (later ones of the same kind as one line with the count),
the death is counted, and the loop is started again after a backoff that doubles from ``first_backoff_s`` up to
``max_backoff_s`` (and starts over once a run lasted ``healthy_after_s``). A loop that returns ends its thread.

A thread that is alive but makes no progress is just as silent as a dead one: a loop that calls :meth:`beat`
each time it completes a round, and was spawned with ``expect_every_s``, is *overdue* when no beat came for
``OVERDUE_ROUNDS`` times that; :meth:`overdue` names such threads and since when.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

OVERDUE_ROUNDS = 3
"""A thread is overdue after this many of its expected rounds without a beat."""


@dataclass
class _Watched:
    name: str
    expect_every_s: float | None
    started_mono: float
    last_beat_mono: float | None = None
    last_beat_wall: float | None = None
    deaths: int = 0
    last_error: str | None = None
    last_error_wall: float | None = None
    alive: bool = False
    thread: threading.Thread | None = None


@dataclass(frozen=True, slots=True)
class Overdue:
    """A thread that has not completed a round for too long."""

    name: str
    since_wall: float
    """Wall-clock time of its last beat (or of its start, when it never beat)."""
    age_s: float
    """Seconds (monotonic) since then."""


class Supervisor:
    """Starts, restarts and watches a server's background threads; safe to call from any thread."""

    def __init__(
        self,
        *,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        healthy_after_s: float = 60.0,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max_backoff_s
        self._healthy_after_s = healthy_after_s
        self._wall = wall_clock
        self._mono = monotonic
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._logged: set[tuple[str, str]] = set()

    def spawn(
        self,
        name: str,
        run: Callable[[], None],
        stop: threading.Event,
        *,
        expect_every_s: float | None = None,
    ) -> threading.Thread:
        """Start a daemon thread named ``name`` running ``run`` until it returns or ``stop`` is set.

        ``expect_every_s``: how often ``run`` calls :meth:`beat` while healthy (``None``: it is not watched for
        progress, only for deaths).
        """
        with self._lock:
            watched = _Watched(name, expect_every_s, self._mono())
            self._watched[name] = watched
        thread = threading.Thread(target=self._supervise, args=(watched, run, stop), name=name, daemon=True)
        watched.thread = thread
        watched.alive = True
        thread.start()
        return thread

    def beat(self, name: str) -> None:
        """The thread ``name`` completed a round."""
        watched = self._watched.get(name)
        if watched is not None:
            watched.last_beat_mono = self._mono()
            watched.last_beat_wall = self._wall()

    def overdue(self) -> list[Overdue]:
        """The running threads watched for progress that have not beaten for ``OVERDUE_ROUNDS`` rounds."""
        now = self._mono()
        found: list[Overdue] = []
        with self._lock:
            watched = list(self._watched.values())
        for item in watched:
            if item.expect_every_s is None or not item.alive:
                continue
            last = item.last_beat_mono if item.last_beat_mono is not None else item.started_mono
            age = now - last
            if age > OVERDUE_ROUNDS * item.expect_every_s:
                since = item.last_beat_wall if item.last_beat_wall is not None else self._wall() - age
                found.append(Overdue(item.name, since, age))
        return found

    def deaths(self) -> int:
        """Deaths of all threads so far."""
        with self._lock:
            return sum(item.deaths for item in self._watched.values())

    def report(self) -> dict[str, dict[str, object]]:
        """Per thread: whether it runs, its deaths, the last error and when, and its last beat (for ``/health``)."""
        now = self._mono()
        with self._lock:
            watched = list(self._watched.values())
        result: dict[str, dict[str, object]] = {}
        for item in watched:
            result[item.name] = {
                "running": item.alive,
                "deaths": item.deaths,
                "last_error": item.last_error,
                "last_error_at": item.last_error_wall,
                "last_beat_at": item.last_beat_wall,
                "last_beat_age_s": None if item.last_beat_mono is None else round(now - item.last_beat_mono, 3),
            }
        return result

    def _supervise(self, watched: _Watched, run: Callable[[], None], stop: threading.Event) -> None:
        backoff = self._first_backoff_s
        try:
            while not stop.is_set():
                began = self._mono()
                try:
                    run()
                except Exception as error:
                    self._died(watched, error)
                else:
                    return
                if self._mono() - began >= self._healthy_after_s:
                    backoff = self._first_backoff_s
                if stop.wait(backoff):
                    return
                backoff = min(self._max_backoff_s, backoff * 2)
        finally:
            watched.alive = False

    def _died(self, watched: _Watched, error: Exception) -> None:
        text = f"{type(error).__name__}: {error}"
        with self._lock:
            watched.deaths += 1
            watched.last_error = text
            watched.last_error_wall = self._wall()
            key = (watched.name, type(error).__name__)
            first = key not in self._logged
            self._logged.add(key)
        if first:
            log.error("thread %s died (restarting it): %s", watched.name, text, exc_info=error)
        else:
            log.error("thread %s died again (%d deaths, restarting it): %s", watched.name, watched.deaths, text)
