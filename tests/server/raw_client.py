"""A minimal HTTP/1.1 and websocket client over asyncio streams.

It sends exactly the bytes a test asks for (bad percent-encoding, odd headers, broken frames, a handshake cut
short), which no regular client would, and lets a test open many Bokeh sessions concurrently from one process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

TOKEN = re.compile(r'"token":"([^"]+)"')
"""Where a Bokeh page carries its session token."""

OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class HandshakeError(Exception):
    """The server answered the websocket upgrade with something else than 101."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"websocket upgrade answered {status}: {body[:200]!r}")
        self.status = status


@dataclass(frozen=True)
class Response:
    """An HTTP response: status, headers (lower-case names) and the whole body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def request_bytes(method: str, target: str, host: str, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """An HTTP/1.1 request that asks the server to close the connection after answering."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", *(f"{name}: {value}" for name, value in headers),
             "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1", errors="replace")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


def _dechunk(body: bytes) -> bytes:
    out, rest = bytearray(), body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return bytes(out)


async def exchange(host: str, port: int, request: bytes, timeout_s: float = 30.0) -> Response:
    """Send ``request`` as given and read the response until the server closes the connection."""

    async def run() -> Response:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request)
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
        if not data:
            return Response(0, {}, b"")  # the server hung up without answering
        head, _, body = data.partition(b"\r\n\r\n")
        status, headers = _parse_head(head)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = _dechunk(body)
        return Response(status, headers, body)

    return await asyncio.wait_for(run(), timeout_s)


async def get(host: str, port: int, target: str, headers: Sequence[tuple[str, str]] = ()) -> Response:
    """A plain GET of ``target`` (sent as given: nothing is quoted)."""
    return await exchange(host, port, request_bytes("GET", target, f"{host}:{port}", headers))


async def session_token(host: str, port: int, route: str) -> str:
    """GET a dashboard page (the server builds its session) and return the session token written into it."""
    response = await get(host, port, route)
    match = TOKEN.search(response.text)
    if response.status != 200 or match is None:
        raise AssertionError(f"GET {route} answered {response.status} without a session token")
    return match.group(1)


def upgrade_request(path: str, host: str, token: str | None,
                    headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """The websocket upgrade request Bokeh's client sends: subprotocols ``bokeh`` and the session token."""
    key = base64.b64encode(os.urandom(16)).decode()
    extra: list[tuple[str, str]] = [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                    ("Sec-WebSocket-Key", key), ("Sec-WebSocket-Version", "13")]
    if token is not None:
        extra.append(("Sec-WebSocket-Protocol", f"bokeh, {token}"))
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", *(f"{n}: {v}" for n, v in (*extra, *headers)), "", ""]
    return "\r\n".join(lines).encode("latin-1", errors="replace")


def frame(opcode: int, payload: bytes, fin: bool = True, masked: bool = True) -> bytes:
    """One websocket frame (clients must mask; ``masked=False`` breaks that rule on purpose)."""
    first = (0x80 if fin else 0) | opcode
    mask_bit = 0x80 if masked else 0
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", first, mask_bit | size)
    elif size < 2**16:
        head = struct.pack("!BBH", first, mask_bit | 126, size)
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, size)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@dataclass
class WebSocket:
    """An open websocket: raw frames in and out."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    last_content: bytes = b""
    """The content of the last message :meth:`receive_message` read."""

    @classmethod
    async def open(cls, host: str, port: int, path: str, token: str | None, *,
                   headers: Sequence[tuple[str, str]] = (), timeout_s: float = 30.0) -> WebSocket:
        """Complete the upgrade handshake; :class:`HandshakeError` when the server refuses it."""
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(upgrade_request(path, f"{host}:{port}", token, headers))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
            status, response_headers = _parse_head(head)
            if status != 101:
                length = int(response_headers.get("content-length", "0"))
                body = await asyncio.wait_for(reader.read(length), timeout_s) if length else b""
                raise HandshakeError(status, body)
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer)

    async def send(self, opcode: int, payload: bytes, fin: bool = True, masked: bool = True) -> None:
        self.writer.write(frame(opcode, payload, fin, masked))
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        """Bytes that need not be a frame at all."""
        self.writer.write(data)
        await self.writer.drain()

    async def send_message(self, msgtype: str, content: object, header: dict[str, object] | None = None,
                           metadata: object | None = None) -> None:
        """A Bokeh protocol message: header, metadata and content, each a text frame."""
        head = {"msgid": os.urandom(6).hex(), "msgtype": msgtype, **(header or {})}
        for part in (head, {} if metadata is None else metadata, content):
            await self.send(OP_TEXT, json.dumps(part).encode())

    async def receive_frame(self, timeout_s: float = 30.0) -> tuple[int, bytes]:
        """The next frame from the server: opcode and payload (the server never masks)."""

        async def run() -> tuple[int, bytes]:
            first, second = await self.reader.readexactly(2)
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
            return first & 0x0F, await self.reader.readexactly(size)

        return await asyncio.wait_for(run(), timeout_s)

    async def receive_message(self, timeout_s: float = 30.0) -> dict[str, object]:
        """The next Bokeh message's header (its content is kept in :attr:`last_content`, its buffers dropped).

        Fails with ``AssertionError`` when the server closes the connection instead."""
        parts: list[bytes] = []
        while len(parts) < 3:
            opcode, payload = await self.receive_frame(timeout_s)
            if opcode == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                raise AssertionError(f"the server closed the websocket ({code}: {payload[2:]!r})")
            if opcode == OP_TEXT:
                parts.append(payload)
        header: dict[str, object] = json.loads(parts[0])
        self.last_content = parts[2]
        for _ in range(2 * int(str(header.get("num_buffers", 0)))):
            await self.receive_frame(timeout_s)
        return header

    async def wait_closed_by_server(self, timeout_s: float = 30.0) -> int | None:
        """Read until the server closes the websocket (close frame or end of stream); its close code if sent."""

        async def run() -> int | None:
            while True:
                try:
                    opcode, payload = await self.receive_frame(timeout_s)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return None
                if opcode == OP_CLOSE:
                    return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None

        return await asyncio.wait_for(run(), timeout_s)

    def abort(self) -> None:
        """Drop the connection without a closing handshake (a reset, as a crashed client's)."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.close()

    async def close(self, code: int = 1000, wait: bool = False, timeout_s: float = 30.0) -> None:
        """Send a close frame and hang up; with ``wait``, only after the server answered it (or hung up)."""
        with contextlib.suppress(ConnectionError):
            await self.send(OP_CLOSE, struct.pack("!H", code))
        if wait:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while (await self.receive_frame(timeout_s))[0] != OP_CLOSE:
                    pass
        self.writer.close()

    async def receive_until(self, msgtype: str, timeout_s: float = 30.0) -> dict[str, object]:
        """The header of the next message of type ``msgtype`` (updates that come first are skipped)."""
        while True:
            header = await self.receive_message(timeout_s)
            if header.get("msgtype") == msgtype:
                return header


def unread_websocket(host: str, port: int, route: str, token: str, *, rcvbuf_bytes: int = 4096,
                     timeout_s: float = 30.0) -> socket.socket:
    """A blocking socket that completes the websocket handshake on ``route`` and is then never read.

    Its receive buffer is made small before connecting, so the server soon has nowhere to put what it sends.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
    sock.settimeout(timeout_s)
    sock.connect((host, port))
    sock.sendall(upgrade_request(route + "/ws", f"{host}:{port}", token))
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)  # one byte at a time: nothing after the head is read
        if not byte:
            raise AssertionError(f"the server closed the connection during the handshake: {head!r}")
        head += byte
    status, _ = _parse_head(head)
    if status != 101:
        sock.close()
        raise HandshakeError(status, b"")
    return sock


def drain_until_closed(sock: socket.socket, timeout_s: float) -> int:
    """Read a socket until the server closes it; the number of bytes read. Fails after ``timeout_s``."""
    sock.settimeout(timeout_s)
    total = 0
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return total
        if not chunk:
            return total
        total += len(chunk)
