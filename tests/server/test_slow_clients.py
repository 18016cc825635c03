"""Viewers that stop reading their websocket cost a bounded amount, delay nobody, and are closed after a while.

Each stuck viewer completes the websocket handshake with a small receive buffer and then never reads. A normal
bokeh.client viewer on the same server keeps counting the updates it applies.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from bokeh.client import ClientSession
from bokeh.document.events import ColumnsPatchedEvent, ColumnsStreamedEvent, DocumentChangedEvent

from tests.conftest import NvdashServer, http_get, nvdash_server, wait_for
from tests.server.bokeh_viewer import open_session
from tests.server.proc_stats import proc_stats
from tests.server.raw_client import TOKEN, drain_until_closed, unread_websocket

STALL_TIMEOUT_S = 30
STUCK_ROUTES = ["/Machine-Resources", "/GPU-Processes", "/NVLink-Timeline", "/GPU-Utilization", "/GPU-Details"]
VIEWER_ROUTE = "/Machine-Resources"
ROWS_PER_PHASE = 100
"""Store rows (sampler sweeps) each phase lasts: 25 s at the interval below."""


class CountingViewer(threading.Thread):
    """A bokeh.client session that applies the server's updates in a thread and counts them."""

    def __init__(self, url: str, route: str) -> None:
        super().__init__(daemon=True, name=f"counting{route}")
        self.session: ClientSession = open_session(url, route)
        self.updates = 0
        self._stop_requested = threading.Event()
        self.session.document.on_change(self._count)

    def _count(self, event: DocumentChangedEvent) -> None:
        if isinstance(event, (ColumnsStreamedEvent, ColumnsPatchedEvent)):
            self.updates += 1

    def run(self) -> None:
        # bokeh.client applies messages only while its loop runs, each one nesting a call deeper: run it in slices.
        connection = self.session._connection
        while not self._stop_requested.is_set():
            end = time.monotonic() + 5.0
            connection._loop_until(lambda end=end: self._stop_requested.is_set() or time.monotonic() >= end)

    def stop(self) -> None:
        self._stop_requested.set()
        loop = self.session._connection._loop
        loop.add_callback(loop.stop)
        self.join(30)
        self.session.close()


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    args = ["--simulate", "dgx-h100", "--no-history", "--interval", "0.25", "--live-samples", "40",
            "--viewer-stall-timeout", str(STALL_TIMEOUT_S)]
    with nvdash_server(args) as running:
        yield running


def _updates_over(server: NvdashServer, viewer: CountingViewer, rows: int) -> tuple[int, int, list[int]]:
    """Updates the viewer applied while the store took ``rows`` more rows; the rows; RSS samples meanwhile."""
    first_seq, first_updates = server.health()["store"]["last_seq"], viewer.updates
    samples: list[int] = []

    def read() -> int:
        samples.append(proc_stats(server.process.pid).rss_bytes)
        return int(server.health()["store"]["last_seq"])

    last_seq = wait_for(read, lambda seq: seq >= first_seq + rows, timeout_s=rows * 2.0)
    return viewer.updates - first_updates, last_seq - first_seq, samples


def test_stuck_viewers_cost_bounded_memory_delay_nobody_and_are_closed(server: NvdashServer) -> None:
    viewer = CountingViewer(server.url, VIEWER_ROUTE)
    viewer.start()
    stuck: list[socket.socket] = []
    try:
        wait_for(lambda: viewer.updates, lambda n: n > 0)
        base_updates, base_rows, _ = _updates_over(server, viewer, ROWS_PER_PHASE // 2)
        base_rate = base_updates / base_rows

        for route in STUCK_ROUTES:
            _, page, _ = http_get(server.url + route)
            match = TOKEN.search(page)
            assert match is not None, f"no session token in {route}"
            stuck.append(unread_websocket("127.0.0.1", server.port, route, match.group(1)))
        # Every stuck viewer has bytes waiting that it does not take.
        wait_for(server.health, lambda h: h["websockets"]["stalled"] == len(STUCK_ROUTES), timeout_s=60)
        rss_start = proc_stats(server.process.pid).rss_bytes

        updates, rows, rss = _updates_over(server, viewer, ROWS_PER_PHASE)
        # The normal viewer kept taking updates (one per sweep or so) as it did with nobody stuck.
        assert updates / rows >= 0.5 * base_rate, (updates, rows, base_updates, base_rows)
        # The stuck viewers' documents stopped growing the server: no unsent backlog piles up.
        assert max(rss) <= rss_start * 1.10, (rss_start, max(rss))

        # Closed once stuck for the timeout; then Bokeh discards their sessions, and only the viewer's is left.
        health = wait_for(server.health, lambda h: h["websockets"]["closed_stalled"] == len(STUCK_ROUTES),
                          timeout_s=STALL_TIMEOUT_S + 30)
        assert health["websockets"]["open"] <= 1 + len(STUCK_ROUTES)
        wait_for(server.health, lambda h: h["sessions"] == 1 and h["websockets"]["open"] == 1, timeout_s=40)
        for sock in stuck:
            # What the server had sent before it stopped is bounded by the socket buffers, then the end comes.
            assert drain_until_closed(sock, timeout_s=30) < 16 * 2**20

        # The normal viewer was never closed and still follows the store.
        before = viewer.updates
        wait_for(lambda: viewer.updates, lambda n: n > before + 5)
    finally:
        for sock in stuck:
            sock.close()
        viewer.stop()
