"""Closes the websockets of viewers that stopped reading.

A viewer that stops reading (a frozen tab, a suspended laptop behind a NAT that still holds the connection)
costs the server little: its document skips ticks (``nvdash.live.backpressure``) or waits on one unfinished
write. But Bokeh keeps its session, and the connection, for as long as the socket stays open, which can be
forever. Every few seconds this looks at each websocket; one that has had bytes waiting and taken none of them
for ``timeout_s`` is closed, and Bokeh then discards its session as it does any other.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from bokeh.server.server import Server
from tornado.ioloop import PeriodicCallback
from tornado.websocket import WebSocketHandler

from nvdash.live.backpressure import outgoing
from nvdash.live.internals import connection_websocket, server_connections

DEFAULT_TIMEOUT_S = 60.0
CHECK_PERIOD_S = 5.0
CLOSE_CODE = 1008
"""Policy violation: the viewer did not read what it was sent."""
CLOSE_REASON = "not reading updates"


def server_websockets(server: Server) -> list[WebSocketHandler]:
    """The websocket handlers of every connection the Bokeh server holds now."""
    handlers = (connection_websocket(connection) for connection in server_connections(server))
    return [handler for handler in handlers if handler is not None]


@dataclass
class _Watched:
    taken_bytes: int
    since: float


class StalledViewers:
    """Every ``period_s``, closes the websockets that took nothing of what waited for them for ``timeout_s``
    (``timeout_s`` 0: never); counts what it saw for ``/health``."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, period_s: float = CHECK_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._period_s = period_s
        self._clock = clock
        self._watched: dict[WebSocketHandler, _Watched] = {}
        self._handlers: Callable[[], list[WebSocketHandler]] = list
        self._job: PeriodicCallback | None = None
        self._closing: weakref.WeakSet[WebSocketHandler] = weakref.WeakSet()
        self.closed = 0
        """Websockets closed for not reading, since start."""

    def start(self, server: Server, timeout_s: float | None = None) -> None:
        """Check ``server``'s websockets every period, on the current event loop (``timeout_s``: a new timeout)."""
        if timeout_s is not None:
            self.timeout_s = timeout_s
        self._handlers = lambda: server_websockets(server)
        self._job = PeriodicCallback(self.check, self._period_s * 1000)
        self._job.start()

    def stop(self) -> None:
        if self._job is not None:
            self._job.stop()

    def check(self) -> None:
        """Look at each websocket once; close those stalled for ``timeout_s``."""
        now = self._clock()
        watched: dict[WebSocketHandler, _Watched] = {}
        for handler in self._handlers():
            if handler in self._closing:
                continue
            counts = outgoing(handler)
            if counts is None or counts.pending_bytes == 0:
                continue
            seen = self._watched.get(handler)
            if seen is None or seen.taken_bytes != counts.taken_bytes:
                seen = _Watched(counts.taken_bytes, now)
            if self.timeout_s > 0 and now - seen.since >= self.timeout_s:
                # Tornado sends a close frame and drops the connection 5 s later if the viewer does not answer.
                handler.close(CLOSE_CODE, CLOSE_REASON)
                self._closing.add(handler)
                self.closed += 1
                continue
            watched[handler] = seen
        self._watched = watched

    def report(self) -> dict[str, float | int]:
        """Open websockets, those waiting on their viewer (as of the last check), and those closed so far."""
        now = self._clock()
        return {
            "open": len(self._handlers()),
            "waiting": len(self._watched),
            "stalled": sum(1 for seen in self._watched.values() if now - seen.since >= self._period_s),
            "closed_stalled": self.closed,
            "stall_timeout_s": self.timeout_s,
        }
