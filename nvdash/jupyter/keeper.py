"""Keeps the kernels file current while the Jupyter server runs.

Every :data:`REFRESH_MS` the kernel tree is rebuilt on Jupyter's event loop; the file is rewritten (atomically,
mode 0600) only when the tree changed: a kernel started, stopped or restarted (a new process id), a session
opened, renamed or closed, an execution state (or the file was removed). It is written once at start, with no
kernels yet, so that nvdash tells "no kernels" from "not written yet", and removed when the server stops.

A round that fails (the session database, the file system) logs one line, only when the failure is new, and the
next round tries again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from jupyter_core.utils import ensure_dir_exists
from tornado.ioloop import PeriodicCallback

from nvdash.sampling.jupyter_kernels import (
    JupyterKernels,
    JupyterServer,
    kernels_file_path,
    parse_kernels,
    to_json,
    write_kernels_file,
)

REFRESH_MS = 1000.0


class KernelsFileKeeper:
    """Writes ``build()``'s tree to the kernels file of the server ``server.pid`` in ``runtime_dir``."""

    def __init__(
        self,
        runtime_dir: str | os.PathLike[str],
        server: JupyterServer,
        build: Callable[[], Awaitable[JupyterKernels]],
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
        clock: Callable[[], float],
    ) -> None:
        self.runtime_dir = Path(runtime_dir)
        self.path = kernels_file_path(self.runtime_dir, server.pid)
        self._server = server
        self._build = build
        self._log = log
        self._clock = clock
        self._written: JupyterKernels | None = None
        self._failure: str | None = None
        self._callback: PeriodicCallback | None = None

    def write_initial(self) -> None:
        """Write the file with no kernels (the server has none yet); raises OSError when that is impossible."""
        ensure_dir_exists(self.runtime_dir, mode=0o700)
        self._write(JupyterKernels(server=self._server, written_s=self._clock()))

    def start(self, interval_ms: float = REFRESH_MS) -> None:
        """Refresh the file every ``interval_ms`` on the current event loop."""
        self._callback = PeriodicCallback(self.refresh, interval_ms)
        self._callback.start()

    async def refresh(self) -> bool:
        """One round: rebuild the tree and rewrite the file when it changed; True when it was written."""
        try:
            kernels = await self._build()
            unchanged = self._written is not None and _unstamped(kernels) == _unstamped(self._written)
            if unchanged and self.path.exists():
                self._recovered()
                return False
            parse_kernels(to_json(kernels))  # never write a file nvdash would reject
            self._write(kernels)
        except Exception as error:  # one line per new failure, then the next round
            message = " ".join(f"{type(error).__name__}: {error}".split())
            if message != self._failure:
                self._log.warning("nvdash | cannot update the kernels file %s: %s", self.path, message)
            self._failure = message
            return False
        self._recovered()
        return True

    def stop(self) -> None:
        """Stop refreshing and remove the file (nvdash then reads "not written": the server is gone)."""
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        try:
            self.path.unlink(missing_ok=True)
        except OSError as error:
            self._log.warning("nvdash | cannot remove the kernels file %s: %s", self.path, error.strerror or error)

    def _write(self, kernels: JupyterKernels) -> None:
        write_kernels_file(self.path, kernels)
        self._written = kernels

    def _recovered(self) -> None:
        if self._failure is not None:
            self._log.info("nvdash | the kernels file %s is current again", self.path)
            self._failure = None


def _unstamped(kernels: JupyterKernels) -> JupyterKernels:
    return dataclasses.replace(kernels, written_s=0.0)
