"""Jupyter's REST API and kernels as tests use them: requests with the lab's token, sessions, code run in a kernel."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jupyter_client.blocking.client import BlockingKernelClient

from nvdash.sampling.jupyter_kernels import kernels_file_path
from tests.conftest import wait_for
from tests.jupyter.jupyter import JupyterLab

T = TypeVar("T")
PID = "import os; print(os.getpid())"
"""Code that prints the kernel's own process id."""
CHILD = "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']).pid)"
"""Code that starts a child process of the kernel (as a data-loader worker is) and prints its process id."""


def api(lab: JupyterLab, method: str, path: str, body: object = None, token: str | None = "") -> tuple[int, str]:
    """``method <base_url><path>`` with the lab's token (``token=None``: none at all); the status and the body."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"token {token or lab.token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(lab.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace")


def until(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0) -> T:
    """``probe()``'s first answer that is not ``None``, polled until ``timeout_s`` (the suite's :func:`wait_for`)."""
    try:
        found: T = wait_for(probe, lambda result: result is not None, timeout_s)
    except AssertionError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None
    return found


def kernels_api(lab: JupyterLab) -> dict[str, Any]:
    status, body = api(lab, "GET", "api/nvdash/kernels")
    assert status == 200, body
    document: dict[str, Any] = json.loads(body)
    return document


def kernels_file(lab: JupyterLab) -> Path:
    return kernels_file_path(lab.home / "runtime", lab.process.pid)


def start_session(lab: JupyterLab, path: str) -> dict[str, Any]:
    model = {"path": path, "name": Path(path).name, "type": "notebook", "kernel": {"name": "python3"}}
    status, body = api(lab, "POST", "api/sessions", model)
    assert status == 201, body
    session: dict[str, Any] = json.loads(body)
    return session


def run_in_kernel(lab: JupyterLab, kernel_id: str, code: str) -> str:
    """What ``code`` printed, run in the kernel through its connection file in Jupyter's runtime folder."""
    client = BlockingKernelClient(connection_file=str(lab.home / "runtime" / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    printed: list[str] = []

    def output(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(code, timeout=60, output_hook=output)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
    return "".join(printed)


