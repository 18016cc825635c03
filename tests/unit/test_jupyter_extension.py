"""nvdash's Jupyter server extension without Jupyter: the kernels file keeper, the process trees, the imports."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvdash.jupyter import _jupyter_server_extension_points
from nvdash.jupyter.handlers import kernels_document
from nvdash.jupyter.keeper import KernelsFileKeeper
from nvdash.jupyter.processes import kernel_descendants, process_parents
from nvdash.sampling.jupyter_kernels import (
    JupyterKernel,
    JupyterKernels,
    JupyterServer,
    KernelSession,
    read_kernels_file,
)

SERVER = JupyterServer(pid=4242, hostname="gpu-07", boot_id=None, base_url="/")
KERNEL = JupyterKernel(id="k1", name="python3", pid=4301, started_s=100.0, local=True, execution_state="idle",
                       sessions=(KernelSession(path="a.ipynb", name="a.ipynb", type="notebook"),))


class Trees:
    """What the keeper's ``build`` answers next: a tree, or an error to raise."""

    def __init__(self) -> None:
        self.next: list[JupyterKernel] | Exception = []
        self.clock = 1000.0

    async def build(self) -> JupyterKernels:
        self.clock += 1
        if isinstance(self.next, Exception):
            raise self.next
        return JupyterKernels(server=SERVER, written_s=self.clock, kernels=tuple(self.next))


def keeper_for(tmp_path: Path, trees: Trees) -> KernelsFileKeeper:
    return KernelsFileKeeper(tmp_path / "runtime", SERVER, trees.build, logging.getLogger("test-keeper"), lambda: 5.0)


def test_the_file_is_written_empty_at_start_then_only_when_the_kernels_change(tmp_path: Path) -> None:
    trees = Trees()
    keeper = keeper_for(tmp_path, trees)
    keeper.write_initial()
    assert keeper.path == tmp_path / "runtime" / "nvdash-kernels-4242.json"
    assert (tmp_path / "runtime").stat().st_mode & 0o777 == 0o700
    assert read_kernels_file(keeper.path) == JupyterKernels(server=SERVER, written_s=5.0)
    assert asyncio.run(keeper.refresh()) is False  # still no kernels: not rewritten
    assert read_kernels_file(keeper.path).written_s == 5.0
    trees.next = [KERNEL]
    assert asyncio.run(keeper.refresh()) is True
    assert read_kernels_file(keeper.path).kernels == (KERNEL,)
    trees.next = [dataclasses.replace(KERNEL, execution_state="busy")]
    assert asyncio.run(keeper.refresh()) is True
    assert read_kernels_file(keeper.path).kernels[0].execution_state == "busy"
    keeper.path.unlink()
    assert asyncio.run(keeper.refresh()) is True  # removed behind its back: written again
    assert read_kernels_file(keeper.path).kernels[0].execution_state == "busy"
    keeper.stop()
    assert not keeper.path.exists()


def test_a_failing_round_logs_one_line_once_and_the_next_round_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trees = Trees()
    keeper = keeper_for(tmp_path, trees)
    keeper.write_initial()
    trees.next = OSError("database is locked\nsecond line")
    with caplog.at_level(logging.INFO, logger="test-keeper"):
        assert asyncio.run(keeper.refresh()) is False
        assert asyncio.run(keeper.refresh()) is False
        trees.next = [KERNEL]
        assert asyncio.run(keeper.refresh()) is True
    assert [record.getMessage() for record in caplog.records] == [
        f"nvdash | cannot update the kernels file {keeper.path}: OSError: database is locked second line",
        f"nvdash | the kernels file {keeper.path} is current again",
    ]
    assert read_kernels_file(keeper.path).kernels == (KERNEL,)


def test_a_tree_the_format_rejects_is_never_written(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trees = Trees()
    keeper = keeper_for(tmp_path, trees)
    keeper.write_initial()
    trees.next = [dataclasses.replace(KERNEL, pid=None)]  # local without a process
    assert asyncio.run(keeper.refresh()) is False
    assert read_kernels_file(keeper.path).kernels == ()
    assert "a local kernel has no pid" in caplog.text


def test_a_process_below_two_kernels_belongs_to_the_nearest() -> None:
    # 10 and 20 are kernels; 20 was started from a process (11) of kernel 10.
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 20: 11, 21: 20, 22: 21, 30: 1}
    assert kernel_descendants([10, 20], parents) == {10: [11, 12], 20: [21, 22]}
    assert kernel_descendants([10], parents) == {10: [11, 12, 20, 21, 22]}
    assert kernel_descendants([30], parents) == {30: []}


def test_the_real_process_table_has_this_process_under_its_parent() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        parents = process_parents()
        assert parents[os.getpid()] == os.getppid()
        assert child.pid in kernel_descendants([os.getpid()], parents)[os.getpid()]
    finally:
        child.communicate(b"")


def test_the_api_document_adds_descendants_to_local_kernels_only() -> None:
    remote = JupyterKernel(id="k2", name="R", pid=None, started_s=None, local=False)
    document = kernels_document(JupyterKernels(server=SERVER, written_s=1.0, kernels=(KERNEL, remote)),
                                {4301: [4377, 4378]})
    assert [(kernel["id"], kernel["pid"], kernel["descendants"]) for kernel in document["kernels"]] == [
        ("k1", 4301, [4377, 4378]), ("k2", None, None)]
    assert json.loads(json.dumps(document)) == document


def test_the_extension_point_and_no_bokeh_nvml_or_server_on_import() -> None:
    assert _jupyter_server_extension_points() == [{"module": "nvdash.jupyter"}]
    code = ("import sys, nvdash.jupyter, nvdash.jupyter.handlers, nvdash.jupyter.keeper, nvdash.jupyter.tree; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('bokeh', 'pynvml') "
            "or m.startswith('nvdash.server')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


class KernelManager:
    """One kernel as jupyter_server's kernel manager holds it: its name, state and provisioner."""

    def __init__(self, name: str, state: str, provisioner: object) -> None:
        self.kernel_name = name
        self.execution_state = state
        self.provisioner = provisioner


class Kernels:
    """The kernel manager's and the session manager's side of jupyter_server (what the tree is built from)."""

    def __init__(self, kernels: dict[str, KernelManager], sessions: list[dict[str, object]]) -> None:
        self.kernels = kernels
        self.sessions = sessions

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    def get_kernel(self, kernel_id: str) -> KernelManager:
        return self.kernels[kernel_id]

    async def list_sessions(self) -> list[dict[str, object]]:
        return self.sessions


def local_provisioner(process: subprocess.Popen[bytes]) -> object:
    """jupyter_client's LocalProvisioner holding ``process`` as if it had launched it."""
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.provisioning.local_provisioner import LocalProvisioner

    provisioner = LocalProvisioner(kernel_id="k", kernel_spec=KernelSpec())
    provisioner.process = process
    provisioner.pid = process.pid
    return provisioner


def test_the_tree_has_local_kernels_processes_and_never_guesses_another_ones() -> None:
    import psutil

    from nvdash.jupyter.tree import build_kernels

    running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    try:
        kernels = Kernels(
            {
                "local": KernelManager("python3", "busy", local_provisioner(running)),
                "ended": KernelManager("python3", "dead", local_provisioner(ended)),
                "gateway": KernelManager("R", "idle", None),
            },
            [
                {"id": "s1", "path": "a.ipynb", "name": "a.ipynb", "type": "notebook", "kernel": {"id": "local"}},
                {"id": "s2", "path": "x", "name": "x", "type": "widget", "kernel": {"id": "local"}},
                {"id": "s3", "path": "b.ipynb", "name": "b.ipynb", "type": "notebook", "kernel": {"id": "gateway"}},
                {"id": "s4", "path": "c.py", "name": "c.py", "type": "console", "kernel": {"id": "local"}},
            ],
        )
        tree = asyncio.run(build_kernels(SERVER, kernels, kernels, clock=lambda: 7.0))
        assert tree == JupyterKernels(server=SERVER, written_s=7.0, kernels=(
            JupyterKernel(id="local", name="python3", pid=running.pid,
                          started_s=psutil.Process(running.pid).create_time(), local=True, execution_state="busy",
                          sessions=(KernelSession("a.ipynb", "a.ipynb", "notebook"),
                                    KernelSession("c.py", "c.py", "console"))),
            JupyterKernel(id="gateway", name="R", pid=None, started_s=None, local=False, execution_state="idle",
                          sessions=(KernelSession("b.ipynb", "b.ipynb", "notebook"),)),
        ))
    finally:
        running.communicate(b"")
