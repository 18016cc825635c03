"""A real HTTP server on loopback that answers like a broken Prometheus: a body of the wrong shape, one too large,
bytes dripping slowly, or garbage instead of HTTP; switched at run time to a good answer.

Raw sockets rather than ``http.server`` so that every byte, and when it is sent, is the test's choice.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

GOOD = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node-a", "gpu": "0", "UUID": "GPU-a-0",
                "modelName": "NVIDIA H100 80GB HBM3"}, "value": [1_800_000_000.0, "42"]},
]}}
"""An instant query's answer: one GPU of one node at 42 % (every query of a refresh gets it)."""


def http_answer(body: bytes, status: str = "200 OK", content_type: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def json_answer(value: Any) -> bytes:
    return http_answer(json.dumps(value).encode())


def vector(*items: object) -> bytes:
    """An instant query's answer whose result holds ``items``, whatever they are."""
    return json_answer({"status": "success", "data": {"resultType": "vector", "result": list(items)}})


@dataclass
class Behaviour:
    """What the server does with each request: send ``raw`` (whole), then drip ``drip`` one byte every
    ``drip_every_s`` and hold the connection; or, with ``stream_bytes``, send headers without a length and that
    many bytes of JSON whitespace before ``raw`` (the body)."""

    raw: bytes = field(default_factory=lambda: json_answer(GOOD))
    drip: bytes = b""
    drip_every_s: float = 0.2
    stream_bytes: int = 0


class RoguePrometheus:
    """The server: ``behaviour`` is read for each request; ``requests`` counts them."""

    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.requests = 0
        self.closing = threading.Event()

    def handle(self, connection: socket.socket) -> None:
        self.requests += 1
        behaviour = self.behaviour
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            chunk = connection.recv(4096)
            if not chunk:
                return
            buffer += chunk
        try:
            if behaviour.drip:
                connection.sendall(behaviour.raw)
                for byte in behaviour.drip:
                    connection.sendall(bytes([byte]))
                    if self.closing.wait(behaviour.drip_every_s):
                        return
                self.closing.wait()
                return
            if behaviour.stream_bytes:
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                piece = b" " * (1024 * 1024)
                for _ in range(behaviour.stream_bytes // len(piece)):
                    connection.sendall(piece)
            connection.sendall(behaviour.raw)
        except OSError:
            return  # the client gave up: what a deadline or a size cap does


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.rogue.handle(self.request)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    rogue: RoguePrometheus


@contextmanager
def rogue_prometheus() -> Iterator[tuple[str, RoguePrometheus]]:
    """The server's URL and its behaviour, on a free loopback port, for the duration."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.rogue = RoguePrometheus()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.rogue
    finally:
        server.rogue.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
