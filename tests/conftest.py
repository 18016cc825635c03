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

import pytest

SERIAL = {
    "tests/server/test_slow_clients.py": "compares a viewer's update rate with and without stuck viewers, and RSS",
    "tests/server/test_churn.py": "paces 1,000 websockets on Bokeh's discard timer and compares RSS before and after",
    "tests/server/test_shared_sampler.py": "counts NVML calls per sweep with ten viewers on every dashboard",
    "tests/server/test_staleness.py": "a sampler late on a loaded machine is what it detects",
    "tests/server/test_metrics_endpoint.py::test_metrics_for_every_gpu_in_dcgm_exporters_names":
        "counts NVML calls over twenty scrapes",
    "tests/server/test_accounting_e2e.py": "the real sampler at 0.25 s: a read a loaded machine makes late is left out",
    "tests/unit/test_nvml_source.py": "a sweep with a slow or hung read ends within a bound of wall-clock seconds",
    "tests/unit/test_host_processes.py::test_busy_child_reads_above_half_a_core": "reads a busy child's CPU share",
    "tests/unit/test_podresources.py::test_deadline": "a call ends within a bound of wall-clock seconds",
    "tests/unit/test_fake_nvml_health.py::test_wait_blocks_until_its_timeout": "a wait ends within wall-clock bounds",
    "tests/unit/test_fake_nvml_health.py::test_wait_returns_an_event_that_happens_while_it_waits":
        "a wait ends within a bound of wall-clock seconds",
    "tests/unit/test_fake_nvml_health.py::test_real_time_wait_sleeps_until_a_scheduled_event":
        "a wait ends within wall-clock bounds",
    "tests/unit/test_fake_nvml_health.py::test_free_wakes_a_waiting_thread": "a wait ends within a bound of seconds",
    "tests/unit/test_nvml_depth.py::test_xid_events_arrive_on_their_own_thread":
        "closing ends within a bound of wall-clock seconds",
}
"""Tests that run alone (marked ``serial``), by file or test, and why: they measure time, memory or counts in a
window, or load the machine themselves. ``scripts/test.sh`` runs the rest in parallel first. A test can also carry
``@pytest.mark.serial`` itself."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SERIAL` ``serial``."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        test = item.nodeid.split("[", 1)[0]
        if path in SERIAL or test in SERIAL:
            item.add_marker(pytest.mark.serial)


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


PORT_TAKEN = "is already in use"
"""What nvdash prints when its port was taken: between :func:`free_port` and the server's bind, another test run in
parallel (or any program) may take the same port."""


@contextmanager
def nvdash_server(
    args: Sequence[str] = ("--simulate", "dgx-h100"),
    env: Mapping[str, str] | None = None,
    prefix: str = "",
    startup_timeout_s: float = 40.0,
) -> Iterator[NvdashServer]:
    """Start ``python -m nvdash`` on a free port, wait until it answers, stop it afterwards (on another free port,
    up to twice more, if the port was taken before the server bound it)."""
    for attempt in range(3):
        server = _start_nvdash(args, env, prefix, startup_timeout_s)
        if server is not None:
            break
        if attempt == 2:
            raise AssertionError("nvdash found its free port taken three times in a row")
    assert server is not None
    try:
        yield server
    finally:
        stop_process(server.process)
        server.log.close()


def _start_nvdash(
    args: Sequence[str], env: Mapping[str, str] | None, prefix: str, startup_timeout_s: float
) -> NvdashServer | None:
    """A started server that answers ``/health``, or None where its port was taken before it could bind it."""
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
                output = server.output()
                if PORT_TAKEN in output:
                    log.close()
                    return None
                raise AssertionError(f"nvdash exited with {process.returncode}: {output}")
            try:
                server.health()
                # Ours, not another server that holds the port: nvdash says where to open it once it listens.
                if f":{port}" in server.output():
                    return server
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise AssertionError(f"nvdash answered but never said it listens on port {port}: {server.output()}")
            time.sleep(0.1)
    except BaseException:
        stop_process(process)
        log.close()
        raise


def stop_process(process: subprocess.Popen[Any]) -> None:
    """Stop a server as an operator would (SIGTERM), killing it if it has not exited within 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
