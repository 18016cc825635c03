"""``/api/notebooks.json`` on a real server: real "kernel" processes (python, one with a child) listed by the
simulated NVML on GPU 0, a kernels file written as the Jupyter server writes it, and the join served as JSON.

Kernel 1 and its child do work on GPU 0; kernel 2 holds memory and does none. The server's answer gives each
kernel exactly its processes' memory, kernel 1 a positive 1-minute SM mean and kernel 2 an idle time; a kernel the
file no longer names is gone from the answer at the next reading.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nvdash.sampling.fake.profiles import gpu_uuid
from nvdash.sampling.jupyter_kernels import (
    JupyterKernel,
    JupyterKernels,
    JupyterServer,
    KernelSession,
    read_boot_id,
    write_kernels_file,
)
from tests.conftest import get_json, http_get, nvdash_server, wait_for
from tests.server.test_auth import fetch

MIB = 1 << 20
PROFILE = "dgx-h100"
KERNEL_MIB, CHILD_MIB, IDLE_MIB = 1000, 500, 2000
TOKEN = "notebooks-secret"
CHILD = "import time; time.sleep(600)"
KERNEL = (
    "import subprocess, sys, time\n"
    f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def kernels() -> Iterator[tuple[int, int, int]]:
    """Two real "kernels" (python sleeping): the first with a python child. Their PIDs: kernel 1, its child,
    kernel 2."""
    first = subprocess.Popen([sys.executable, "-c", KERNEL], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    second = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        assert first.stdout is not None
        child = int(first.stdout.readline())
        yield first.pid, child, second.pid
    finally:
        for process in (first, second):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def kernel(number: int, pid: int, path: str) -> JupyterKernel:
    return JupyterKernel(id=f"kernel-{number}", name="python3", pid=pid, started_s=psutil.Process(pid).create_time(),
                         local=True, execution_state="idle",
                         sessions=(KernelSession(path, path.rsplit("/", 1)[-1], "notebook"),))


def write(path: Path, *listed: JupyterKernel) -> None:
    server = JupyterServer(os.getpid(), os.uname().nodename, read_boot_id(), "/user/alice/")
    write_kernels_file(path, JupyterKernels(server, 1.0, listed))


def notebooks(url: str) -> Any:
    return get_json(f"{url}/api/notebooks.json?token={urllib.parse.quote(TOKEN)}")


def test_notebooks_json_joins_real_kernels_to_the_gpu_processes(tmp_path: Path,
                                                                 kernels: tuple[int, int, int]) -> None:
    first, child, second = kernels
    path = tmp_path / "nvdash-kernels-1.json"
    write(path, kernel(1, first, "train/a.ipynb"), kernel(2, second, "eval/b.ipynb"))
    listed = ";".join([f"process:0:{first}:0.4:{KERNEL_MIB}", f"process:0:{child}:0.3:{CHILD_MIB}",
                       f"process:0:{second}:0:{IDLE_MIB}"])
    args = ["--simulate", PROFILE, "--interval", "0.25", "--process-interval", "0.5", "--no-history",
            "--token", TOKEN, "--jupyter-kernels", str(path)]
    with nvdash_server(args, env={"NVDASH_FAKE_FAULTS": f"clear_processes:0;{listed}"}) as server:
        assert fetch(server.url + "/api/notebooks.json").status == 403  # guarded as /api/processes.json is

        def settled(document: Any) -> bool:
            uses = {k["id"]: k for k in document["kernels"]}
            return (document["state"] == "ok" and len(uses) == 2 and bool(uses["kernel-1"]["sm_pct_1min"])
                    and uses["kernel-2"]["idle_since"] is not None)

        document = wait_for(lambda: notebooks(server.url), settled)
        assert document["reason"] is None
        assert document["base_url"] == "/user/alice/"
        assert document["memory_bytes"] == (KERNEL_MIB + CHILD_MIB + IDLE_MIB) * MIB
        busy, idle = document["kernels"]
        assert (busy["id"], busy["title"], busy["pid"], busy["local"]) == ("kernel-1", "train/a.ipynb", first, True)
        assert busy["sessions"] == [{"path": "train/a.ipynb", "name": "a.ipynb", "type": "notebook"}]
        assert busy["memory_bytes"] == (KERNEL_MIB + CHILD_MIB) * MIB
        assert [(g["index"], g["uuid"], g["mig_uuid"], g["memory_bytes"], g["pids"]) for g in busy["gpus"]] == [
            (0, gpu_uuid(PROFILE, 0, 0), None, (KERNEL_MIB + CHILD_MIB) * MIB, sorted([first, child]))]
        assert busy["pids"] == sorted([first, child])
        assert busy["sm_pct_1min"] > 0
        assert busy["holding_since"] is not None
        assert (idle["id"], idle["memory_bytes"], idle["pids"]) == ("kernel-2", IDLE_MIB * MIB, [second])
        assert [(g["index"], g["memory_bytes"], g["sm_pct"]) for g in idle["gpus"]] == [(0, IDLE_MIB * MIB, 0.0)]
        assert idle["sm_pct"] == 0.0
        assert idle["sm_pct_1min"] == 0.0
        assert idle["idle_since"] <= document["time"]
        assert idle["idle_s"] == document["time"] - idle["idle_since"]

        write(path, kernel(1, first, "train/a.ipynb"))
        after = wait_for(lambda: notebooks(server.url), lambda d: [k["id"] for k in d["kernels"]] == ["kernel-1"])
        assert after["state"] == "ok"
        assert after["memory_bytes"] == (KERNEL_MIB + CHILD_MIB) * MIB


def test_notebooks_json_without_process_readings_says_so(tmp_path: Path) -> None:
    args = ["--simulate", PROFILE, "--process-interval", "0", "--no-history",
            "--jupyter-kernels", str(tmp_path / "kernels.json")]
    with nvdash_server(args) as server:
        document = get_json(server.url + "/api/notebooks.json")
    assert document["state"] == "no_processes"
    assert document["reason"].startswith("nvdash does not read the GPU processes (--process-interval 0)")
    assert (document["kernels"], document["memory_bytes"]) == ([], None)


def test_notebooks_json_is_404_without_jupyter_kernels() -> None:
    with nvdash_server(["--simulate", PROFILE, "--no-history"]) as server:
        status, body, headers = http_get(server.url + "/api/notebooks.json")
    assert status == 404
    assert headers["Content-Type"] == "application/json"
    assert body.count("\n") == 0
    assert body == ('{"error": "nvdash was not started with --jupyter-kernels (by a Jupyter server), so it knows no '
                    'notebooks."}')
