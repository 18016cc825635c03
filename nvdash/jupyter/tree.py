"""This Jupyter server's kernels as the kernels file records them (:class:`JupyterKernels`).

Built from the server's kernel manager (kernel ids, kernel names, execution states, processes) and session manager
(the notebooks, consoles and files each kernel serves).

A kernel is ``local`` only when jupyter_client's :class:`LocalProvisioner` (or a subclass) launched it here: its
process id is the one of the ``Popen`` the provisioner holds. Any other provisioner (a remote provisioner, a
gateway's kernels) gives ``local: false`` with no process id: not on this machine, never guessed. A local kernel
between two processes (restarting) or whose process has ended is left out of this round: the next one lists it
again with its new process, and the old process id, which the host may already have given another process, is
never written.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from nvdash.jupyter.processes import process_start_s
from nvdash.sampling.jupyter_kernels import (
    SESSION_TYPES,
    JupyterKernel,
    JupyterKernels,
    JupyterServer,
    KernelSession,
    read_boot_id,
)

TEXT_LIMIT = 4096
"""The longest text the file format carries (a longer session path is left out, not cut)."""


def server_record(pid: int, base_url: str) -> JupyterServer:
    """The Jupyter server ``pid`` on this host, serving under ``base_url``."""
    return JupyterServer(pid=pid, hostname=socket.gethostname(), boot_id=read_boot_id(), base_url=base_url)


async def build_kernels(
    server: JupyterServer,
    kernel_manager: Any,
    session_manager: Any,
    clock: Callable[[], float] = time.time,
    start_s: Callable[[int], float | None] = process_start_s,
) -> JupyterKernels:
    """The server's kernels now, in the kernel manager's order, each with its sessions in the session manager's."""
    sessions: dict[str, list[KernelSession]] = {}
    for model in await session_manager.list_sessions():
        session = _session(model)
        if session is not None:
            sessions.setdefault(str(model["kernel"]["id"]), []).append(session)
    kernels = []
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            manager = kernel_manager.get_kernel(kernel_id)
        except KeyError:
            continue  # shut down meanwhile
        kernel = _kernel(str(kernel_id), manager, tuple(sessions.get(str(kernel_id), ())), start_s)
        if kernel is not None:
            kernels.append(kernel)
    return JupyterKernels(server=server, written_s=clock(), kernels=tuple(kernels))


def _kernel(
    kernel_id: str, manager: Any, sessions: tuple[KernelSession, ...], start_s: Callable[[int], float | None]
) -> JupyterKernel | None:
    state = getattr(manager, "execution_state", None)
    name = getattr(manager, "kernel_name", None)
    common: dict[str, Any] = {
        "id": kernel_id,
        "name": name if isinstance(name, str) and name else "unknown",
        "execution_state": state if isinstance(state, str) else None,
        "sessions": sessions,
    }
    provisioner = getattr(manager, "provisioner", None)
    if not isinstance(provisioner, LocalProvisioner):
        return JupyterKernel(pid=None, started_s=None, local=False, **common)
    process = provisioner.process
    pid = provisioner.pid
    if process is None or not isinstance(pid, int) or process.pid != pid or process.poll() is not None:
        return None  # between processes, or ended: its process id may be reused
    # poll() is None: the process is still this kernel's (not reaped, so its id is not reused yet).
    return JupyterKernel(pid=pid, started_s=start_s(pid), local=True, **common)


def _session(model: Any) -> KernelSession | None:
    """A session the file can carry (a Jupyter session type, texts within the format's limit); else ``None``."""
    if not isinstance(model, dict) or not isinstance(model.get("kernel"), dict):
        return None
    path, name, kind = model.get("path"), model.get("name"), model.get("type")
    if not (isinstance(path, str) and isinstance(name, str) and kind in SESSION_TYPES):
        return None
    if len(path) > TEXT_LIMIT or len(name) > TEXT_LIMIT:
        return None
    return KernelSession(path=path, name=name, type=str(kind))
