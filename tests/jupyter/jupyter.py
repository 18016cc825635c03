"""A real ``jupyter lab`` for tests: temporary config, data and runtime folders, a free port, a token."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.conftest import free_port, http_get, nvdash_env

NOTEBOOK = {
    "cells": [
        {
            "cell_type": "markdown",
            "metadata": {},
            "source": ["# Training run\n", "The GPU dashboards on the right show how busy the GPUs are."],
        },
        {
            "cell_type": "code",
            "execution_count": 1,
            "metadata": {},
            "outputs": [],
            "source": [
                "import torch\n",
                "model = build_model().cuda()\n",
                "for epoch in range(10):\n",
                "    train_one_epoch(model, loader, optimizer)",
            ],
        },
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@dataclass
class JupyterLab:
    """A running JupyterLab and what a test needs to reach it."""

    process: subprocess.Popen[str]
    port: int
    base_url: str
    token: str
    home: Path
    log: IO[str]

    @property
    def url(self) -> str:
        """The server's root URL, ending in ``/``."""
        return f"http://127.0.0.1:{self.port}{self.base_url}"

    def output(self) -> str:
        """Everything Jupyter (and the nvdash process it started) printed so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def env(self) -> dict[str, str]:
        """The environment of a ``jupyter`` command that should see this server's config and data."""
        return jupyter_env(self.home)

    def nvdash_pids(self) -> list[int]:
        """The nvdash processes Jupyter started (children of the Jupyter process running ``-m nvdash...``)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            module = cmdline[cmdline.index(b"-m") + 1] if b"-m" in cmdline[:-1] else b""
            if parent == self.process.pid and (module == b"nvdash" or module.startswith(b"nvdash.")):
                pids.append(int(entry.name))
        return pids


def jupyter_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Jupyter's folders in ``home``, nothing of the user's; no nvdash settings unless given."""
    env = nvdash_env(extra)
    for name in ("config", "data", "runtime"):
        (home / name).mkdir(parents=True, exist_ok=True)
    env["JUPYTER_CONFIG_DIR"] = str(home / "config")
    env["JUPYTER_DATA_DIR"] = str(home / "data")
    env["JUPYTER_RUNTIME_DIR"] = str(home / "runtime")
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTERLAB_SETTINGS_DIR", None)
    env.pop("JUPYTERLAB_WORKSPACES_DIR", None)
    return env


@contextmanager
def jupyter_lab(
    env: Mapping[str, str] | None = None,
    base_url: str = "/",
    extra_args: tuple[str, ...] = (),
    startup_timeout_s: float = 60.0,
) -> Iterator[JupyterLab]:
    """Start ``jupyter lab`` with a token on a free port; stop it and everything it started afterwards."""
    with tempfile.TemporaryDirectory(prefix="nvdash-jupyter-") as folder:
        home = Path(folder)
        root = home / "work"
        root.mkdir()
        (root / "training.ipynb").write_text(json.dumps(NOTEBOOK, indent=1))
        labconfig = home / "config" / "labconfig"
        labconfig.mkdir(parents=True)
        # No "get notified about Jupyter news?" toast over the screenshots.
        quiet = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
        (labconfig / "page_config.json").write_text(json.dumps(quiet))
        port = free_port()
        token = secrets.token_hex(16)
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--ServerApp.base_url={base_url}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--ServerApp.open_browser=False",
            "--LabApp.news_url=",
            "--LabServerApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *extra_args,
        ]
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed after the process ends
        process = subprocess.Popen(
            command,
            env=jupyter_env(home, env),
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lab = JupyterLab(process, port, base_url, token, home, log)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while True:
                if process.poll() is not None:
                    raise AssertionError(f"jupyter lab exited with {process.returncode}:\n{lab.output()}")
                with suppress(OSError):
                    status, _, _ = http_get(f"{lab.url}api/status?token={token}", timeout=5)
                    if status == 200:
                        break
                if time.monotonic() > deadline:
                    raise AssertionError(f"jupyter lab did not answer in {startup_timeout_s} s:\n{lab.output()}")
                time.sleep(0.2)
            yield lab
        finally:
            _stop_group(process)
            log.close()


def _stop_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the session Jupyter leads (Jupyter and the nvdash it started), SIGKILL if it lingers."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
    # The nvdash child may outlive Jupyter by a moment; make sure nothing of the group is left.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
