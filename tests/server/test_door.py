"""What every request of a real server passes: the Host check of a server without a token (DNS rebinding), the
``?token=`` redirect, the security headers, tokens kept out of the log, the body limit and the connection
timeouts."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.sampling.host_source import interface_addresses
from nvdash.server.access import url_host
from nvdash.server.door import WRONG_HOST
from tests.conftest import NvdashServer, nvdash_server, wait_for
from tests.server.test_auth import fetch, websocket

TOKEN = "t0k-SECRET-4d1c"
LOCAL = ["--simulate", "t4", "--no-history", "--allow-host", "dash.example"]
ROUTES = ["/", "/index.json", "/info.json", "/api/processes.json", "/api/snapshot.json", "/export.csv", "/health",
          "/metrics", "/login", "/GPU-Utilization", "/GPU-Utilization/autoload.js?bokeh-autoload-element=x",
          "/GPU-Utilization/metadata", "/static/js/bokeh.min.js", "/no-such-page"]
"""nvdash's pages and APIs, Bokeh's page, autoload script, metadata and static files, and an unknown path."""
TIMEOUT_S = 2
"""The connection timeout the local server runs with (``NVDASH_CONNECTION_TIMEOUT``)."""


@pytest.fixture(scope="module")
def local() -> Iterator[NvdashServer]:
    with nvdash_server(LOCAL, env={"NVDASH_CONNECTION_TIMEOUT": str(TIMEOUT_S)}) as running:
        yield running


@pytest.fixture(scope="module")
def guarded() -> Iterator[NvdashServer]:
    with nvdash_server(["--simulate", "t4", "--no-history", "--token", TOKEN]) as running:
        yield running


@pytest.mark.parametrize("path", ROUTES)
def test_without_a_token_a_foreign_host_is_refused_on_every_route(local: NvdashServer, path: str) -> None:
    refused = fetch(local.url + path, {"Host": f"evil.example:{local.port}"})
    assert (refused.status, refused.body) == (403, WRONG_HOST + "\n")
    for host in (f"127.0.0.1:{local.port}", f"localhost:{local.port}", f"[::1]:{local.port}",
                 f"dash.example:{local.port}"):
        assert fetch(local.url + path, {"Host": host}).status != 403, host


def test_without_a_token_a_foreign_host_gets_no_websocket(local: NvdashServer) -> None:
    foreign = {"Host": f"evil.example:{local.port}", "Origin": f"http://evil.example:{local.port}"}
    assert websocket(local.port, "/GPU-Memory", foreign) == 403
    assert websocket(local.port, "/GPU-Memory", {"Host": f"localhost:{local.port}"}) == 101


def test_the_processes_reach_no_rebound_name(local: NvdashServer) -> None:
    """The attack: a page on evil.example rebinds its name to 127.0.0.1 and reads what is running here."""
    own = fetch(local.url + "/api/processes.json")
    assert own.status == 200
    assert own.body.startswith("{")
    rebound = fetch(local.url + "/api/processes.json", {"Host": "evil.example"})
    assert rebound.status == 403
    assert rebound.body == WRONG_HOST + "\n"


def test_with_a_token_any_host_is_answered_with_the_token(guarded: NvdashServer) -> None:
    host = {"Host": f"gpu-node.example:{guarded.port}"}
    assert fetch(guarded.url + "/api/processes.json", {**host, "Authorization": f"token {TOKEN}"}).status == 200
    assert fetch(guarded.url + "/api/processes.json", host).status == 403  # the token's refusal, as before
    assert "a token is needed" in fetch(guarded.url + "/api/processes.json", host).body


@pytest.mark.parametrize("path", [*ROUTES, "/api/history.json?metric=x"])
def test_every_answer_carries_the_security_headers(local: NvdashServer, path: str) -> None:
    for headers in ({}, {"Host": "evil.example"}):
        response = fetch(local.url + path, headers)
        policy = response.headers["Content-Security-Policy"]
        assert "frame-ancestors 'self'" in policy, (path, policy)
        assert "script-src" not in policy  # Bokeh's pages run inline scripts
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Referrer-Policy"] == "no-referrer"


def test_the_login_form_and_the_refusals_carry_them_too(guarded: NvdashServer) -> None:
    for response in (fetch(guarded.url + "/GPU-Memory", {"Accept": "text/html"}), fetch(guarded.url + "/login"),
                     fetch(guarded.url + "/index.json")):
        assert response.status in (200, 403)
        assert "frame-ancestors 'self'" in response.headers["Content-Security-Policy"]
        assert response.headers["Referrer-Policy"] == "no-referrer"


def test_a_visit_with_the_token_is_sent_on_without_it(guarded: NvdashServer) -> None:
    html = {"Accept": "text/html,application/xhtml+xml"}
    visit = fetch(f"{guarded.url}/GPU-Memory?theme=dark&token={TOKEN}", html)
    assert visit.status == 302
    assert visit.headers["Location"] == "/GPU-Memory?theme=dark"
    (morsel,) = visit.cookie().values()
    assert TOKEN not in morsel.value
    cookie = {**html, "Cookie": f"{morsel.key}={morsel.value}"}
    assert fetch(guarded.url + visit.headers["Location"], cookie).status == 200
    assert fetch(f"{guarded.url}/?token={TOKEN}", {"Sec-Fetch-Mode": "navigate"}).headers["Location"] == "/"
    # A script or an API call with the token is answered at once; a wrong token is refused, not redirected.
    assert fetch(f"{guarded.url}/index.json?token={TOKEN}").status == 200
    assert fetch(f"{guarded.url}/GPU-Memory?token=wrong", html).status == 403


def test_no_log_line_carries_the_token(guarded: NvdashServer) -> None:
    assert fetch(f"{guarded.url}/no-such-page?x=1&token={TOKEN}").status == 404
    assert fetch(f"{guarded.url}/GPU-Memory?bokeh-session-id=&token={TOKEN}").status == 400
    assert fetch(f"{guarded.url}/index.json?token={TOKEN}x").status == 403
    logged = wait_for(guarded.output, lambda text: "404 GET /no-such-page" in text and "400 GET /GPU-Memory" in text)
    lines = [line for line in logged.splitlines() if TOKEN in line and not line.startswith("nvdash: open ")]
    assert not lines, lines
    assert "GET /no-such-page?x=1&token=[redacted]" in logged


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _post(port: int, size: int) -> bytes:
    """POST ``size`` bytes to /health; what the server answered (``b""`` when it hung up first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {size}\r\n"
                     "Content-Type: application/x-www-form-urlencoded\r\n\r\n".encode())
        answer = b""
        try:
            sock.sendall(b"x" * size)
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        return answer


def test_a_large_body_is_refused_before_it_is_read(local: NvdashServer) -> None:
    before = _peak_rss_bytes(local.process.pid)
    for _ in range(3):
        answer = _post(local.port, 10 * 1024 * 1024)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert fetch(local.url + "/health").status == 200
    assert _peak_rss_bytes(local.process.pid) - before < 4 * 1024 * 1024
    assert _post(local.port, 100).startswith(b"HTTP/1.1 405")  # a small body is read (and /health is GET only)


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_and_half_sent_requests_are_closed(local: NvdashServer) -> None:
    port = local.port
    idle = socket.create_connection(("127.0.0.1", port))
    half_head = socket.create_connection(("127.0.0.1", port))
    half_head.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
    half_body = socket.create_connection(("127.0.0.1", port))
    half_body.sendall(f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 100\r\n\r\ntoken=".encode())
    sockets = {"idle": idle, "half-sent headers": half_head, "half-sent body": half_body}
    try:
        for sock in sockets.values():
            sock.settimeout(0.2)
        deadline = time.monotonic() + 30 * TIMEOUT_S
        open_ones = dict(sockets)
        while open_ones and time.monotonic() < deadline:
            open_ones = {name: sock for name, sock in open_ones.items() if not _closed_by_server(sock)}
        assert not open_ones, f"still open after {30 * TIMEOUT_S} s: {sorted(open_ones)}"
    finally:
        for sock in sockets.values():
            sock.close()


def test_on_every_address_without_a_token_this_machines_names_and_addresses_are_answered() -> None:
    with nvdash_server(["--simulate", "t4", "--no-history", "--host", "0.0.0.0", "--no-token"]) as running:
        own = [url_host(address) for address in interface_addresses()] + [socket.gethostname()]
        for host in own:
            assert fetch(running.url + "/index.json", {"Host": f"{host}:{running.port}"}).status == 200, host
        assert fetch(running.url + "/index.json", {"Host": f"evil.example:{running.port}"}).status == 403
