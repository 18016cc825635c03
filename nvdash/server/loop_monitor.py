"""Measures how late the event loop runs a callback: the longest stall a viewer could have felt."""

from __future__ import annotations

import time

from tornado.ioloop import IOLoop


class LoopMonitor:
    """Schedules a no-op every ``period_s`` and records how late it ran."""

    def __init__(self, period_s: float = 0.05) -> None:
        self._period_s = period_s
        self._max_lag_s = 0.0
        self._window_max_lag_s = 0.0
        self._ticks = 0
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
        due = time.monotonic() + self._period_s
        self._loop.call_later(self._period_s, self._tick, due)

    def _tick(self, due: float) -> None:
        lag = max(0.0, time.monotonic() - due)
        self._ticks += 1
        self._max_lag_s = max(self._max_lag_s, lag)
        self._window_max_lag_s = max(self._window_max_lag_s, lag)
        self._schedule()

    def report(self, reset_window: bool = False) -> dict[str, float | int]:
        """Longest lag since start and since the last reset, in milliseconds."""
        result: dict[str, float | int] = {
            "ticks": self._ticks,
            "max_lag_ms": round(self._max_lag_s * 1000, 3),
            "window_max_lag_ms": round(self._window_max_lag_s * 1000, 3),
        }
        if reset_window:
            self._window_max_lag_s = 0.0
        return result
