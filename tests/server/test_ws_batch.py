"""Bokeh's messages leave in one socket write per loop turn, framed as RFC 6455 says, and arrive intact."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.client import pull_session
from bokeh.document import Document
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, Div, FactorRange, Select, Title
from bokeh.plotting import figure
from bokeh.protocol import Protocol
from bokeh.server.server import Server
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream

from nvdash.live.ws_batch import batch_websocket_writes, columns_message, fast_message, frame, message_bytes
from tests.conftest import free_port, wait_for
from tests.server.bokeh_viewer import receive_until

# --- framing, from RFC 6455 section 5.7 and 5.2 --------------------------------------------------------------------


def test_frames_are_the_rfcs_examples() -> None:
    assert frame(0x1, b"Hello") == bytes([0x81, 0x05]) + b"Hello"  # a single-frame unmasked text message
    assert frame(0x2, bytes(256))[:4] == bytes([0x82, 0x7E, 0x01, 0x00])  # 256 bytes: 16-bit length
    assert frame(0x2, bytes(65536))[:10] == bytes([0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0])  # 64 KiB: 64-bit length
    assert frame(0x1, bytes(125))[:2] == bytes([0x81, 125])  # the longest 7-bit length
    assert frame(0x1, bytes(126))[:4] == bytes([0x81, 126, 0, 126])


def parse_frames(data: bytes) -> list[tuple[int, bytes]]:
    """Each (opcode, payload) of a run of final, unmasked frames."""
    frames = []
    at = 0
    while at < len(data):
        first, second = data[at], data[at + 1]
        assert first & 0x80, "not a final frame"
        assert not second & 0x80, "a server frame is not masked"
        size, at = second & 0x7F, at + 2
        if size == 126:
            (size,), at = struct.unpack("!H", data[at:at + 2]), at + 2
        elif size == 127:
            (size,), at = struct.unpack("!Q", data[at:at + 8]), at + 8
        frames.append((first & 0x0F, data[at:at + size]))
        at += size
    return frames


def test_a_message_is_its_parts_in_bokehs_order() -> None:
    doc = Document()
    source = ColumnDataSource(data={"y": np.arange(3.0)})
    doc.add_root(source)
    seen: list[Any] = []
    doc.on_change(seen.append)
    source.stream({"y": np.arange(100.0)})  # numpy: sent as a binary buffer
    message = columns_message(seen[-1])
    frames = parse_frames(message_bytes(message))
    assert [opcode for opcode, _ in frames] == [0x1, 0x1, 0x1, 0x1, 0x2]
    header, metadata, content, buffer_header, payload = (body for _, body in frames)
    assert json.loads(header)["msgtype"] == "PATCH-DOC"
    assert json.loads(header)["num_buffers"] == 1
    assert json.loads(metadata) == {}
    (event,) = json.loads(content)["events"]
    assert (event["kind"], event["model"], event["attr"]) == ("ColumnsStreamed", {"id": source.id}, "data")
    assert json.loads(buffer_header)["id"] == event["data"]["entries"][0][1]["array"]["data"]["id"]
    assert np.frombuffer(payload, dtype=np.float64).tolist() == list(range(100))


def test_a_stream_message_equals_bokehs() -> None:
    doc = Document()
    source = ColumnDataSource(data={"x": [1, 2], "name": ["a", "b"]})
    doc.add_root(source)
    seen: list[Any] = []
    doc.on_change(seen.append)
    source.stream({"x": [3], "name": ["c"]})
    source.patch({"x": [(0, 10)]})
    for event in seen:
        ours, bokehs = columns_message(event), Protocol().create("PATCH-DOC", [event])
        assert json.loads(ours.content_json) == json.loads(bokehs.content_json)
        assert json.loads(ours.header_json)["msgtype"] == json.loads(bokehs.header_json)["msgtype"]


# --- a real Bokeh server ------------------------------------------------------------------------------------------


class Page:
    """The server side of the test's one document: sources that one call changes in four ways."""

    def __init__(self) -> None:
        self.doc: Document | None = None
        self.ready = threading.Event()
        self.short = ColumnDataSource(data={"x": [0]}, name="short")
        self.long = ColumnDataSource(data={"y": np.zeros(0)}, name="long")
        self.patched = ColumnDataSource(data={"z": [0, 0]}, name="patched")
        self.label = Div(text="step 0", name="label")

    def make(self, doc: Document) -> None:
        doc.add_root(self.short)
        doc.add_root(self.long)
        doc.add_root(self.patched)
        doc.add_root(self.label)
        self.doc = doc
        self.ready.set()

    def step(self, k: int) -> None:
        """Two streams (a short list, a long numpy column), a patch and a property: four messages."""
        self.short.stream({"x": [k]})
        self.long.stream({"y": np.arange(100.0) + 100 * k})
        self.patched.patch({"z": [(0, k)]})
        self.label.text = f"step {k}"


@contextmanager
def bokeh_server(page: Page | PropertyPage) -> Iterator[tuple[str, list[bytes]]]:
    """A Bokeh server in a thread serving ``page`` at ``/page``, with nvdash's batching; yields its URL and a list
    of its socket writes (appended by the server thread)."""
    port = free_port()
    writes: list[bytes] = []
    started = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        loop = IOLoop.current()
        server = Server({"/page": Application(FunctionHandler(page.make))}, io_loop=loop, port=port,
                        address="127.0.0.1", allow_websocket_origin=[f"127.0.0.1:{port}"])
        batch_websocket_writes(server)
        server.start()
        holder.update(loop=loop, server=server)
        started.set()
        loop.start()
        server.stop()
        loop.close(all_fds=True)

    original = IOStream.write

    def counted(stream: IOStream, data: Any) -> Any:
        if threading.current_thread() is thread:
            writes.append(bytes(data))
        return original(stream, data)

    thread = threading.Thread(target=serve, daemon=True, name="bokeh-test-server")
    IOStream.write = counted  # type: ignore[method-assign,assignment]
    try:
        thread.start()
        assert started.wait(30)
        yield f"http://127.0.0.1:{port}", writes
    finally:
        IOStream.write = original  # type: ignore[method-assign]
        loop = holder.get("loop")
        if loop is not None:
            loop.add_callback(loop.stop)
        thread.join(30)




def on_server(page: Page | PropertyPage, call: Callable[[], None]) -> None:
    """Run ``call`` on the page's document, on the server's loop (Bokeh's thread-safe way in)."""
    assert page.doc is not None
    page.doc.add_next_tick_callback(call)


def messages(write: bytes) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each Bokeh message in a socket write: its type and, for a PATCH-DOC, its events."""
    frames = [payload for _, payload in parse_frames(write)]
    found = []
    while frames:
        header, _metadata, content, *frames = frames
        msgtype = json.loads(header)["msgtype"]
        found.append((msgtype, json.loads(content).get("events", [])))
        frames = frames[2 * json.loads(header).get("num_buffers", 0):]
    return found


def test_one_write_per_callback_and_the_viewer_sees_every_change() -> None:
    page = Page()
    with bokeh_server(page) as (url, writes):
        session = pull_session(url=url + "/page")
        try:
            assert page.ready.wait(30)
            (short,) = session.document.select({"name": "short"})
            (long,) = session.document.select({"name": "long"})
            (patched,) = session.document.select({"name": "patched"})
            (label,) = session.document.select({"name": "label"})
            for k in (1, 2, 3):
                before = len(writes)
                on_server(page, lambda k=k: page.step(k))

                receive_until(session, lambda k=k: label.text == f"step {k}")
                wait_for(lambda: len(writes), lambda count, before=before: count > before)
                assert len(writes) - before == 1, [len(write) for write in writes[before:]]
                (message,) = messages(writes[-1])  # and one message with the four changes, in order
                assert message[0] == "PATCH-DOC"
                assert [event["kind"] for event in message[1]] == [
                    "ColumnsStreamed", "ColumnsStreamed", "ColumnsPatched", "ModelChanged"]
            assert list(short.data["x"]) == [0, 1, 2, 3]
            assert list(long.data["y"]) == [float(v) for v in range(100, 400)]
            assert list(patched.data["z"]) == [3, 0]
        finally:
            session.close()


# --- property changes without the document's models ---------------------------------------------------------------


def _changes(doc: Document, change: Callable[[], None]) -> list[Any]:
    seen: list[Any] = []
    doc.on_change(seen.append)
    try:
        change()
    finally:
        doc.remove_on_change(seen.append)
    return seen


def test_a_plain_property_message_equals_bokehs_and_a_model_valued_one_is_left_to_bokeh() -> None:
    doc = Document()
    label = Div(text="a")
    select = Select(options=["a"], value="a")
    plot = figure(x_range=FactorRange(factors=["a"]), height=100)
    doc.add_root(column(label, select, plot))
    plain_changes = _changes(doc, lambda: (
        setattr(label, "text", "b <i>c</i>"),
        setattr(label, "styles", {"color": "red"}),
        setattr(select, "options", [("0", "GPU 0"), ("1", "GPU 1")]),
        setattr(plot, "visible", False),
        setattr(plot, "height", 240),
        setattr(plot.x_range, "factors", ["x", "y"]),
        setattr(plot.x_range, "range_padding", float("nan")),
    ))
    assert len(plain_changes) == 7
    for event in plain_changes:
        ours = fast_message(event)
        assert ours is not None, event
        bokehs = Protocol().create("PATCH-DOC", [event])
        assert json.loads(ours.content_json) == json.loads(bokehs.content_json)
    (model_valued,) = _changes(doc, lambda: setattr(plot, "title", Title(text="new")))
    assert fast_message(model_valued) is None  # a new model: only Bokeh's way sends its definition
    (with_numpy,) = _changes(doc, lambda: setattr(plot.x_range, "factors", list(np.array(["p", "q"]))))
    assert fast_message(with_numpy) is None  # numpy strings are not exactly str


class PropertyPage:
    """A document whose steps set plain properties, then one that adds a model."""

    def __init__(self) -> None:
        self.doc: Document | None = None
        self.ready = threading.Event()
        self.label = Div(text="step 0", name="label")
        self.select = Select(options=["a"], value="a", name="select")
        self.plot = figure(x_range=FactorRange(factors=["a"]), height=100, name="plot")
        self.plot.scatter(x=["a"], y=[1])
        self.layout = column(self.label, self.select, self.plot, name="layout")

    def make(self, doc: Document) -> None:
        doc.add_root(self.layout)
        self.doc = doc
        self.ready.set()

    def plain_step(self) -> None:
        self.select.options = [("0", "GPU 0"), ("1", "GPU 1")]
        self.plot.visible = False
        self.plot.height = 240
        self.plot.x_range.factors = ["x", "y"]
        self.label.styles = {"color": "red"}
        self.label.text = "plain"

    def model_step(self) -> None:
        """A plain change, a model added (Bokeh's message), and a change of the new model: three messages."""
        self.label.text = "before"
        self.layout.children = [*self.layout.children, Div(text="added", name="added")]
        (self.layout.children[-1]).text = "added, then changed"  # type: ignore[attr-defined]


def test_the_viewer_gets_plain_properties_without_bokehs_message_and_new_models_with_it() -> None:
    page = PropertyPage()
    creates: list[str] = []
    original = Protocol.create

    def counted(protocol: Protocol, msgtype: str, *args: Any, **kwargs: Any) -> Any:
        if msgtype == "PATCH-DOC" and threading.current_thread().name == "bokeh-test-server":
            creates.append(msgtype)
        return original(protocol, msgtype, *args, **kwargs)

    Protocol.create = counted  # type: ignore[method-assign]
    try:
        with bokeh_server(page) as (url, writes):
            session = pull_session(url=url + "/page")
            try:
                assert page.ready.wait(30)
                (label,) = session.document.select({"name": "label"})
                (select,) = session.document.select({"name": "select"})
                (plot,) = session.document.select({"name": "plot"})
                (layout,) = session.document.select({"name": "layout"})
                on_server(page, page.plain_step)
                receive_until(session, lambda: label.text == "plain")
                assert [tuple(option) for option in select.options] == [("0", "GPU 0"), ("1", "GPU 1")]
                assert (plot.visible, plot.height, list(plot.x_range.factors)) == (False, 240, ["x", "y"])
                assert dict(label.styles) == {"color": "red"}
                assert creates == []  # six property changes, none through Bokeh's PATCH-DOC
                wait_for(lambda: messages(writes[-1]), lambda found: len(found[0][1]) == 6)
                assert [(msgtype, len(events)) for msgtype, events in messages(writes[-1])] == [("PATCH-DOC", 6)]
                on_server(page, page.model_step)
                receive_until(session, lambda: len(layout.children) == 4
                              and layout.children[-1].text == "added, then changed")
                assert label.text == "before"
                assert creates == ["PATCH-DOC"]
                wait_for(lambda: messages(writes[-1]), lambda found: len(found) == 3)
                assert [[event["kind"] for event in events] for _, events in messages(writes[-1])] == [
                    ["ModelChanged"], ["ModelChanged"], ["ModelChanged"]]
            finally:
                session.close()
    finally:
        Protocol.create = original  # type: ignore[method-assign]
