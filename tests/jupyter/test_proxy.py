"""A real JupyterLab with a token: the extension is installed, and Jupyter proxies a simulated nvdash.

Runs once at the root base URL and once under ``/lab-here/``: pages, static files and the websocket must all
resolve under ``<base_url>nvdash/``, and nothing is served without Jupyter's token.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from bokeh.util.token import get_token_payload
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import WebSocketClientConnection, websocket_connect

from tests.conftest import http_get
from tests.jupyter.jupyter import JupyterLab, jupyter_lab
from tests.server.test_server import JUPYTER_ROUTES

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module", params=["/", "/lab-here/"], ids=["root", "base-url"])
def lab(request: pytest.FixtureRequest) -> Iterator[JupyterLab]:
    with jupyter_lab(env={"NVDASH_SIMULATE": "dgx-h100"}, base_url=request.param) as running:
        yield running


def authorized_get(lab: JupyterLab, path: str, token: str | None = None) -> tuple[int, str, dict[str, str]]:
    """GET ``<base_url><path>`` with the token in the Authorization header, following no redirect."""
    request = urllib.request.Request(lab.url + path, headers={"Authorization": f"token {token or lab.token}"})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, response.read().decode("utf-8", "replace"), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace"), dict(error.headers)


def login_cookie(lab: JupyterLab) -> str:
    """The ``Cookie`` header a browser sends after opening ``/lab?token=...`` once."""
    opener = urllib.request.build_opener(_NoRedirect)
    with opener.open(f"{lab.url}lab?token={lab.token}", timeout=60) as response:
        cookies = [header.split(";", 1)[0] for header in response.headers.get_all("Set-Cookie") or []]
    assert any(cookie.startswith("username-") for cookie in cookies), cookies
    return "; ".join(cookies)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script" and (src := dict(attrs).get("src")):
            self.sources.append(src)


def test_labextension_is_listed_enabled_and_ok(lab: JupyterLab) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listing = ANSI.sub("", result.stdout + result.stderr)
    line = next((line for line in listing.splitlines() if line.strip().startswith("nvdash ")), None)
    assert line is not None, listing
    assert re.search(r"nvdash v\d+\.\d+\.\d+\s+enabled\s+OK\s+\(python, nvdash\)", line), line


def test_lab_page_loads_the_prebuilt_extension(lab: JupyterLab) -> None:
    status, page, _ = authorized_get(lab, "lab")
    assert status == 200
    match = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    assert match is not None
    config = json.loads(match.group(1))
    federated = {extension["name"]: extension for extension in config["federated_extensions"]}
    assert "nvdash" in federated, sorted(federated)
    entry = federated["nvdash"]
    status, script, headers = authorized_get(lab, f"lab/extensions/nvdash/{entry['load']}")
    assert status == 200
    assert "javascript" in headers["Content-Type"]
    assert "nvdash" in script


def test_index_and_info_json_come_through_the_proxy(lab: JupyterLab) -> None:
    status, body, _ = authorized_get(lab, "nvdash/index.json")
    assert status == 200, body[:300]
    assert json.loads(body) == JUPYTER_ROUTES
    status, body, _ = authorized_get(lab, "nvdash/info.json")
    assert status == 200
    info = json.loads(body)
    assert info["simulated"] == "dgx-h100"
    assert [gpu["index"] for gpu in info["gpus"]] == list(range(8))
    assert {gpu["name"] for gpu in info["gpus"]} == {"NVIDIA H100 80GB HBM3"}


def test_dashboard_page_and_its_static_files_resolve_under_the_proxy(lab: JupyterLab) -> None:
    status, page, _ = authorized_get(lab, "nvdash/GPU-Utilization")
    assert status == 200
    assert "<title>GPU Utilization</title>" in page
    parser = _Scripts()
    parser.feed(page)
    bokeh = [src for src in parser.sources if "/static/js/bokeh.min.js" in src]
    assert bokeh, parser.sources
    assert all(src.startswith(f"{lab.base_url}nvdash/static/") for src in parser.sources), parser.sources
    status, script, headers = authorized_get(lab, bokeh[0][len(lab.base_url) :])
    assert status == 200
    assert "javascript" in headers["Content-Type"]
    assert len(script) > 100_000
    status, index_page, _ = authorized_get(lab, "nvdash/")
    assert status == 200
    assert f'href="{lab.base_url}nvdash/GPU-Memory"' in index_page


def session_token(page: str) -> str:
    match = re.search(r'"token":\s*"([^"]+)"', page) or re.search(r"token&quot;:\s*&quot;([^&]+)&quot;", page)
    assert match is not None, "no Bokeh session token in the page"
    return match.group(1)


async def read_message(connection: WebSocketClientConnection) -> dict[str, Any]:
    """One Bokeh protocol message: header, metadata and content text frames, then its buffers."""
    frames = []
    for _ in range(3):
        frame = await connection.read_message()
        assert frame is not None, "the websocket closed"
        assert isinstance(frame, str)
        frames.append(json.loads(frame))
    header, _metadata, content = frames
    for _ in range(header.get("num_buffers", 0)):  # each a text header, then the bytes
        for _part in range(2):
            assert await connection.read_message() is not None, "the websocket closed"
    return {"msgtype": header["msgtype"], "content": content}


def test_websocket_streams_live_updates_through_the_proxy(lab: JupyterLab) -> None:
    """As a browser does it: Jupyter's login cookie, JupyterLab's own origin, Bokeh's session token."""
    cookie = login_cookie(lab)
    status, page, _ = authorized_get(lab, "nvdash/GPU-Resources?theme=dark")
    assert status == 200
    token = session_token(page)
    payload = get_token_payload(token)
    assert payload["arguments"] == {"theme": [b"dark"]}
    # Jupyter's token and login cookie must not be copied into the page.
    assert payload["headers"] == {}
    assert payload["cookies"] == {}

    async def converse() -> list[str]:
        request = HTTPRequest(
            f"ws://127.0.0.1:{lab.port}{lab.base_url}nvdash/GPU-Resources/ws",
            headers={"Cookie": cookie, "Origin": f"http://127.0.0.1:{lab.port}"},
            connect_timeout=30,
            request_timeout=30,
        )
        connection = await websocket_connect(request, subprotocols=["bokeh", token])
        try:
            kinds = [(await read_message(connection))["msgtype"]]
            for frame in ({"msgid": "1", "msgtype": "PULL-DOC-REQ"}, {}, {}):
                await connection.write_message(json.dumps(frame))
            # The server may push patches (a page built in stages, live rows) before it answers the pull.
            while True:
                reply = await read_message(connection)
                kinds.append(reply["msgtype"])
                if reply["msgtype"] != "PATCH-DOC":
                    break
            assert reply["content"]["doc"]["title"] == "GPU Resources"
            kinds.append((await read_message(connection))["msgtype"])
            return kinds
        finally:
            connection.close()

    kinds = IOLoop.current().run_sync(converse, timeout=30)
    assert kinds[0] == "ACK"
    assert [kind for kind in kinds[1:-1] if kind != "PATCH-DOC"] == ["PULL-DOC-REPLY"]
    assert kinds[-1] == "PATCH-DOC"


async def websocket_status(url: str, headers: dict[str, str]) -> int:
    try:
        connection = await websocket_connect(HTTPRequest(url, headers=headers, connect_timeout=30))
    except HTTPClientError as error:
        return error.code
    connection.close()
    return 101


def test_nothing_is_proxied_without_the_token(lab: JupyterLab) -> None:
    for path in ("nvdash/index.json", "nvdash/GPU-Utilization", "nvdash/static/js/bokeh.min.js", "nvdash/health"):
        status, body, headers = http_get(lab.url + path)  # follows the redirect to the login page
        assert status in (200, 302, 403), (path, status)
        for served in ("Bokeh", "GPU Utilization", "sampler"):
            assert served not in body, path
        status, _, headers = authorized_get(lab, path, token="not-the-token")
        assert status in (302, 403), (path, status)
        if status == 302:
            assert "/login" in headers["Location"]
    url = f"ws://127.0.0.1:{lab.port}{lab.base_url}nvdash/GPU-Utilization/ws"
    origin = {"Origin": f"http://127.0.0.1:{lab.port}"}
    assert IOLoop.current().run_sync(lambda: websocket_status(url, origin), timeout=30) == 403


def test_websocket_from_a_foreign_page_is_refused_by_jupyter(lab: JupyterLab) -> None:
    """A page elsewhere, in a browser that holds Jupyter's login cookie, cannot reach the dashboards."""
    url = f"ws://127.0.0.1:{lab.port}{lab.base_url}nvdash/GPU-Utilization/ws"
    headers = {"Cookie": login_cookie(lab), "Origin": "http://evil.example:8888"}
    assert IOLoop.current().run_sync(lambda: websocket_status(url, headers), timeout=30) == 403
