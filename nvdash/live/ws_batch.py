"""One socket write per document change, not one per websocket frame.

Bokeh sends each protocol message as three or more websocket frames (header, metadata, content, and a header
and a payload per binary buffer), writing each frame to the socket on its own, and a callback that changes
several sources sends a message per change. On a server with many viewers those writes dominate the event
loop's busy time: each is a ``send`` system call and, on loopback, the whole trip through the kernel's network
stack (``benchmarks/viewers.py``, profiled with py-spy at 50 viewers).

:class:`BatchingWSHandler` frames every message a callback sends at once and writes them together, in order,
after the callback, with one ``send``. The bytes on the wire are the same frames in the same order (RFC 6455,
unmasked server frames); the future a message's sender awaits completes when its bytes have left the process,
as Bokeh's own does. A connection with per-message compression keeps Bokeh's own writing.

It also builds the messages of the steady state, a stream or a patch of a source's columns and a property set to
a plain value (a Div's text, a figure's height, a range's factors), without the document's list of models:
Bokeh's ``PATCH-DOC`` looks up every model of the document for each message (a fifth of the loop's busy time at 50
viewers; a tenth with 10 viewers of every dashboard), which matters only for events whose new values may hold
models. Those still go Bokeh's way. The fast changes a callback makes one after another (a stream and a Div's text)
go as one message (:class:`FastPatch`), as Bokeh's ``PATCH-DOC`` of several events would carry them: half the
frames and per-message work of a message each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from asyncio import Future
from functools import partial
from typing import Any

from bokeh.core.property.wrappers import PropertyValueDict, PropertyValueList
from bokeh.core.serialization import Serializer
from bokeh.document.events import ColumnsPatchedEvent, ColumnsStreamedEvent, DocumentPatchedEvent, ModelChangedEvent
from bokeh.document.json import PatchJson
from bokeh.protocol.message import Message
from bokeh.protocol.messages.patch_doc import patch_doc
from bokeh.server.connection import ServerConnection
from bokeh.server.server import Server
from bokeh.server.views.ws import WSHandler
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketProtocol13

from nvdash.live.internals import compresses, replace_route_targets

log = logging.getLogger(__name__)

TEXT = 0x1
BINARY = 0x2
FIN = 0x80


def frame(opcode: int, payload: bytes) -> bytes:
    """One final, unmasked websocket frame (RFC 6455 section 5.2) carrying ``payload``."""
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", FIN | opcode, size)
    elif size <= 0xFFFF:
        head = struct.pack("!BBH", FIN | opcode, 126, size)
    else:
        head = struct.pack("!BBQ", FIN | opcode, 127, size)
    return head + payload


def message_bytes(message: Message[Any]) -> bytes:
    """A Bokeh protocol message as the frames Bokeh's ``Message.send`` writes, in its order."""
    parts = [
        frame(TEXT, message.header_json.encode()),
        frame(TEXT, message.metadata_json.encode()),
        frame(TEXT, message.content_json.encode()),
    ]
    for buffer in message.buffers:
        parts.append(frame(TEXT, json.dumps(buffer.ref).encode()))
        parts.append(frame(BINARY, buffer.to_bytes()))
    return b"".join(parts)


def columns_message(event: ColumnsStreamedEvent | ColumnsPatchedEvent | ModelChangedEvent) -> Message[Any]:
    """The ``PATCH-DOC`` message Bokeh makes of ``event``, made without the document's models: a stream or a
    patch carries column values and a reference to its source, never a model to be sent; so does a property
    change whose new value is :func:`plain`."""
    serializer = Serializer()
    message = patch_doc(patch_doc.create_header(), {}, PatchJson(events=serializer.encode([event])))
    message.add_buffers(*serializer.buffers)
    return message


_PLAIN_SCALARS = frozenset({type(None), bool, int, float, str})


def plain(value: Any) -> bool:
    """Whether ``value`` is serialized by Bokeh with no model in it: None, a bool, an int, a float or a str (exactly
    those types: a subclass may serialize itself otherwise), or a list, tuple or dict of such values (also Bokeh's
    list and dict property wrappers)."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind in _PLAIN_SEQUENCES:
        return all(plain(item) for item in value)
    if kind in _PLAIN_MAPPINGS:
        return all(plain(key) and plain(item) for key, item in value.items())
    return False


_PLAIN_SEQUENCES = frozenset({list, tuple, PropertyValueList})
_PLAIN_MAPPINGS = frozenset({dict, PropertyValueDict})


def is_fast(event: DocumentPatchedEvent) -> bool:
    """Whether ``event`` can hold no model: a stream, a patch, or a property set to a :func:`plain` value."""
    if isinstance(event, ColumnsStreamedEvent | ColumnsPatchedEvent):
        return True
    return type(event) is ModelChangedEvent and plain(event.new)


def fast_message(event: DocumentPatchedEvent) -> Message[Any] | None:
    """``event``'s ``PATCH-DOC`` made without the document's models (:func:`columns_message`) when it
    :func:`is_fast`; ``None`` for Bokeh's own way."""
    if isinstance(event, ColumnsStreamedEvent | ColumnsPatchedEvent | ModelChangedEvent) and is_fast(event):
        return columns_message(event)
    return None


class FastPatch:
    """Fast events (:func:`is_fast`) sent one after another, as one ``PATCH-DOC`` that carries them all in order.

    Each event is serialized when added (its values as they are then); the message is made when written. A
    document change that Bokeh serializes itself (its value may hold models it must define) is not added: it goes
    as a message of its own, and the events after it start another patch, so the browser applies every event in
    the order the document changed.
    """

    def __init__(self) -> None:
        self._serializer = Serializer()
        self.events: list[Any] = []

    def add(self, event: DocumentPatchedEvent) -> None:
        self.events.append(self._serializer.encode(event))

    def message(self) -> Message[Any]:
        message = patch_doc(patch_doc.create_header(), {}, PatchJson(events=self.events))
        message.add_buffers(*self._serializer.buffers)
        return message


class BatchingWSHandler(WSHandler):
    """Bokeh's websocket handler, writing the messages sent during one loop turn with one socket write."""

    async def _async_open(self, token: str) -> None:
        await super()._async_open(token)
        connection: ServerConnection | None = getattr(self, "connection", None)
        if connection is not None:
            # Bokeh makes its connection itself and offers no hook for the class; shadow the one method.
            connection.send_patch_document = partial(self._send_patch_document, connection)  # type: ignore[method-assign]

    def _send_patch_document(self, connection: ServerConnection, event: DocumentPatchedEvent) -> Future[None]:
        """Bokeh's ``ServerConnection.send_patch_document``, making stream, patch and plain property messages
        cheaply (:func:`fast_message`), and one message of those a callback makes one after another
        (:class:`FastPatch`)."""
        if not is_fast(event):
            return self.send_message(connection.protocol.create("PATCH-DOC", [event]))
        if self._plain() is None:
            message = fast_message(event)
            assert message is not None
            return self.send_message(message)
        outbox, sent = self._queue()
        patch = outbox[-1] if outbox and isinstance(outbox[-1], FastPatch) else None
        if patch is None:
            patch = FastPatch()
            outbox.append(patch)
        patch.add(event)
        return sent

    _outbox: list[bytes | FastPatch] | None = None
    _sent: Future[None] | None = None

    def _plain(self) -> WebSocketProtocol13 | None:
        """The open connection when its frames can be written as is (no compression); else ``None``."""
        protocol = self.ws_connection
        if not isinstance(protocol, WebSocketProtocol13) or protocol.is_closing():
            return None
        if compresses(protocol) or protocol.mask_outgoing:
            return None
        return protocol

    def send_message(self, message: Message[Any]) -> Future[None]:  # type: ignore[override]
        """Queue ``message`` for this turn's write; the future completes once it has left the process.

        Not a coroutine: the message is framed and queued when called, so the messages of one callback, awaited
        one after another by Bokeh's session, go out together.
        """
        if self._plain() is None:
            return asyncio.ensure_future(super().send_message(message))
        outbox, sent = self._queue()
        outbox.append(message_bytes(message))
        return sent

    def _queue(self) -> tuple[list[bytes | FastPatch], Future[None]]:
        """This turn's outbox and the future of its write, made (and the write scheduled) by the turn's first
        message."""
        if self._outbox is None or self._sent is None:
            loop = asyncio.get_running_loop()
            self._outbox = []
            self._sent = loop.create_future()
            loop.call_soon(self._flush)
        return self._outbox, self._sent

    def _flush(self) -> None:
        outbox, sent = self._outbox or [], self._sent
        self._outbox, self._sent = None, None
        if sent is None:
            return
        protocol = self._plain()
        if protocol is None:
            log.debug("websocket closed before %d queued messages were written", len(outbox))
            sent.set_result(None)
            return
        data = b"".join(item if isinstance(item, bytes) else message_bytes(item.message()) for item in outbox)
        try:
            written = protocol.stream.write(data)
        except StreamClosedError:
            sent.set_result(None)
            return
        written.add_done_callback(lambda done: _settle(done, sent))


def _settle(written: Future[None], sent: Future[None]) -> None:
    """Complete ``sent`` when the write is done, whether the stream wrote it all or closed meanwhile (a closed
    viewer is Bokeh's ``on_close``'s business, not the sender's)."""
    if not written.cancelled() and written.exception() is not None:
        log.debug("websocket closed while writing: %s", written.exception())
    if not sent.done():
        sent.set_result(None)


def batch_websocket_writes(server: Server) -> None:
    """Serve ``server``'s websockets with :class:`BatchingWSHandler` (Bokeh offers no option for its handler)."""
    replace_route_targets(server, {WSHandler: BatchingWSHandler})
