"""Opening and closing 1,000 websockets leaves nothing behind: no sessions, connections, timers or memory.

One asyncio client opens them, many at once, over raw sockets. Each Bokeh session (a page fetched, on every
route of ``/index.json`` in turn) takes several websockets in its life, as a tab that reconnects does, each one
ending another way: read and closed cleanly, handshake completed and never read, reset after the first message,
cut in the middle of the upgrade request, or gone before the upgrade answer.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import nvdash
from tests.conftest import NvdashServer, nvdash_server, wait_for
from tests.server.proc_stats import proc_stats
from tests.server.raw_client import WebSocket, get, session_token, upgrade_request

HOST = "127.0.0.1"
ENDINGS = (("clean",) + ("unread", "reset", "cut_request", "no_answer") * 2 + ("reset",)) * 2
"""The websockets of each Bokeh session, in order: 20."""
SESSIONS = 50
"""Bokeh sessions: 1,000 websockets."""
ALIVE = 17
"""Sessions the server holds at once at most: a page is fetched only when Bokeh will have discarded an earlier
session (:data:`DISCARDED_AFTER_S` after its last websocket closed), so that every round peaks alike."""
DISCARDED_AFTER_S = 15.0
"""Bokeh discards a session unused for 10 s, checking every 5 s."""
WARM_UP = 33
"""Sessions of the warm-up (two rounds): the process's memory reaches its working size in them."""


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    # A store of 20 samples is full within the warm-up: what it holds does not grow the memory measured after.
    with nvdash_server(["--simulate", "dgx-h100", "--no-history", "--live-samples", "20"]) as running:
        yield running


async def _connect(port: int, route: str, token: str, ending: str) -> None:
    path = route + "/ws"
    if ending in ("cut_request", "no_answer"):
        _, writer = await asyncio.open_connection(HOST, port)
        request = upgrade_request(path, f"{HOST}:{port}", token)
        writer.write(request[: len(request) // 2] if ending == "cut_request" else request)
        await writer.drain()
        writer.close()
        return
    ws = await WebSocket.open(HOST, port, path, token)
    if ending == "unread":
        ws.abort()
        return
    header = await ws.receive_message()
    assert header["msgtype"] == "ACK", header
    if ending == "reset":
        ws.abort()
        return
    await ws.send_message("PULL-DOC-REQ", {})
    await ws.receive_until("PULL-DOC-REPLY")
    await ws.close(wait=True)


async def _churn(port: int, routes: list[str], sessions: range, endings: Counter[str]) -> None:
    """The websockets of the Bokeh sessions numbered ``sessions``, :data:`ALIVE` sessions at a time, each on the
    route its number picks."""
    alive = asyncio.Semaphore(ALIVE)

    async def session(index: int) -> None:
        await alive.acquire()
        try:
            route = routes[index % len(routes)]
            token = await session_token(HOST, port, route)
            for ending in ENDINGS:
                await _connect(port, route, token, ending)
                endings[ending] += 1
        finally:
            asyncio.get_running_loop().call_later(DISCARDED_AFTER_S, alive.release)

    await asyncio.gather(*(session(index) for index in sessions))


def _quiet(server: NvdashServer, timers: int | None = None) -> dict[str, object]:
    """Wait until Bokeh discarded every session (10 s unused, checked every 5 s) and every websocket is gone."""

    def settled(health: dict[str, object]) -> bool:
        sockets = health["websockets"]
        assert isinstance(sockets, dict)
        return (health["sessions"] == 0 and sockets["open"] == 0
                and (timers is None or int(str(health["timers"])) <= timers))

    return dict(wait_for(server.health, settled, timeout_s=60))


def test_a_thousand_websockets_leave_nothing_behind(server: NvdashServer) -> None:
    routes = list(json.loads(asyncio.run(get(HOST, server.port, "/index.json")).body))
    assert len(routes) == 12
    timers_idle = int(server.health()["timers"])
    endings: Counter[str] = Counter()

    asyncio.run(_churn(server.port, routes, range(WARM_UP), endings))
    _quiet(server, timers_idle)
    warm = proc_stats(server.process.pid)

    asyncio.run(_churn(server.port, routes, range(WARM_UP, SESSIONS), endings))
    health = _quiet(server, timers_idle)
    # A socket the server has finished with may take a moment to be closed (a close handshake, the last /health
    # request's connection): a leaked descriptor or thread never goes back, so wait for the warm-up's counts.
    after = wait_for(lambda: proc_stats(server.process.pid),
                     lambda stats: stats.fds <= warm.fds and stats.threads == warm.threads, timeout_s=30)

    assert sum(endings.values()) == 1_000
    assert endings == Counter({ending: SESSIONS * ENDINGS.count(ending) for ending in ENDINGS})
    assert int(str(health["timers"])) <= timers_idle
    assert after.rss_bytes <= warm.rss_bytes * 1.10, (warm, after)
    assert after.threads == warm.threads, (warm, after)
    assert after.fds <= warm.fds, (warm, after)
    # Bokeh logs tracebacks of its own for some websockets cut short; none may pass through nvdash's code.
    assert str(Path(nvdash.__file__).parent) not in server.output()

    # And the server still serves a session as usual.
    async def one_more() -> None:
        await _connect(server.port, routes[0], await session_token(HOST, server.port, routes[0]), "clean")

    asyncio.run(one_more())
