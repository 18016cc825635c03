"""Viewers on every dashboard, then gone: Bokeh lets go of every session and websocket, and the server's threads
and open file descriptors go back to where they were.

The long version, with the counts printed over minutes of viewers (a leak is a count that climbs), is
``benchmarks/viewers.py --soak``. The history's query threads and their read connections start with the server,
so the count taken before the first viewer already holds them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import NvdashServer, get_json, nvdash_server, wait_for
from tests.server.bokeh_viewer import Viewer, stop_all
from tests.server.proc_stats import ProcStats, proc_stats

VIEWERS = 2
"""Viewers, each with a session on every dashboard."""
WARM_UP_ROWS = 10
"""Sweeps with every viewer connected before the counts are taken: 5 s at the interval of 0.5 s."""
TRANSIENT_FDS = 2
"""Descriptors that come and go with a request being served (the test's own ``/health``)."""


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.5"]) as running:
        yield running


def _after_rows(server: NvdashServer, rows: int) -> ProcStats:
    """The server's counts once the store has taken ``rows`` more rows."""
    target = server.health()["store"]["last_seq"] + rows
    wait_for(lambda: server.health()["store"]["last_seq"], lambda seq: seq >= target, timeout_s=rows * 2.0)
    return proc_stats(server.process.pid)


def test_viewers_that_leave_leave_no_threads_or_descriptors(server: NvdashServer) -> None:
    routes = list(get_json(server.url + "/index.json"))
    idle = proc_stats(server.process.pid)
    viewers = [Viewer(server.url, route) for _ in range(VIEWERS) for route in routes]
    try:
        for viewer in viewers:
            viewer.start()
            assert viewer.ready.wait(120), f"{viewer.name} did not connect"
            assert viewer.error is None, viewer.error
        wait_for(server.health, lambda health: health["sessions"] == len(viewers), timeout_s=60)

        warm = _after_rows(server, WARM_UP_ROWS)
        assert server.health()["sessions"] == len(viewers)
    finally:
        stop_all(viewers)

    health = wait_for(server.health, lambda h: h["sessions"] == 0 and h["websockets"]["open"] == 0, timeout_s=60)
    assert health["websockets"]["closed_stalled"] == 0
    after = proc_stats(server.process.pid)
    assert after.fds <= idle.fds + TRANSIENT_FDS, (idle, after)
    assert after.threads <= warm.threads, (warm, after)
