"""The proxied nvdash in a real JupyterLab: a user-only unix socket, restarts, and start failures reported at once.

jupyter-server-proxy starts ``python -m nvdash.server.jupyter_proxy --unix-socket PATH``; nothing of it listens
on TCP, so no other local user can reach it around Jupyter's login.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_server_proxy.unixsock import UnixResolver
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from tests.conftest import wait_for
from tests.jupyter.jupyter import JupyterLab, jupyter_lab
from tests.jupyter.test_proxy import authorized_get, session_token


@pytest.fixture(scope="module")
def lab() -> Iterator[JupyterLab]:
    with jupyter_lab(env={"NVDASH_SIMULATE": "t4"}) as running:
        yield running


def health(lab: JupyterLab) -> tuple[int, dict[str, Any] | str]:
    """``nvdash/health`` through Jupyter: the status and the JSON (or the body's text when it is not JSON)."""
    status, body, _ = authorized_get(lab, "nvdash/health")
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def the_nvdash_process(lab: JupyterLab) -> psutil.Process:
    """The one nvdash process Jupyter started, after a request has started it."""
    pids = wait_for(lab.nvdash_pids, lambda pids: len(pids) == 1, timeout_s=30)
    return psutil.Process(pids[0])


def socket_path(process: psutil.Process) -> Path:
    command = process.cmdline()
    assert "--unix-socket" in command, command
    return Path(command[command.index("--unix-socket") + 1])


def test_nvdash_listens_on_a_user_only_socket_and_on_no_tcp_port(lab: JupyterLab) -> None:
    status, answer = health(lab)
    assert status == 200, answer
    assert isinstance(answer, dict)
    assert answer["status"] == "ok"
    process = the_nvdash_process(lab)
    path = socket_path(process)
    # No TCP socket of the process listens (psutil matches /proc/<pid>/net/tcp{,6} inodes to the process's fds).
    listening = [conn for conn in process.net_connections(kind="inet") if conn.status == psutil.CONN_LISTEN]
    assert listening == []
    assert str(path) in [conn.laddr for conn in process.net_connections(kind="unix")]
    socket_stat = path.stat()
    assert stat.S_ISSOCK(socket_stat.st_mode)
    assert stat.S_IMODE(socket_stat.st_mode) == 0o600
    assert socket_stat.st_uid == os.getuid()
    folder = path.parent.stat()
    assert stat.S_IMODE(folder.st_mode) == 0o700
    assert folder.st_uid == os.getuid()
    assert f"nvdash: listening on unix socket {path} (this user only), serving /nvdash/" in lab.output()


async def websocket_status(path: Path, origin: str, token: str) -> int:
    """Open a dashboard's websocket straight on nvdash's socket, as a client with ``origin``."""
    request = HTTPRequest(
        "ws://localhost/nvdash/GPU-Utilization/ws", headers={"Origin": origin}, connect_timeout=30, request_timeout=30
    )
    try:
        connection = await websocket_connect(request, subprotocols=["bokeh", token], resolver=UnixResolver(str(path)))
    except HTTPClientError as error:
        return error.code
    connection.close()
    return 101


def test_nvdash_on_the_socket_still_checks_the_websocket_origin(lab: JupyterLab) -> None:
    status, page, _ = authorized_get(lab, "nvdash/GPU-Utilization")
    assert status == 200
    token = session_token(page)
    path = socket_path(the_nvdash_process(lab))
    loop = IOLoop.current()
    assert loop.run_sync(lambda: websocket_status(path, "http://evil.example", token), timeout=30) == 403
    assert loop.run_sync(lambda: websocket_status(path, f"http://127.0.0.1:{lab.port}", token), timeout=30) == 403
    # The Origin the proxy presents is nvdash's own address on the socket.
    assert loop.run_sync(lambda: websocket_status(path, "http://localhost", token), timeout=30) == 101


def test_every_request_through_a_restart_after_sigterm_is_answered(lab: JupyterLab) -> None:
    status, before = health(lab)
    assert status == 200
    assert isinstance(before, dict)
    process = the_nvdash_process(lab)
    process.send_signal(signal.SIGTERM)
    # Asked at once and again until a fresh nvdash answers: not one request may fail meanwhile.
    asked = 0
    deadline = time.monotonic() + 60
    while True:
        status, after = health(lab)
        asked += 1
        assert status == 200, f"request {asked} after the SIGTERM: {status} {after}"
        assert isinstance(after, dict)
        if after["started_at"] != before["started_at"]:
            break
        assert time.monotonic() < deadline, "no fresh nvdash answered"
        time.sleep(0.02)
    assert after["status"] == "ok"
    print(f"{asked} requests through the restart, all answered")
    # Restarted in place: the same process, one nvdash, listening on the same socket.
    assert lab.nvdash_pids() == [process.pid]
    assert health(lab)[0] == 200


def test_jupyter_shutting_down_ends_nvdash_for_good() -> None:
    with jupyter_lab(env={"NVDASH_SIMULATE": "t4"}) as lab:
        assert health(lab)[0] == 200
        process = the_nvdash_process(lab)
        # Jupyter passes its SIGTERM on to nvdash and exits; nvdash, restarting, must notice and stop.
        lab.process.send_signal(signal.SIGTERM)
        lab.process.wait(30)

        def gone() -> bool:
            try:
                return process.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_for(gone, bool, timeout_s=30)


def test_a_configuration_nvdash_rejects_is_reported_at_once_with_its_message() -> None:
    with jupyter_lab(env={"NVDASH_SIMULATE": "nope"}) as lab:
        started = time.monotonic()
        status, body, headers = authorized_get(lab, "nvdash/index.json")
        elapsed_s = time.monotonic() - started
        message = "nvdash: error: unknown profile 'nope'; choose one of: "
        assert status == 500
        assert body.startswith(message), body
        assert headers["Content-Type"].startswith("text/plain")
        assert elapsed_s < 10, f"reported after {elapsed_s:.1f} s"  # a deadline only: the start timeout is 30 s
        print(f"start failure reported after {elapsed_s:.2f} s")
        # The process waits, answering every request with the message, rather than being restarted in a loop.
        first = the_nvdash_process(lab)
        status, again, _ = authorized_get(lab, "nvdash/GPU-Utilization")
        assert (status, again) == (500, body)
        assert the_nvdash_process(lab).pid == first.pid
        assert message in lab.output()
