"""Shared test helpers: free ports and a real ``python -m nvdash`` server process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str, dict[str, str]]:
    """Status, body text and headers of a GET, also for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8"), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8"), dict(error.headers)


def get_json(url: str) -> Any:
    status, body, _ = http_get(url)
    assert status == 200, f"{url} answered {status}: {body[:200]}"
    return json.loads(body)


@dataclass
class NvdashServer:
    """A running ``python -m nvdash`` process."""

    process: subprocess.Popen[str]
    port: int
    prefix: str
    log: IO[str]

    def output(self) -> str:
        """Everything the process printed so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def health(self, since: float | None = None) -> Any:
        """``/health``; ``since`` (an earlier answer's ``event_loop.at``) adds the longest loop stall after it."""
        return get_json(self.url + "/health" + ("" if since is None else f"?since={since!r}"))


def wait_for(read: Callable[[], Any], check: Callable[[Any], bool], timeout_s: float = 30.0) -> Any:
    """``read()`` again every 0.2 s until ``check`` accepts it; fails with the last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s; last value: {str(value)[:2000]}")
        time.sleep(0.2)


def nvdash_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a server process: ours, without simulation unless asked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVDASH_") and k != "BOKEH_RESOURCES"}
    env["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="nvdash-data-")
    env.update(extra or {})
    return env


@contextmanager
def nvdash_server(
    args: Sequence[str] = ("--simulate", "dgx-h100"),
    env: Mapping[str, str] | None = None,
    prefix: str = "",
    startup_timeout_s: float = 40.0,
) -> Iterator[NvdashServer]:
    """Start ``python -m nvdash`` on a free port, wait until it answers, stop it afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "nvdash", "--port", str(port), *args]
    if prefix:
        command += ["--prefix", prefix]
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed after the process ends
    process = subprocess.Popen(command, env=nvdash_env(env), stdout=log, stderr=subprocess.STDOUT, text=True)
    server = NvdashServer(process, port, prefix, log)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None:
                raise AssertionError(f"nvdash exited with {process.returncode}: {server.output()}")
            try:
                server.health()
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield server
    finally:
        stop_process(process)
        log.close()


def stop_process(process: subprocess.Popen[Any]) -> None:
    """Stop a server as an operator would (SIGTERM), killing it if it has not exited within 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
