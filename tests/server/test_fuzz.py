"""Bad input never gets a 500, a traceback or a stuck session from a real server.

Seeded cases (``tests/server/fuzz_cases.py``): requests with odd methods, paths, percent-encodings, query strings
and headers to every route of ``/index.json`` and every page of the server; on each dashboard's websocket,
Bokeh messages with garbage content, wrong message types, broken framing and oversized messages. A request is
answered with a status below 500 (or the connection is closed); a websocket message is answered, ignored or
refused by closing the connection, and the server goes on serving. A failing case is printed as it was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import struct
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import nvdash
from tests.conftest import NvdashServer, get_json, nvdash_server, wait_for
from tests.server.bokeh_viewer import open_session, receive_for
from tests.server.fuzz_cases import HttpCase, Outcomes, WsCase, document_models, http_cases, ws_cases
from tests.server.raw_client import OP_CLOSE, OP_TEXT, WebSocket, exchange, request_bytes, session_token

SEED = 1234
HTTP_CASES = 2000
WS_CASES_PER_ROUTE = 60
CONCURRENCY = 8
HOST = "127.0.0.1"
ANSWER_TIMEOUT_S = 30.0
T = TypeVar("T")
TRACEBACK = re.compile(rb"Traceback \(most recent call last\)|Uncaught exception")


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    # History on (in a temporary XDG_DATA_HOME), so that /api/history.json and /export.csv query a real one.
    with nvdash_server(["--simulate", "dgx-h100"]) as running:
        yield running


ENTRY_FILES = ("__main__.py", "cli.py", "commands/serve.py", "server/run.py")
"""nvdash's outermost frames, under every callback (a logging error prints that whole call stack)."""


def _nvdash_tracebacks(server: NvdashServer) -> list[str]:
    """Logged tracebacks through nvdash's own code (Bokeh's and tornado's are theirs), entry frames aside."""
    package = re.escape(str(Path(nvdash.__file__).parent))
    entry = "|".join(re.escape(name) for name in ENTRY_FILES)
    frame = re.compile(rf'File "{package}/(?!(?:{entry})")')
    blocks = server.output().split("Traceback (most recent call last):")
    return [block[-2500:] for block in blocks[1:] if frame.search(block)]


async def _send_all(port: int, cases: list[HttpCase]) -> list[str]:
    gate = asyncio.Semaphore(CONCURRENCY)
    failures: list[str] = []

    async def send(case: HttpCase) -> None:
        async with gate:
            try:
                response = await exchange(HOST, port, case.request(f"{HOST}:{port}"), timeout_s=ANSWER_TIMEOUT_S)
            except (ConnectionError, asyncio.IncompleteReadError):
                return  # refused by hanging up
            except TimeoutError:
                failures.append(f"{case.describe()}: no answer within {ANSWER_TIMEOUT_S} s")
                return
            if response.status >= 500 or TRACEBACK.search(response.body):
                failures.append(f"{case.describe()}: {response.status} {response.body[:300]!r}")

    await asyncio.gather(*(send(case) for case in cases))
    return failures


def test_fuzzed_requests_get_no_server_error(server: NvdashServer) -> None:
    routes = list(get_json(server.url + "/index.json"))
    cases = http_cases(SEED, HTTP_CASES, routes, server.port)
    assert {route for route in routes if any(case.target.startswith(route) for case in cases)} == set(routes)
    failures = asyncio.run(_send_all(server.port, cases))
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures[:20])
    assert server.health()["status"] == "ok"
    assert not _nvdash_tracebacks(server)


ONCE_FAILED = ("/GPU-Details?gpu=%C2%B2", "/GPU-Details?from=0&to=1e18", "/Machine-Resources?from=-99999999999&to=0",
               "/GPU-Resources?from=0001-01-01", "/api/history.json?metric=power_w&from=0001-01-01",
               "/export.csv?from=1e15", "/api/accounting.json?range=1%0Bh", "/api/accounting.csv?range=1%0Bh",
               "/api/accounting.csv?range=1h%0A", "/GPU-Utilization?bokeh-session-id=",
               "/GPU-Utilization/autoload.js?bokeh-autoload-element=x&bokeh-session-id=",
               "/GPU-Utilization/autoload.js?bokeh-autoload-element=x", "/GPU-Accounting?theme&gpus=0,1&range=1%0Bh",
               "/GPU-Resources?bokeh-token=%5C", "/GPU-Memory/autoload.js?bokeh-autoload-element=x&bokeh-token=last",
               "/GPU-Topology?bokeh-token=%CA%8D%0B", "/static/%00", "/static/js/%00bokeh.min.js")
"""Requests that once got a 500: a digit ``int`` cannot read, times no date can be written for, a duration with a
control character (also in a download's file name), an empty Bokeh session id, a Bokeh session token that is not
one, the autoload script without an Origin, a NUL in a static file's path."""
ONCE_FAILED_HEADERS = ((("Bokeh-Session-Id", ""),), (("Bokeh-Session-Id", ""), ("Cookie", "bokeh-session-id=")),
                       (("Cookie", "bokeh-session-id="),))
"""Headers that once got a 500 on a dashboard's page and autoload script: an empty session id."""


def test_requests_that_once_failed_are_answered(server: NvdashServer) -> None:
    for target in ONCE_FAILED:
        response = asyncio.run(exchange(HOST, server.port, request_bytes("GET", target, f"{HOST}:{server.port}")))
        assert 200 <= response.status < 500, (target, response.status, response.body[:300])
    for headers in ONCE_FAILED_HEADERS:
        for target in ("/GPU-Utilization", "/GPU-Utilization/autoload.js?bokeh-autoload-element=x"):
            request = request_bytes("GET", target, f"{HOST}:{server.port}", headers)
            response = asyncio.run(exchange(HOST, server.port, request))
            assert 200 <= response.status < 500, (target, headers, response.status, response.body[:300])
    assert not _nvdash_tracebacks(server)


def test_a_duration_with_a_control_character_is_a_bad_request(server: NvdashServer) -> None:
    for path in ("/api/accounting.json", "/api/accounting.csv"):
        response = asyncio.run(exchange(HOST, server.port, request_bytes("GET", path + "?range=1%0Bh",
                                                                         f"{HOST}:{server.port}")))
        assert response.status == 400, (path, response.status)
        assert "is not a duration" in response.text
    download = asyncio.run(exchange(HOST, server.port, request_bytes("GET", "/api/accounting.csv?range=7d",
                                                                     f"{HOST}:{server.port}")))
    assert download.status == 200
    assert download.headers["content-disposition"] == 'attachment; filename="nvdash-accounting-job-7d.csv"'


def test_a_preflight_without_origin_is_refused(server: NvdashServer) -> None:
    """Bokeh's autoload script echoes the Origin of a CORS preflight; without one it failed with a 500."""
    route = next(iter(get_json(server.url + "/index.json")))
    request = request_bytes("OPTIONS", route + "/autoload.js", f"{HOST}:{server.port}")
    assert asyncio.run(exchange(HOST, server.port, request)).status == 400
    with_origin = request_bytes("OPTIONS", route + "/autoload.js", f"{HOST}:{server.port}",
                                [("Origin", f"http://{HOST}:{server.port}")])
    assert asyncio.run(exchange(HOST, server.port, with_origin)).status == 200


async def _probe(ws: WebSocket) -> bool | int | None:
    """After a case: ``True`` when a request sent now is answered, else the close code (``None``: no code).

    A case may leave a message half sent; of three requests, the last ones complete it or are answered.
    """

    async def answer() -> bool | int | None:
        for _ in range(3):
            await ws.send_message("SERVER-INFO-REQ", {})
        while True:
            opcode, payload = await ws.receive_frame(ANSWER_TIMEOUT_S)
            if opcode == OP_CLOSE:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
            if opcode == OP_TEXT and b'"SERVER-INFO-REPLY"' in payload:
                return True

    try:
        return await answer()
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def _send_case(ws: WebSocket, case: WsCase) -> None:
    for frame in case.frames:
        await ws.send(frame.opcode, frame.payload, fin=frame.fin, masked=frame.masked)
    if case.raw:
        await ws.send_raw(case.raw)


async def _within(step: Awaitable[T], what: str) -> T:
    """``step``, or an ``AssertionError`` naming ``what`` when it takes longer than :data:`ANSWER_TIMEOUT_S`."""
    try:
        return await asyncio.wait_for(step, ANSWER_TIMEOUT_S)
    except TimeoutError:
        raise AssertionError(f"{what}: nothing within {ANSWER_TIMEOUT_S} s") from None


async def _open(port: int, route: str, token: str, what: str) -> WebSocket:
    ws = await _within(WebSocket.open(HOST, port, route + "/ws", token), f"{what}: opening a websocket")
    await _within(ws.receive_until("ACK"), f"{what}: the ACK")
    return ws


async def _fuzz_route(port: int, route: str, index: int, outcomes: Outcomes) -> None:
    """The cases against one session of ``route``, each on a websocket of its own."""
    token = await session_token(HOST, port, route)
    ws = await _open(port, route, token, route)
    await ws.send_message("PULL-DOC-REQ", {})
    await _within(ws.receive_until("PULL-DOC-REPLY"), f"{route}: the document")
    models = document_models(json.loads(ws.last_content))
    assert models, f"no models in the document of {route}"
    for case in ws_cases(SEED + index, WS_CASES_PER_ROUTE, models, start=index * WS_CASES_PER_ROUTE):
        what = f"{route} {case.describe()}"
        with contextlib.suppress(ConnectionError):  # the server may hang up before an oversized case is sent
            await _within(_send_case(ws, case), f"{what}: sending")
        outcome = await _within(_probe(ws), f"{what}: neither answered nor closed") if case.probe else False
        if outcome is False:
            outcomes.abandoned += 1
        elif outcome is True:
            outcomes.answered += 1
        else:
            outcomes.close(outcome)
        ws.abort()
        ws = await _open(port, route, token, f"after {what}")
    await _within(ws.close(wait=True), f"{route}: closing")


def test_fuzzed_websocket_messages_are_answered_or_refused(server: NvdashServer) -> None:
    routes = list(get_json(server.url + "/index.json"))
    outcomes = Outcomes()

    async def run() -> None:
        await asyncio.gather(*(_fuzz_route(server.port, route, i, outcomes) for i, route in enumerate(routes)))

    asyncio.run(run())
    cases = len(routes) * WS_CASES_PER_ROUTE
    assert outcomes.answered + sum(outcomes.closed.values()) + outcomes.abandoned == cases
    # Most garbage is refused by closing; some must have been answered (valid requests, ignored events).
    assert outcomes.answered > 0, outcomes
    tracebacks = _nvdash_tracebacks(server)
    assert not tracebacks, "\n\n".join(tracebacks[:3])

    # The server still serves a normal session, and lets go of every fuzzed one.
    session = open_session(server.url, routes[0])
    try:
        receive_for(session, 2.0)
        assert session.document.roots
    finally:
        session.close()
    wait_for(server.health, lambda health: health["sessions"] == 0 and health["websockets"]["open"] == 0,
             timeout_s=90)
