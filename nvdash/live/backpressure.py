"""Updates only for viewers that take them.

Bokeh writes each update of a document to its websocket and, before the document's next callback runs, waits
until the write has left the process: a viewer that stops reading holds at most one message in the server, and
its document's callbacks stop until the write completes (``nvdash.live.stalled`` closes such a connection
after a while). Before that, the kernel's send buffer (megabytes, with autotuning) would keep taking updates
the viewer never reads. :func:`viewers_ready` says when a document should skip a tick instead: while nobody is
connected to it (after a page is fetched and before its websocket opens, and for the seconds Bokeh keeps a
session after its viewer left) and while a viewer still has more than :data:`PENDING_LIMIT_BYTES` waiting.
Pages catch up from the store at the next tick they take, so a skipped tick loses nothing.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import sys
import termios
from typing import Any, NamedTuple

from bokeh.document import Document
from tornado.websocket import WebSocketHandler

from nvdash.live.internals import connection_websocket, session_connections, write_indexes

PENDING_LIMIT_BYTES = 256 * 1024
"""A viewer with more than this waiting for it gets no new update until it has read it (a steady tick is a
few KiB; a page's first full document can be a MiB)."""


class Outgoing(NamedTuple):
    """What a websocket has sent: bytes still waiting for the viewer, and bytes the viewer has taken."""

    pending_bytes: int
    taken_bytes: int


def kernel_queue_bytes(sock: socket.socket | None) -> int:
    """Bytes in the socket's send queue that the peer has not acknowledged (Linux ``SIOCOUTQ``); 0 elsewhere."""
    if sock is None or not sys.platform.startswith("linux"):
        return 0
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", answer)[0])


def outgoing(handler: WebSocketHandler) -> Outgoing | None:
    """The websocket's :class:`Outgoing` counts (tornado's write buffer plus the kernel's); ``None`` when closed."""
    stream = getattr(handler.ws_connection, "stream", None)
    if stream is None or stream.closed():
        return None
    total, written = write_indexes(stream)
    buffered = total - written
    queued = kernel_queue_bytes(stream.socket)
    return Outgoing(buffered + queued, written - queued)


def session_websockets(session: Any) -> list[WebSocketHandler]:
    """The websocket handlers of a Bokeh ``ServerSession``'s connections (empty when it has none)."""
    handlers = (connection_websocket(connection) for connection in session_connections(session))
    return [handler for handler in handlers if handler is not None]


def viewers_ready(doc: Document, limit_bytes: int = PENDING_LIMIT_BYTES) -> bool:
    """Whether ``doc`` should take an update now: always outside a Bokeh server; in one, only while a viewer is
    connected and none has more than ``limit_bytes`` waiting."""
    session = getattr(doc.session_context, "session", None)
    if session is None or not hasattr(session, "connection_count"):
        return True
    if session.connection_count == 0:
        return False
    for handler in session_websockets(session):
        counts = outgoing(handler)
        if counts is not None and counts.pending_bytes > limit_bytes:
            return False
    return True
