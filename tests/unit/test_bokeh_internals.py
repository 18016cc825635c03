"""Every Bokeh and Tornado internal nvdash relies on (``nvdash.live.internals``) still exists and behaves as relied
upon, on the installed releases; a failure names the internal and the nvdash feature that breaks.

Each check runs against the real thing: a Bokeh server on a free port on this test's event loop, a real
websocket client speaking Bokeh's protocol, real HTTP requests, real sockets.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import bokeh.document.document as bokeh_document
import numpy as np
import pytest
from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.core.property.wrappers import PropertyValueContainer
from bokeh.document import Document
from bokeh.models import Column, ColumnDataSource, Select
from bokeh.models.widgets import Div
from bokeh.protocol import Protocol
from bokeh.protocol.message import Message
from bokeh.server.connection import ServerConnection
from bokeh.server.server import Server
from bokeh.server.session import ServerSession
from bokeh.server.tornado import BokehTornado
from bokeh.server.views.autoload_js_handler import AutoloadJsHandler
from bokeh.server.views.doc_handler import DocHandler
from bokeh.server.views.session_handler import SessionHandler
from bokeh.server.views.ws import WSHandler
from bokeh.util.token import generate_jwt_token, generate_session_id
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream
from tornado.locks import Lock
from tornado.web import Application as TornadoApplication
from tornado.websocket import WebSocketClientConnection, WebSocketProtocol13, websocket_connect

from nvdash.live import internals, preflight, ws_batch
from nvdash.live.internals import CHECKED, INTERNALS, Internal
from tests.conftest import free_port

TIMEOUT_S = 30.0

# --- a real Bokeh server on this test's event loop ------------------------------------------------------------------


@dataclass
class Running:
    server: Server
    port: int
    docs: list[Document] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@asynccontextmanager
async def bokeh_server(*install: Callable[[Server], object], **options: Any) -> AsyncIterator[Running]:
    """A Bokeh server serving one page at ``/page`` (a Div called ``label``), with ``install`` applied."""
    port = free_port()
    docs: list[Document] = []

    def make(doc: Document) -> None:
        doc.add_root(Div(text="start", name="label"))
        docs.append(doc)

    server = Server({"/page": Application(FunctionHandler(make))}, io_loop=IOLoop.current(), port=port,
                    address="127.0.0.1", allow_websocket_origin=[f"127.0.0.1:{port}"], **options)
    for step in install:
        step(server)
    server.start()
    try:
        yield Running(server, port, docs)
    finally:
        server.stop()


async def fetch(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> HTTPResponse:
    """The response, also for an error status."""
    request = HTTPRequest(url, method=method, headers=headers, request_timeout=TIMEOUT_S)
    return await AsyncHTTPClient().fetch(request, raise_error=False)


async def read_message(ws: WebSocketClientConnection) -> dict[str, Any]:
    """The header of the next Bokeh protocol message (its other frames read and dropped)."""
    header = await asyncio.wait_for(ws.read_message(), TIMEOUT_S)
    assert isinstance(header, str), f"the connection closed: {ws.close_code} {ws.close_reason}"
    parsed: dict[str, Any] = json.loads(header)
    for _ in range(2 + 2 * int(parsed.get("num_buffers", 0))):
        await asyncio.wait_for(ws.read_message(), TIMEOUT_S)
    return parsed


async def open_viewer(running: Running, origin: str | None = None,
                      compression: dict[str, Any] | None = None) -> WebSocketClientConnection:
    """A websocket viewer of a new session of ``/page``, past Bokeh's ``ACK``."""
    token = generate_jwt_token(generate_session_id())
    request = HTTPRequest(f"ws://127.0.0.1:{running.port}/page/ws",
                          headers={"Origin": origin or f"http://127.0.0.1:{running.port}"},
                          request_timeout=TIMEOUT_S)
    ws = await websocket_connect(request, subprotocols=["bokeh", token], compression_options=compression)
    assert (await read_message(ws))["msgtype"] == "ACK"
    return ws


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (on the loop) until ``condition`` holds; fails naming ``what`` after the deadline."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not seen within {TIMEOUT_S} s: {what}"
        await asyncio.sleep(0.02)


def only_connection(running: Running) -> ServerConnection:
    connections = internals.server_connections(running.server)
    assert len(connections) == 1, f"the server lists {len(connections)} connections for one open websocket"
    return connections[0]


# --- one check per internal -------------------------------------------------------------------------------------

Check = Callable[[], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    def register(function: Check) -> Check:
        assert name not in CHECKS, f"two checks of {name}"
        CHECKS[name] = function
        return function
    return register


@check("bokeh.server.server.Server._tornado")
async def _tornado_app() -> None:
    async with bokeh_server() as running:
        application = internals.tornado_app(running.server)
        assert isinstance(application, BokehTornado), f"is {type(application).__name__}, not a BokehTornado"


@check("bokeh.server.server.Server._http")
async def _http_server() -> None:
    async with bokeh_server() as running:
        http = internals.http_server(running.server)
        assert isinstance(http, HTTPServer), f"is {type(http).__name__}, not a tornado HTTPServer"
        extra = socket.socket()
        extra.bind(("127.0.0.1", 0))
        extra.listen()
        extra.setblocking(False)
        http.add_sockets([extra])
        port = extra.getsockname()[1]
        response = await fetch(f"http://127.0.0.1:{port}/page")
        assert response.code == 200, f"a socket given to add_sockets was answered {response.code}"


@check("bokeh.server.tornado.BokehTornado._clients")
async def _clients() -> None:
    async with bokeh_server() as running:
        assert internals.server_connections(running.server) == []
        ws = await open_viewer(running)
        connection = only_connection(running)
        assert isinstance(connection, ServerConnection), type(connection).__name__
        ws.close()


@check("bokeh.server.tornado.BokehTornado.websocket_origins")
async def _websocket_origins() -> None:
    async with bokeh_server() as running:
        stranger = "http://example.test:8000"
        with pytest.raises(HTTPClientError) as refused:
            await open_viewer(running, origin=stranger)
        assert refused.value.code == 403, f"an origin not allowed was answered {refused.value.code}, not 403"
        origins = internals.websocket_origins(running.server)
        assert isinstance(origins, set), type(origins).__name__
        origins.add("example.test:8000")
        ws = await open_viewer(running, origin=stranger)
        ws.close()


@check("bokeh.server.connection.ServerConnection._socket")
async def _connection_socket() -> None:
    async with bokeh_server() as running:
        ws = await open_viewer(running)
        assert isinstance(getattr(only_connection(running), "_socket", None), WSHandler), "it is not the WSHandler"
        assert isinstance(internals.connection_websocket(only_connection(running)), WSHandler)
        ws.close()


@check("bokeh.server.session.ServerSession._subscribed_connections")
async def _subscribed_connections() -> None:
    async with bokeh_server() as running:
        ws = await open_viewer(running)
        (session,) = running.server.get_sessions("/page")
        assert isinstance(session, ServerSession)
        assert isinstance(getattr(session, "_subscribed_connections", None), set), "it is not a set"
        assert internals.session_connections(session) == [only_connection(running)]
        assert session.connection_count == 1
        ws.close()


@check("bokeh.server.views.ws.WSHandler._async_open")
async def _async_open() -> None:
    assert inspect.iscoroutinefunction(getattr(WSHandler, "_async_open", None)), "it is not a coroutine method"
    async with bokeh_server(ws_batch.batch_websocket_writes) as running:
        ws = await open_viewer(running)
        connection = only_connection(running)
        handler = internals.connection_websocket(connection)
        assert isinstance(handler, ws_batch.BatchingWSHandler), "the route's replacement handler was not used"
        assert handler.connection is connection, "WSHandler.connection is not the session's connection"
        sent: list[object] = []
        shadowed = connection.send_patch_document

        def recording(event: Any) -> Any:
            sent.append(event)
            return shadowed(event)

        connection.send_patch_document = recording  # type: ignore[method-assign]
        (doc,) = running.docs
        (label,) = doc.select({"name": "label"})
        assert isinstance(label, Div)

        def change() -> None:
            label.text = "changed"

        doc.add_next_tick_callback(change)
        assert (await read_message(ws))["msgtype"] == "PATCH-DOC"
        assert len(sent) == 1, "a document change did not go through ServerConnection.send_patch_document"
        ws.close()


class FrameRecorder:
    """What ``Message.send`` writes to a connection: (binary, payload) per frame."""

    def __init__(self) -> None:
        self.write_lock = Lock()
        self.frames: list[tuple[bool, bytes]] = []

    async def write_message(self, payload: str | bytes, binary: bool = False, locked: bool = True) -> None:
        self.frames.append((binary, payload.encode() if isinstance(payload, str) else bytes(payload)))


def parse_frames(data: bytes) -> list[tuple[bool, bytes]]:
    """(binary, payload) of each of a run of final, unmasked websocket frames."""
    frames = []
    at = 0
    while at < len(data):
        opcode, size, at = data[at] & 0x0F, data[at + 1] & 0x7F, at + 2
        if size == 126:
            (size,), at = struct.unpack("!H", data[at:at + 2]), at + 2
        elif size == 127:
            (size,), at = struct.unpack("!Q", data[at:at + 8]), at + 8
        frames.append((opcode == 0x2, data[at:at + size]))
        at += size
    return frames


@check("bokeh.protocol.message.Message.send")
async def _message_send() -> None:
    doc = Document()
    source = ColumnDataSource(data={"y": np.arange(3.0)})
    doc.add_root(source)
    events: list[Any] = []
    doc.on_change(events.append)
    source.stream({"y": np.arange(50.0)})
    message: Message[Any] = ws_batch.columns_message(events[-1])
    assert message.buffers, "a numpy stream made no binary buffer"
    recorder = FrameRecorder()
    await message.send(recorder)  # type: ignore[arg-type]
    assert parse_frames(ws_batch.message_bytes(message)) == recorder.frames, (
        "Bokeh writes a message's frames in another order or form than nvdash frames them")


@check("bokeh.protocol.messages.patch_doc.patch_doc.create")
async def _patch_doc_create() -> None:
    doc = Document()
    label = Div(text="a")
    source = ColumnDataSource(data={"y": [1.0, 2.0]})
    select = Select(options=["a"], value="a")
    layout = Column(label, select)
    doc.add_root(layout)
    doc.add_root(source)
    events: list[Any] = []
    doc.on_change(events.append)
    new_model = Div(text="new")
    layout.children = [*layout.children, new_model]  # a new model, not yet sent
    new_models = set(doc.models._new_models)
    assert new_model in new_models, "a model added to the document is not counted as new"
    first = len(events)
    label.text = "b"
    label.styles = {"color": "red"}
    select.options = [("0", "GPU 0"), ("1", "GPU 1")]
    source.stream({"y": [3.0]})
    source.patch({"y": [(0, float("nan"))]})
    for event in events[first:]:
        ours = ws_batch.fast_message(event)
        assert ours is not None, f"{type(event).__name__} is not made cheaply"
        bokehs = Protocol().create("PATCH-DOC", [event])
        assert json.loads(ours.content_json) == json.loads(bokehs.content_json), (
            f"Bokeh's PATCH-DOC of a {type(event).__name__} differs from the one made without references")
        assert doc.models._new_models == new_models, "Bokeh's PATCH-DOC of a plain value marked new models as sent"
    assert ws_batch.fast_message(events[0]) is None, "a change whose value holds a model was made cheaply"
    patch = ws_batch.FastPatch()
    for event in events[first:]:
        patch.add(event)
    assert json.loads(patch.message().content_json) == json.loads(
        Protocol().create("PATCH-DOC", events[first:]).content_json), (
        "Bokeh's PATCH-DOC of several events differs from the events' own serializations in order")


@check("bokeh.document.document.gc")
async def _document_gc() -> None:
    assert internals.document_gc(bokeh_document) is not None, "Bokeh's document module has no global called gc"
    calls: list[int] = []

    class Recorder:
        def collect(self, generation: int = 2) -> int:
            calls.append(generation)
            return 0

    saved = internals.document_gc(bokeh_document)
    internals.set_document_gc(bokeh_document, Recorder())
    doc = Document()

    def session(event: object) -> None:
        """Stands for the session: destroy removes what the session registered."""

    doc.on_change(session)
    try:
        doc.destroy(session)
    finally:
        internals.set_document_gc(bokeh_document, saved)
    assert calls, "Document.destroy did not collect through the module's gc global"


@check("bokeh.document.Document.destroy")
async def _document_destroy() -> None:
    seen: list[tuple[Document, Any, int]] = []
    original = Document.destroy

    def recording(document: Document, session: Any) -> None:
        seen.append((document, session, len(list(document.models))))
        original(document, session)

    Document.destroy = recording  # type: ignore[method-assign,assignment]
    try:
        async with bokeh_server(unused_session_lifetime_milliseconds=1,
                                check_unused_sessions_milliseconds=20) as running:
            ws = await open_viewer(running)
            await until(lambda: len(running.docs) == 1, "the session's document")
            ws.close()
            await until(lambda: bool(seen), "Document.destroy called for the discarded session")
    finally:
        Document.destroy = original  # type: ignore[method-assign]
    document, session, models = seen[0]
    assert document is running.docs[0], "destroy was called on another document"
    assert isinstance(session, ServerSession), "destroy was not given the session"
    assert models > 0, "the document's models were gone before destroy ran"


@check("bokeh.core.has_props.HasProps._property_values")
async def _property_values() -> None:
    source = ColumnDataSource(data={"x": [1, 2]})
    maps = internals.property_value_maps(source)
    assert len(maps) == 3, f"{len(maps)} maps"
    assert all(isinstance(values, dict) for values in maps), [type(values).__name__ for values in maps]
    held = [value for values in maps for value in values.values() if isinstance(value, PropertyValueContainer)]
    assert any(value is source.data for value in held), "a model's dict property is not among its property values"


@check("bokeh.core.property.wrappers.PropertyValueContainer._owners")
async def _owners() -> None:
    source = ColumnDataSource(data={"x": [1, 2]})
    container = source.data
    assert isinstance(container, PropertyValueContainer)
    owners = getattr(container, "_owners", None)
    assert isinstance(owners, set), "it is not a set"
    assert any(owner is source for owner, _descriptor in owners), "the container does not point back at its model"
    internals.forget_owners(container)
    assert not getattr(container, "_owners", None)


@check("bokeh.server.views.session_handler.SessionHandler.get_session")
async def _get_session() -> None:
    assert issubclass(DocHandler, SessionHandler)
    assert issubclass(AutoloadJsHandler, SessionHandler)
    async with bokeh_server() as running:
        response = await fetch(running.url("/page?bokeh-session-id="))
        assert response.code == 500, f"Bokeh answered an empty session id with {response.code}, not 500 (fixed?)"
    async with bokeh_server(preflight.refuse_preflights_without_origin) as running:
        for path in ("/page?bokeh-session-id=", "/page/autoload.js?bokeh-autoload-element=x&bokeh-session-id="):
            response = await fetch(running.url(path))
            assert response.code == 400, f"{path}: {response.code}: the overridden get_session was not awaited"
        response = await fetch(running.url("/page"))
        assert response.code == 200, f"a plain page request was answered {response.code}"


@check("bokeh.server.views.autoload_js_handler.AutoloadJsHandler.options")
async def _autoload_options() -> None:
    path = "/page/autoload.js?bokeh-autoload-element=x"
    async with bokeh_server() as running:
        origin = "http://example.test"
        response = await fetch(running.url(path), "OPTIONS", {"Origin": origin})
        assert response.headers.get("Access-Control-Allow-Origin") == origin, "the Origin is no longer echoed"
        response = await fetch(running.url(path), "OPTIONS")
        assert response.code == 500, f"without Origin Bokeh answered {response.code}, not 500 (fixed?)"
    async with bokeh_server(preflight.refuse_preflights_without_origin) as running:
        response = await fetch(running.url(path), "OPTIONS")
        assert response.code == 400, f"without Origin nvdash's handler answered {response.code}"


@check("tornado.web.Application.wildcard_router")
async def _wildcard_router() -> None:
    async with bokeh_server() as running:
        targets = {rule.target for rule in internals.route_rules(running.server)}
        for handler in (DocHandler, AutoloadJsHandler, WSHandler):
            assert handler in targets, f"{handler.__name__} is not a route's target"

        class Marked(DocHandler):
            async def prepare(self) -> None:
                await super().prepare()  # type: ignore[no-untyped-call]
                self.set_header("X-Marked", "yes")

        assert internals.replace_route_targets(running.server, {DocHandler: Marked}) == 1
        response = await fetch(running.url("/page"))
        assert response.headers.get("X-Marked") == "yes", "a replaced route target was not used"


@check("tornado.web.Application.find_handler")
async def _find_handler() -> None:
    assert callable(getattr(TornadoApplication, "find_handler", None)), "tornado.web.Application has no find_handler"
    async with bokeh_server() as running:
        application = internals.tornado_app(running.server)
        routes = application.find_handler
        asked: list[str] = []

        def find_handler(request: Any, **kwargs: Any) -> Any:
            asked.append(request.path)
            return routes(request, **kwargs)

        application.find_handler = find_handler  # type: ignore[method-assign]
        response = await fetch(running.url("/page"))
        assert response.code == 200
        assert asked == ["/page"], f"the instance's find_handler saw {asked}"


@check("tornado.iostream.BaseIOStream._total_write_index")
async def _write_indexes() -> None:
    left, right = socket.socketpair()
    stream = IOStream(left)
    try:
        assert hasattr(stream, "_total_write_index"), "_total_write_index is gone"
        assert hasattr(stream, "_total_write_done_index"), "_total_write_done_index is gone"
        await stream.write(b"x" * 1000)
        assert internals.write_indexes(stream) == (1000, 1000)
        big = 64 << 20  # far more than the socket takes while nobody reads
        stream.write(b"y" * big)
        queued, written = internals.write_indexes(stream)
        assert queued == 1000 + big, queued
        assert written < queued, "the stream said everything was written to a socket nobody reads"
    finally:
        stream.close()
        right.close()


@check("tornado.websocket.WebSocketProtocol13._compressor")
async def _compressor() -> None:
    async with bokeh_server(websocket_compression_level=6) as running:
        plain = await open_viewer(running)
        compressed = await open_viewer(running, compression={})
        protocols: dict[bool, bool] = {}
        for connection in internals.server_connections(running.server):
            handler = internals.connection_websocket(connection)
            assert handler is not None
            protocol = handler.ws_connection
            assert isinstance(protocol, WebSocketProtocol13), type(protocol).__name__
            assert hasattr(protocol, "_compressor"), "_compressor is gone"
            protocols[internals.compresses(protocol)] = True
        assert protocols == {False: True, True: True}, "a compressing and a plain connection are not told apart"
        plain.close()
        compressed.close()


# --- the tests -----------------------------------------------------------------------------------------------------


def test_every_internal_has_a_check_and_every_check_an_internal() -> None:
    listed = {entry.name for entry in INTERNALS}
    assert len(listed) == len(INTERNALS), "an internal is listed twice"
    assert set(CHECKS) == listed, (
        f"internals without a check: {sorted(listed - set(CHECKS))}; checks of no listed internal: "
        f"{sorted(set(CHECKS) - listed)}")


def test_the_checked_releases_are_the_installed_ones() -> None:
    """pyproject bounds Bokeh and Tornado to the minor releases checked; a newer one needs the list rechecked."""
    for library, checked in CHECKED.items():
        installed = version(library)
        assert installed.split(".")[:2] == checked.split(".")[:2], (
            f"{library} {installed} is installed but nvdash.live.internals was checked against {checked}: "
            "run this file, update CHECKED and pyproject's bound")


@pytest.mark.parametrize("entry", INTERNALS, ids=lambda entry: entry.name)
def test_internal_holds(entry: Internal) -> None:
    probe = CHECKS.get(entry.name)
    assert probe is not None, f"{entry.name} is listed in nvdash.live.internals but has no check here"
    try:
        asyncio.run(asyncio.wait_for(probe(), 2 * TIMEOUT_S))
    except (AssertionError, AttributeError, TypeError, KeyError, ValueError, asyncio.TimeoutError) as error:
        pytest.fail(f"{entry.name} no longer holds ({type(error).__name__}: {error}): {entry.feature} need it "
                    f"(checked against {entry.library} {CHECKED[entry.library]}, installed "
                    f"{version(entry.library)})")
    finally:
        gc.collect()
