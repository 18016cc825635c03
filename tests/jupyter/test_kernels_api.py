"""nvdash's Jupyter server extension in a real JupyterLab: the kernels file and ``GET <base_url>api/nvdash/kernels``.

Two real kernels are started through Jupyter's REST API (two notebooks), and one of them starts a child process
(as a data-loader worker would): the API and the kernels file must name both kernels with their notebooks and their
real processes, and the child under its own kernel only.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from nvdash.sampling.jupyter_kernels import (
    JupyterKernel,
    KernelsFileError,
    read_kernels_file,
    to_json,
)
from tests.jupyter.jupyter import JupyterLab, jupyter_lab
from tests.jupyter.kernels import CHILD, PID, api, kernels_api, kernels_file, run_in_kernel, start_session, until

BASE_URL = "/user/alice/"
NOTEBOOKS = ("train/a.ipynb", "eval/b.ipynb")


@dataclass
class Kernels:
    """The lab with two notebooks' kernels, and the child process the first kernel started."""

    lab: JupyterLab
    sessions: dict[str, dict[str, Any]]
    """Jupyter's session model per notebook path."""
    pids: dict[str, int]
    """Each notebook's kernel process, as the kernel itself tells (``os.getpid()``)."""
    child: int

    def kernel_id(self, path: str) -> str:
        return str(self.sessions[path]["kernel"]["id"])


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


@pytest.fixture(scope="module")
def kernels() -> Iterator[Kernels]:
    with jupyter_lab(env={"NVDASH_SIMULATE": "dgx-h100"}, base_url=BASE_URL) as lab:
        sessions = {path: start_session(lab, path) for path in NOTEBOOKS}
        ids = {path: str(session["kernel"]["id"]) for path, session in sessions.items()}
        pids = {path: int(run_in_kernel(lab, kernel_id, PID)) for path, kernel_id in ids.items()}
        child = int(run_in_kernel(lab, ids[NOTEBOOKS[0]], CHILD))
        try:
            yield Kernels(lab, sessions, pids, child)
        finally:
            with suppress(ProcessLookupError, FileNotFoundError):
                if b"time.sleep(600)" in b" ".join(cmdline(child)):
                    os.kill(child, signal.SIGKILL)


def idle_kernels(lab: JupyterLab, count: int) -> dict[str, Any] | None:
    """The API's answer once it lists ``count`` kernels, all idle."""
    document = kernels_api(lab)
    states = [kernel["execution_state"] for kernel in document["kernels"]]
    return document if states == ["idle"] * count else None


def test_api_lists_the_kernels_notebooks_processes_and_the_childs_kernel(kernels: Kernels) -> None:
    lab = kernels.lab
    document = until("both kernels idle", lambda: idle_kernels(lab, 2))
    assert document["version"] == 1
    server = document["server"]
    assert (server["pid"], server["base_url"]) == (lab.process.pid, BASE_URL)
    by_id = {kernel["id"]: kernel for kernel in document["kernels"]}
    assert sorted(by_id) == sorted(kernels.kernel_id(path) for path in NOTEBOOKS)
    for path in NOTEBOOKS:
        kernel = by_id[kernels.kernel_id(path)]
        assert kernel["sessions"] == [{"path": path, "name": Path(path).name, "type": "notebook"}]
        assert (kernel["name"], kernel["local"]) == ("python3", True)
        assert kernel["pid"] == kernels.pids[path]
        assert b"ipykernel_launcher" in cmdline(kernel["pid"])
        assert kernel["started_s"] == psutil.Process(kernel["pid"]).create_time()
    first, second = by_id[kernels.kernel_id(NOTEBOOKS[0])], by_id[kernels.kernel_id(NOTEBOOKS[1])]
    assert first["pid"] != second["pid"]
    assert kernels.child in first["descendants"]
    assert kernels.child not in second["descendants"]


def test_kernels_file_says_the_same_as_the_api(kernels: Kernels) -> None:
    lab = kernels.lab
    path = kernels_file(lab)
    assert path.stat().st_mode & 0o777 == 0o600

    def same() -> tuple[dict[str, Any], dict[str, Any]] | None:
        document = until("both kernels idle", lambda: idle_kernels(lab, 2))
        for kernel in document["kernels"]:
            del kernel["descendants"]
        try:
            written = to_json(read_kernels_file(path))
        except KernelsFileError:
            return None
        matches = written["kernels"] == document["kernels"] and written["server"] == document["server"]
        return (written, document) if matches else None

    written, _ = until(f"the kernels file {path} lists what the API lists", same)
    assert [kernel["sessions"][0]["path"] for kernel in written["kernels"]] == list(NOTEBOOKS)


def test_a_restarted_kernel_renamed_session_and_deleted_session_reach_the_kernels_file(kernels: Kernels) -> None:
    lab = kernels.lab
    path = kernels_file(lab)
    session = start_session(lab, "scratch.ipynb")
    kernel_id = str(session["kernel"]["id"])

    def listed() -> dict[str, JupyterKernel]:
        with suppress(KernelsFileError):
            return {kernel.id: kernel for kernel in read_kernels_file(path).kernels}
        return {}

    first = until("the new kernel is in the file", lambda: listed().get(kernel_id))
    status, body = api(lab, "POST", f"api/kernels/{kernel_id}/restart")
    assert status == 200, body
    restarted = until("the restarted kernel's new process is in the file",
                      lambda: kernel if (kernel := listed().get(kernel_id)) and kernel.pid != first.pid else None)
    assert restarted.pid is not None
    assert b"ipykernel_launcher" in cmdline(restarted.pid)
    status, body = api(lab, "PATCH", f"api/sessions/{session['id']}", {"path": "renamed.ipynb", "name": "renamed"})
    assert status == 200, body
    until("the renamed session is in the file",
          lambda: True if [s.path for s in listed()[kernel_id].sessions] == ["renamed.ipynb"] else None)
    status, body = api(lab, "DELETE", f"api/sessions/{session['id']}")
    assert status == 204, body
    until("the deleted kernel leaves the file", lambda: True if kernel_id not in listed() else None)
    assert sorted(listed()) == sorted(kernels.kernel_id(path) for path in NOTEBOOKS)


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["no-token", "wrong-token"])
def test_the_api_refuses_without_jupyters_token_and_tells_nothing(kernels: Kernels, token: str | None) -> None:
    status, body = api(kernels.lab, "GET", "api/nvdash/kernels", token=token)
    assert status in (401, 403)
    for path in NOTEBOOKS:
        assert kernels.kernel_id(path) not in body
        assert path not in body


def test_the_proxied_nvdash_is_told_the_kernels_file(kernels: Kernels) -> None:
    lab = kernels.lab
    status, body = api(lab, "GET", "nvdash/")  # Jupyter starts nvdash on the first request; it takes the option
    assert status == 200, body
    pids = until("Jupyter started nvdash", lambda: lab.nvdash_pids() or None)
    arguments = cmdline(pids[0])
    index = arguments.index(b"--jupyter-kernels")
    assert arguments[index + 1] == os.fsencode(kernels_file(lab))


def test_at_root_the_file_starts_empty_reading_needs_the_kernels_permission_and_stop_removes_it() -> None:
    authorizer = "--ServerApp.authorizer_class=tests.jupyter.authorizers.NoKernels"
    with jupyter_lab(extra_args=(authorizer,)) as lab:
        path = kernels_file(lab)
        written = read_kernels_file(path)
        assert (written.kernels, written.server.pid, written.server.base_url) == ((), lab.process.pid, "/")
        assert path.stat().st_mode & 0o777 == 0o600
        session = start_session(lab, "allowed.ipynb")  # the session API is not the kernels resource
        assert api(lab, "GET", "api/status")[0] == 200
        status, body = api(lab, "GET", "api/nvdash/kernels")
        assert status == 403
        assert str(session["kernel"]["id"]) not in body
        lab.process.send_signal(signal.SIGTERM)
        lab.process.wait(30)
        assert not path.exists(), lab.output()
        result = subprocess.run(
            [sys.executable, "-m", "jupyter", "server", "extension", "list"],
            env=lab.env(), capture_output=True, text=True, timeout=60, check=True,
        )
        listing = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
        assert "nvdash.jupyter enabled" in listing, listing
