"""``python -m nvdash --unix-socket PATH``: a user-only socket instead of a TCP port, and its one-line errors."""

from __future__ import annotations

import http.client
import json
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from nvdash.server.options import UsageError, parse_settings
from tests.conftest import nvdash_env, wait_for


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self._path))


def get_over_socket(path: Path, url: str) -> tuple[int, str]:
    """Status and body of a GET sent over the unix socket at ``path``; ``(0, reason)`` when nothing answers."""
    connection = _UnixConnection(path)
    try:
        connection.request("GET", url)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8")
    except OSError as error:
        return 0, str(error)
    finally:
        connection.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdash", "--simulate", "t4", "--no-history", *args],
        env=nvdash_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextmanager
def socket_server(path: Path) -> Iterator[subprocess.Popen[str]]:
    """``python -m nvdash --unix-socket path`` until it answers ``/nv/health``; stopped afterwards."""
    command = [sys.executable, "-m", "nvdash", "--simulate", "t4", "--no-history", "--unix-socket", str(path),
               "--prefix", "/nv"]
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(command, env=nvdash_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            def answer() -> tuple[int, str]:
                assert process.poll() is None, f"nvdash exited with {process.returncode}"
                return get_over_socket(path, "/nv/health")

            wait_for(answer, lambda result: result[0] == 200, timeout_s=40)
            yield process
        finally:
            process.terminate()
            process.wait(15)
            log.seek(0)
            output = log.read()
    assert f"nvdash: listening on unix socket {path} (this user only), serving /nv/" in output, output


@pytest.fixture
def folder() -> Iterator[Path]:
    # Short: a unix socket's path must fit in 107 bytes, and pytest's tmp_path can be long.
    with tempfile.TemporaryDirectory(prefix="nvdash-sock-") as name:
        yield Path(name)


def test_serves_on_a_socket_only_this_user_can_use_and_on_no_tcp_port(folder: Path) -> None:
    path = folder / "nvdash.sock"
    with socket_server(path) as process:
        status, body = get_over_socket(path, "/nv/info.json")
        assert status == 200
        info: dict[str, Any] = json.loads(body)
        assert [gpu["name"] for gpu in info["gpus"]] == ["Tesla T4"]
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        connections = psutil.Process(process.pid).net_connections(kind="inet")
        assert [conn for conn in connections if conn.status == psutil.CONN_LISTEN] == []
        # A second server on the same path is refused, not allowed to take the first one's socket over.
        result = run_cli("--unix-socket", str(path))
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            f"nvdash: error: cannot listen on unix socket {path}: another server is listening on it"
        ]
        assert get_over_socket(path, "/nv/health")[0] == 200


def test_a_stale_socket_file_is_replaced(folder: Path) -> None:
    path = folder / "nvdash.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))
    assert stat.S_ISSOCK(path.stat().st_mode)
    with socket_server(path):
        assert get_over_socket(path, "/nv/index.json")[0] == 200


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("missing/nvdash.sock", "No such file or directory"),
        ("a-file", "a file that is not a socket is in the way"),
        ("x" * 120, "AF_UNIX path too long"),
    ],
)
def test_a_path_that_cannot_be_bound_is_one_line(folder: Path, name: str, reason: str) -> None:
    (folder / "a-file").write_text("not a socket\n")
    path = folder / name
    result = run_cli("--unix-socket", str(path))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"nvdash: error: cannot listen on unix socket {path}: {reason}"]
    assert (folder / "a-file").read_text() == "not a socket\n"


NO_FILE = "nvdash: error: --unix-socket needs a file path (not an abstract socket, which no file permission protects)"


def test_an_empty_socket_path_is_a_usage_error() -> None:
    result = run_cli("--unix-socket", "")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [NO_FILE]


def test_an_abstract_socket_is_refused() -> None:
    # A command line cannot carry a NUL; the Jupyter proxy or a wrapper could pass it to the parser.
    with pytest.raises(UsageError) as raised:
        parse_settings(["--unix-socket", "\0nvdash"], {})
    assert f"nvdash: error: {raised.value}" == NO_FILE
