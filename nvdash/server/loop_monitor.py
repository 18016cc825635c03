"""Measures how late the event loop runs a callback: the longest stall a viewer could have felt.

Read-only for its clients: a report says the monitor's clock (``at``), and a later ``report(since=at)`` gives
the longest stall after that moment, so a benchmark measures a window without resetting anything.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from tornado.ioloop import IOLoop

MAX_KEPT = 4096
"""Bound on the stalls kept. Only stalls no later stall matches are kept (their lags fall with time), so the list
stays short; past the bound the oldest go, and ``kept_since`` says from when on answers are exact."""


class LoopMonitor:
    """Schedules a no-op every ``period_s`` and records how late it ran."""

    def __init__(self, period_s: float = 0.05, clock: Callable[[], float] = time.monotonic,
                 max_kept: int = MAX_KEPT) -> None:
        self._period_s = period_s
        self._clock = clock
        self._max_lag_s = 0.0
        self._ticks = 0
        self._started_at = clock()
        self._dropped_before = self._started_at
        self._stalls: deque[tuple[float, float]] = deque()
        """``(ran_at, lag_s)`` of each tick that no later tick matched: lags strictly fall from old to new."""
        self._max_kept = max_kept
        self._loop: IOLoop | None = None
        self._stopped = False

    def start(self, loop: IOLoop) -> None:
        """Begin measuring on ``loop``."""
        self._loop = loop
        self._schedule()

    def stop(self) -> None:
        """Stop scheduling."""
        self._stopped = True

    def _schedule(self) -> None:
        if self._loop is None or self._stopped:
            return
        due = self._clock() + self._period_s
        self._loop.call_later(self._period_s, self._tick, due)

    def _tick(self, due: float) -> None:
        now = self._clock()
        self.record(now, max(0.0, now - due))
        self._schedule()

    def record(self, ran_at: float, lag_s: float) -> None:
        """Note one tick that ran at ``ran_at`` (the monitor's clock) ``lag_s`` late."""
        self._ticks += 1
        self._max_lag_s = max(self._max_lag_s, lag_s)
        stalls = self._stalls
        while stalls and stalls[-1][1] <= lag_s:
            stalls.pop()
        stalls.append((ran_at, lag_s))
        if len(stalls) > self._max_kept:
            self._dropped_before = stalls.popleft()[0]

    def longest_since(self, since: float) -> float:
        """The longest lag, in seconds, of the ticks that ran after ``since`` (0 when none did)."""
        for ran_at, lag_s in self._stalls:
            if ran_at > since:
                return lag_s
        return 0.0

    def report(self, since: float | None = None) -> dict[str, float | int]:
        """Ticks, the longest lag since start, and the monitor's clock now (``at``), in milliseconds and seconds.

        With ``since`` (an ``at`` from an earlier report): ``max_lag_since_ms``, the longest lag after it.
        """
        result: dict[str, float | int] = {
            "ticks": self._ticks,
            "max_lag_ms": round(self._max_lag_s * 1000, 3),
            "at": self._clock(),
            "kept_since": self._dropped_before,
        }
        if since is not None:
            result["since"] = since
            result["max_lag_since_ms"] = round(self.longest_since(since) * 1000, 3)
        return result


def scheduled_timers(loop: IOLoop) -> int:
    """Timers (timeouts, periodic callbacks' next runs) waiting on the event loop: after every session is gone
    the count is back to what the server itself keeps, unless a session's callbacks were left behind."""
    handles = getattr(getattr(loop, "asyncio_loop", None), "_scheduled", ())
    return sum(1 for handle in handles if not handle.cancelled())
