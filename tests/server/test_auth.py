"""A real server beyond loopback (``--host 0.0.0.0``): the token on every page, JSON route and websocket, the
cookie, the login form, ``/health`` for probes, ``/metrics``, ``--no-token``, and HTTPS with a self-signed
certificate."""

from __future__ import annotations

import http.client
import json
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.cookies import SimpleCookie
from pathlib import Path

import pytest
from bokeh.client import pull_session
from bokeh.util.token import generate_jwt_token, generate_session_id
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from nvdash.apps import APPS, Requirement
from nvdash.sampling.host_source import interface_addresses
from nvdash.server.access import url_host
from nvdash.server.auth import WRONG_TOKEN
from tests.conftest import NvdashServer, free_port, nvdash_env, nvdash_server, stop_process, wait_for
from tests.unit.test_auth import make_certificate

WILDCARD = ["--simulate", "dgx-h100", "--host", "0.0.0.0", "--interval", "0.25"]
START_URL = re.compile(r"^nvdash: open (?P<url>\S+)$", re.MULTILINE)
UNAVAILABLE = next(spec.route for spec in APPS if spec.requires is Requirement.PROMETHEUS)
"""A route this server answers with its "not available here" page (no --prometheus)."""
GUARDED = ["/", "/index.json", "/info.json", "/api/snapshot.json", "/api/processes.json",
           "/api/history.json?metric=utilization_pct&range=1h", "/export.csv?range=1h", "/GPU-Utilization",
           "/GPU-Topology", "/GPU-Utilization/autoload.js?bokeh-autoload-element=x", UNAVAILABLE]
"""The index, each kind of JSON route, the export, dashboards (one live, one static), Bokeh's autoload script,
and an "unavailable" page."""
ANSWERS = {"/": 200, UNAVAILABLE: 404}


class Response:
    """One HTTP exchange, redirects not followed."""

    def __init__(self, status: int, body: str, headers: http.client.HTTPMessage) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    def cookie(self) -> SimpleCookie:
        jar: SimpleCookie = SimpleCookie()
        for header in self.headers.get_all("Set-Cookie") or []:
            jar.load(header)
        return jar


def fetch(url: str, headers: Mapping[str, str] | None = None, method: str = "GET", body: str | None = None,
          context: ssl.SSLContext | None = None) -> Response:
    parts = urllib.parse.urlsplit(url)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.netloc, timeout=30, context=context)
    else:
        connection = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        connection.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body,
                           headers=dict(headers or {}))
        response = connection.getresponse()
        return Response(response.status, response.read().decode("utf-8"), response.headers)
    finally:
        connection.close()


def printed_url(server: NvdashServer) -> str:
    match = START_URL.search(server.output())
    assert match, server.output()
    return match.group("url")


def token_of(server: NvdashServer) -> str:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(printed_url(server)).query)
    return query["token"][0]


def websocket(port: int, route: str, headers: Mapping[str, str] | None = None,
              tls: ssl.SSLContext | None = None) -> int:
    """Open a Bokeh session's websocket as the browser does (over TLS with ``tls``); 101 when the handshake is
    accepted (and the server answers with Bokeh's ACK), else the refusal's status."""

    async def connect() -> int:
        url = f"wss://localhost:{port}{route}/ws" if tls else f"ws://127.0.0.1:{port}{route}/ws"
        request = HTTPRequest(url, headers=dict(headers or {}), ssl_options=tls)
        session_token = generate_jwt_token(generate_session_id())
        try:
            connection = await websocket_connect(request, subprotocols=["bokeh", session_token])
        except HTTPClientError as error:
            return error.code
        try:
            assert await connection.read_message() is not None  # Bokeh's ACK: a working session
        finally:
            connection.close()
        return 101

    status: int = IOLoop.current().run_sync(connect, timeout=60)
    return status


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    with nvdash_server(WILDCARD) as running:
        yield running
        assert "Traceback" not in running.output(), running.output()  # refusals are answers, not errors


def test_the_printed_url_carries_a_working_token(server: NvdashServer) -> None:
    url = printed_url(server)
    assert url.startswith(f"http://localhost:{server.port}/?token=")
    assert len(token_of(server)) == 48
    response = fetch(url.replace("localhost", "127.0.0.1", 1))
    assert response.status == 200
    assert "NVIDIA H100 80GB HBM3" in response.body


@pytest.mark.parametrize("path", GUARDED)
def test_without_the_token_every_page_and_route_is_refused(server: NvdashServer, path: str) -> None:
    response = fetch(server.url + path)
    assert response.status == 403
    assert "?token=" in response.body
    assert "Traceback" not in response.body
    assert response.headers["Cache-Control"] == "no-store"
    if path.split("?", maxsplit=1)[0].endswith(".json"):
        assert json.loads(response.body)["error"].startswith("a token is needed: open the URL nvdash printed")
    assert fetch(server.url + path, {"Authorization": "token wrong"}).status == 403
    assert fetch(server.url + path + ("&" if "?" in path else "?") + "token=wrong").status == 403


def test_a_browser_without_the_token_gets_the_login_form(server: NvdashServer) -> None:
    response = fetch(server.url + "/GPU-Memory?range=6h", {"Accept": "text/html,application/xhtml+xml"})
    assert response.status == 403
    assert '<form method="post" action="/login">' in response.body
    assert 'name="next" value="/GPU-Memory?range=6h"' in response.body
    assert "canvas" not in response.body
    assert "Bokeh" not in response.body


@pytest.mark.parametrize("path", GUARDED)
def test_the_token_opens_every_page_and_route_as_query_or_header(server: NvdashServer, path: str) -> None:
    token = token_of(server)
    expected = ANSWERS.get(path.split("?", maxsplit=1)[0], 200)
    joiner = "&" if "?" in path else "?"
    assert fetch(f"{server.url}{path}{joiner}token={token}").status == expected
    assert fetch(server.url + path, {"Authorization": f"token {token}"}).status == expected
    assert fetch(server.url + path, {"Authorization": f"Bearer {token}"}).status == expected


def test_the_cookie_from_the_first_visit_opens_bookmarks(server: NvdashServer) -> None:
    token = token_of(server)
    first = fetch(f"{server.url}/?token={token}")
    assert first.status == 200
    (morsel,) = first.cookie().values()
    assert morsel.key == f"nvdash-auth-{server.port}"
    assert token not in morsel.value
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Lax"
    assert morsel["path"] == "/"
    assert not morsel["secure"]  # plain HTTP; see the TLS test for Secure
    cookie = {"Cookie": f"{morsel.key}={morsel.value}"}
    for path in ("/index.json", "/GPU-Utilization", "/api/snapshot.json"):
        assert fetch(server.url + path, cookie).status == 200, path
    assert not fetch(server.url + "/index.json", cookie).cookie()  # nothing new to remember
    forged = {"Cookie": f"{morsel.key}={morsel.value[:-1]}{'0' if morsel.value[-1] != '0' else '1'}"}
    assert fetch(server.url + "/index.json", forged).status == 403


def test_the_websocket_needs_the_token_or_the_cookie(server: NvdashServer) -> None:
    token = token_of(server)
    assert websocket(server.port, "/GPU-Utilization") == 403
    assert websocket(server.port, "/GPU-Utilization", {"Cookie": f"nvdash-auth-{server.port}=1.00"}) == 403
    morsel = next(iter(fetch(f"{server.url}/GPU-Utilization?token={token}").cookie().values()))
    assert websocket(server.port, "/GPU-Utilization", {"Cookie": f"{morsel.key}={morsel.value}"}) == 101
    assert websocket(server.port, "/GPU-Utilization", {"Authorization": f"Bearer {token}"}) == 101


def test_a_bokeh_client_connects_with_the_token_and_not_without(server: NvdashServer) -> None:
    with pytest.raises(OSError, match="403"):  # the handshake is refused
        pull_session(url=server.url + "/GPU-Memory")
    session = pull_session(url=server.url + "/GPU-Memory", arguments={"token": token_of(server)})
    try:
        assert session.document.roots
    finally:
        session.close()


def test_the_websocket_accepts_this_machines_addresses_as_origins(server: NvdashServer) -> None:
    addresses = [address for address in interface_addresses() if address != "127.0.0.1"][:3]
    cookie = next(iter(fetch(f"{server.url}/?token={token_of(server)}").cookie().values()))
    headers = {"Cookie": f"{cookie.key}={cookie.value}"}
    for address in ["127.0.0.1", *addresses]:
        origin = f"http://{url_host(address)}:{server.port}"
        assert websocket(server.port, "/GPU-Memory", {**headers, "Origin": origin}) == 101, origin
    assert websocket(server.port, "/GPU-Memory", {**headers, "Origin": f"http://evil.example:{server.port}"}) == 403


def test_the_login_form_sets_the_cookie_and_goes_back(server: NvdashServer) -> None:
    form = {"next": "/GPU-Memory?range=6h", "token": token_of(server)}
    post = {"Content-Type": "application/x-www-form-urlencoded"}
    answer = fetch(server.url + "/login", post, "POST", urllib.parse.urlencode(form))
    assert answer.status == 303
    assert answer.headers["Location"] == "/GPU-Memory?range=6h"
    (morsel,) = answer.cookie().values()
    assert fetch(server.url + "/GPU-Memory?range=6h", {"Cookie": f"{morsel.key}={morsel.value}"}).status == 200

    wrong = fetch(server.url + "/login", post, "POST", urllib.parse.urlencode({**form, "token": "nope"}))
    assert wrong.status == 403
    assert WRONG_TOKEN in wrong.body
    assert not wrong.cookie()
    away = fetch(server.url + "/login", post, "POST", urllib.parse.urlencode({**form, "next": "//evil.example/"}))
    assert (away.status, away.headers["Location"]) == (303, "/")
    assert fetch(server.url + "/login").status == 200


def test_health_tells_a_probe_only_that_it_is_up(server: NvdashServer) -> None:
    anonymous = fetch(server.url + "/health")
    assert (anonymous.status, json.loads(anonymous.body)) == (200, {"status": "ok"})
    details = json.loads(fetch(server.url + "/health", {"Authorization": f"token {token_of(server)}"}).body)
    assert details["status"] == "ok"
    assert details["sampler"]["interval_s"] == 0.25
    assert details["event_loop"]["ticks"] > 0


def test_health_since_reports_the_longest_stall_after_an_earlier_answer(server: NvdashServer) -> None:
    auth = {"Authorization": f"token {token_of(server)}"}

    def event_loop(query: str = "") -> dict[str, float]:
        answer: dict[str, float] = json.loads(fetch(server.url + "/health" + query, auth).body)["event_loop"]
        return answer

    first = event_loop()
    since = f"?since={first['at']!r}"
    later = wait_for(lambda: event_loop(since), lambda loop: loop["ticks"] > first["ticks"])
    assert later["since"] == first["at"]
    assert 0 <= later["max_lag_since_ms"] <= later["max_lag_ms"]
    assert event_loop(since)["max_lag_since_ms"] >= later["max_lag_since_ms"]  # asking reset nothing
    bad = fetch(server.url + "/health?since=soon", auth)
    assert bad.status == 400
    assert json.loads(bad.body) == {"error": "since must be an earlier answer's event_loop.at (a number), not 'soon'"}


def test_metrics_takes_the_dashboard_token_as_a_bearer_token(server: NvdashServer) -> None:
    refused = fetch(server.url + "/metrics")
    assert refused.status == 401
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    scrape = fetch(server.url + "/metrics", {"Authorization": f"Bearer {token_of(server)}"})
    assert scrape.status == 200
    assert "DCGM_FI_DEV_GPU_UTIL{" in scrape.body


def test_static_files_stay_open(server: NvdashServer) -> None:
    page = fetch(f"{server.url}/GPU-Utilization?token={token_of(server)}").body
    script = re.search(r'src="(/static/js/bokeh[^"]*\.js[^"]*)"', page)
    assert script, page[:2000]
    assert fetch(server.url + script.group(1)).status == 200


def test_a_given_token_is_required_on_loopback_too() -> None:
    with nvdash_server(["--simulate", "t4", "--no-history"], env={"NVDASH_TOKEN": "team-s3cret"}) as running:
        assert printed_url(running) == f"http://localhost:{running.port}/?token=team-s3cret"
        assert fetch(running.url + "/index.json").status == 403
        assert fetch(running.url + "/index.json", {"Authorization": "token team-s3cret"}).status == 200


def test_under_a_prefix_the_form_and_the_cookie_stay_under_it() -> None:
    with nvdash_server(["--simulate", "t4", "--no-history", "--token", "t0k"], prefix="/nvdash") as running:
        assert printed_url(running) == f"http://localhost:{running.port}/nvdash/?token=t0k"
        refused = fetch(running.url + "/GPU-Memory", {"Accept": "text/html"})
        assert '<form method="post" action="/nvdash/login">' in refused.body
        answer = fetch(running.url + "/login", {"Content-Type": "application/x-www-form-urlencoded"}, "POST",
                       urllib.parse.urlencode({"token": "t0k", "next": "/nvdash/GPU-Memory"}))
        assert (answer.status, answer.headers["Location"]) == (303, "/nvdash/GPU-Memory")
        (morsel,) = answer.cookie().values()
        assert morsel["path"] == "/nvdash/"
        assert fetch(running.url + "/GPU-Memory", {"Cookie": f"{morsel.key}={morsel.value}"}).status == 200
        assert websocket(running.port, "/nvdash/GPU-Memory", {"Cookie": f"{morsel.key}={morsel.value}"}) == 101


def test_no_token_is_a_logged_choice() -> None:
    with nvdash_server(["--simulate", "t4", "--no-history", "--host", "0.0.0.0", "--no-token"]) as running:
        assert "nvdash: WARNING: --no-token: the dashboards on 0.0.0.0 port" in running.output()
        assert printed_url(running) == f"http://localhost:{running.port}/"
        assert fetch(running.url + "/index.json").status == 200
        assert fetch(running.url + "/metrics").status == 200
        assert websocket(running.port, "/GPU-Memory") == 101


# --- TLS -----------------------------------------------------------------------------------------------------------


@contextmanager
def tls_server(args: list[str], certificate: Path) -> Iterator[tuple[NvdashServer, ssl.SSLContext]]:
    """``python -m nvdash`` serving HTTPS; ready once it answers ``/health`` over TLS with ``certificate``."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed after the process ends
    process = subprocess.Popen([sys.executable, "-m", "nvdash", "--port", str(port), *args], env=nvdash_env(),
                               stdout=log, stderr=subprocess.STDOUT, text=True)
    server = NvdashServer(process, port, "", log)
    context = ssl.create_default_context(cafile=str(certificate))

    def answer() -> int | str:
        if process.poll() is not None:
            raise AssertionError(f"nvdash exited with {process.returncode}: {server.output()}")
        try:
            return fetch(f"https://localhost:{port}/health", context=context).status
        except OSError as error:
            return str(error)

    try:
        wait_for(answer, lambda status: status == 200, timeout_s=40)
        yield server, context
    finally:
        stop_process(process)
        log.close()


def test_tls_serves_https_at_the_printed_url(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    args = ["--simulate", "t4", "--no-history", "--host", "0.0.0.0", "--certfile", str(cert), "--keyfile", str(key)]
    with tls_server(args, cert) as (server, context):
        url = printed_url(server)
        assert url.startswith(f"https://localhost:{server.port}/?token=")
        first = fetch(url, context=context)
        assert first.status == 200
        assert "Tesla T4" in first.body
        (morsel,) = first.cookie().values()
        assert morsel["secure"] is True
        cookie = {"Cookie": f"{morsel.key}={morsel.value}"}
        assert fetch(f"https://localhost:{server.port}/GPU-Memory", cookie, context=context).status == 200
        assert websocket(server.port, "/GPU-Memory", cookie, tls=context) == 101
        assert websocket(server.port, "/GPU-Memory", tls=context) == 403
        with pytest.raises(ConnectionError):  # plain HTTP on the TLS port gets nothing
            fetch(f"http://127.0.0.1:{server.port}/health")


@pytest.mark.parametrize("case", ["missing", "mismatch", "not a certificate"])
def test_an_unusable_certificate_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    cert, key = make_certificate(tmp_path)
    _, other_key = make_certificate(tmp_path, "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("nothing here\n")
    files = {"missing": (str(tmp_path / "absent.crt"), str(key)), "mismatch": (str(cert), str(other_key)),
             "not a certificate": (str(junk), str(key))}[case]
    result = subprocess.run([sys.executable, "-m", "nvdash", "--simulate", "t4", "--port", str(free_port()),
                             "--certfile", files[0], "--keyfile", files[1]],
                            env=nvdash_env(), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nvdash: error: ")
    assert files[0] in lines[0] or files[1] in lines[0]
    assert result.stdout == ""
