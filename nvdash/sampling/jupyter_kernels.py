"""The kernels file: what a Jupyter server tells the nvdash it started about its own kernels.

nvdash's Jupyter server extension (:mod:`nvdash.jupyter`) writes, in the Jupyter server's private runtime folder,
one JSON file per Jupyter server (:func:`kernels_file_path`) listing that server's kernels: id, kernel name, the
notebooks or consoles they serve (Jupyter's sessions), their process id and its start time. The nvdash that
jupyter-server-proxy starts for that server is given the path (``--jupyter-kernels``) and reads it at each process
reading: it joins the GPU processes NVML lists to these kernels by walking each process's parents up to a kernel
(so data-loader workers, pools and Dask workers a kernel started count for it, and a process under two kernels
counts for the nearest one only).

Only this server's kernels are in its file: another Jupyter server (another user's, on JupyterHub another
single-user server) writes its own file, which this nvdash is never told of.

The file is untrusted input to the reader: it is read bounded (:data:`MAX_BYTES`), and anything malformed gives a
:class:`KernelsFileError` with a one-line message, never a traceback.

Format (version 1)::

    {"version": 1, "written_s": 1764259200.5,
     "server": {"pid": 4242, "hostname": "gpu-07", "boot_id": "6f1c...", "base_url": "/user/alice/"},
     "kernels": [{"id": "0b8f...", "name": "python3", "pid": 4301, "started_s": 1764259100.25, "local": true,
                  "execution_state": "idle",
                  "sessions": [{"path": "train/a.ipynb", "name": "a.ipynb", "type": "notebook"}]}]}

``pid`` and ``started_s`` (the process's start time, seconds since the epoch, as the host reports it) are ``null``
for a kernel that is not a process on this machine (``local: false``: a remote kernel provisioner, a gateway).
``started_s`` lets the reader tell the kernel from a later process that reused its PID.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = 1
MAX_BYTES = 1 << 20
"""The largest kernels file read (a server with thousands of kernels and long paths stays far below)."""
FILE_PREFIX = "nvdash-kernels-"
SESSION_TYPES = ("notebook", "console", "file")
"""Jupyter's session types (``file``: a kernel attached to a script, e.g. a Python file's console)."""
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class KernelsFileError(ValueError):
    """The kernels file cannot be used; the message is one line naming the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class KernelSession:
    """One Jupyter session of a kernel: the notebook (or console, or file) it serves."""

    path: str
    """The document's path relative to Jupyter's root folder, e.g. ``train/a.ipynb``."""
    name: str
    type: str
    """One of :data:`SESSION_TYPES`."""


@dataclass(frozen=True, slots=True)
class JupyterKernel:
    """One kernel of the Jupyter server."""

    id: str
    name: str
    """The kernel spec's name, e.g. ``python3``."""
    pid: int | None
    """The kernel's process on this machine; ``None`` for a kernel that is not a local process."""
    started_s: float | None
    """The kernel process's start time (seconds since the epoch); ``None`` with ``pid``."""
    local: bool
    """False for a kernel running elsewhere (a remote kernel provisioner or gateway): never joined to GPU processes."""
    execution_state: str | None = None
    """Jupyter's last known state: ``idle``, ``busy``, ``starting``, ``restarting``, ``dead``; ``None`` unknown."""
    sessions: tuple[KernelSession, ...] = ()

    @property
    def title(self) -> str:
        """What a user calls it: the first session's path, else ``Kernel <name> <id prefix>``."""
        if self.sessions:
            return self.sessions[0].path
        return f"Kernel {self.name} {self.id[:8]}"


@dataclass(frozen=True, slots=True)
class JupyterServer:
    """The Jupyter server that wrote the file."""

    pid: int
    hostname: str
    boot_id: str | None
    """The host's boot id: with the hostname, tells whether the kernels run on the machine nvdash reads."""
    base_url: str


@dataclass(frozen=True, slots=True)
class JupyterKernels:
    """The whole kernels file."""

    server: JupyterServer
    written_s: float
    kernels: tuple[JupyterKernel, ...] = ()


def kernels_file_path(runtime_dir: str | os.PathLike[str], server_pid: int) -> Path:
    """Where the Jupyter server with process id ``server_pid`` writes its kernels file."""
    return Path(runtime_dir) / f"{FILE_PREFIX}{server_pid}.json"


def read_boot_id(path: str = BOOT_ID_PATH) -> str | None:
    """This host's boot id, or ``None`` where the kernel does not expose one."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read(64).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def to_json(kernels: JupyterKernels) -> dict[str, Any]:
    """The file's content for ``kernels`` (the inverse of :func:`parse_kernels`)."""
    server = kernels.server
    return {
        "version": VERSION,
        "written_s": kernels.written_s,
        "server": {"pid": server.pid, "hostname": server.hostname, "boot_id": server.boot_id,
                   "base_url": server.base_url},
        "kernels": [
            {"id": k.id, "name": k.name, "pid": k.pid, "started_s": k.started_s, "local": k.local,
             "execution_state": k.execution_state,
             "sessions": [{"path": s.path, "name": s.name, "type": s.type} for s in k.sessions]}
            for k in kernels.kernels
        ],
    }


def write_kernels_file(path: str | os.PathLike[str], kernels: JupyterKernels) -> None:
    """Replace the file at ``path`` atomically (a reader sees the old or the new file, never a part), mode 0600."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    data = json.dumps(to_json(kernels), separators=(",", ":")).encode()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def read_kernels_file(path: str | os.PathLike[str], max_bytes: int = MAX_BYTES) -> JupyterKernels:
    """The kernels file at ``path``; raises :class:`KernelsFileError` (one line) when it is missing or malformed.

    Opened without following a FIFO's writer (``O_NONBLOCK``) and only when it is a regular file, read at most
    ``max_bytes``.
    """
    name = os.fspath(path)
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise KernelsFileError(f"the kernels file {name} does not exist (yet)") from None
    except OSError as error:
        raise KernelsFileError(f"cannot open the kernels file {name}: {error.strerror or error}") from None
    with os.fdopen(descriptor, "rb") as handle:
        if not _is_regular(handle.fileno()):
            raise KernelsFileError(f"the kernels file {name} is not a regular file")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise KernelsFileError(f"the kernels file {name} is larger than {max_bytes} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise KernelsFileError(f"the kernels file {name} is not JSON: {error}") from None
    try:
        return parse_kernels(document)
    except (KeyError, TypeError, ValueError) as error:
        raise KernelsFileError(f"the kernels file {name} is malformed: {error}") from None


def parse_kernels(document: object) -> JupyterKernels:
    """The kernels of a parsed file; raises ValueError (or KeyError, TypeError) on anything not of the format."""
    if not isinstance(document, dict):
        raise TypeError("not an object")
    if document.get("version") != VERSION:
        raise ValueError(f"version {document.get('version')!r} is not {VERSION}")
    server = _object(document["server"], "server")
    kernels = document["kernels"]
    if not isinstance(kernels, list):
        raise TypeError("kernels is not a list")
    return JupyterKernels(
        server=JupyterServer(
            pid=_pid(server["pid"], "server pid"),
            hostname=_text(server["hostname"], "server hostname"),
            boot_id=None if server.get("boot_id") is None else _text(server["boot_id"], "boot_id"),
            base_url=_text(server["base_url"], "base_url"),
        ),
        written_s=_seconds(document["written_s"], "written_s"),
        kernels=tuple(_kernel(item) for item in kernels),
    )


def _kernel(item: object) -> JupyterKernel:
    entry = _object(item, "kernel")
    local = entry["local"]
    if not isinstance(local, bool):
        raise TypeError("kernel local is not true or false")
    pid = None if entry.get("pid") is None else _pid(entry["pid"], "kernel pid")
    started = None if entry.get("started_s") is None else _seconds(entry["started_s"], "kernel started_s")
    if local and pid is None:
        raise ValueError("a local kernel has no pid")
    state = entry.get("execution_state")
    sessions = entry.get("sessions", [])
    if not isinstance(sessions, list):
        raise TypeError("kernel sessions is not a list")
    return JupyterKernel(
        id=_text(entry["id"], "kernel id"),
        name=_text(entry["name"], "kernel name"),
        pid=pid if local else None,
        started_s=started if local else None,
        local=local,
        execution_state=None if state is None else _text(state, "execution_state"),
        sessions=tuple(_session(session) for session in sessions),
    )


def _session(item: object) -> KernelSession:
    entry = _object(item, "session")
    kind = _text(entry["type"], "session type")
    if kind not in SESSION_TYPES:
        raise ValueError(f"session type {kind!r} is not one of {', '.join(SESSION_TYPES)}")
    return KernelSession(path=_text(entry["path"], "session path"), name=_text(entry["name"], "session name"),
                         type=kind)


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not an object")
    return value


def _text(value: object, what: str, limit: int = 4096) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is not a string")
    if len(value) > limit:
        raise ValueError(f"{what} is longer than {limit} characters")
    return value


def _pid(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 22:
        raise ValueError(f"{what} {value!r} is not a process id")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} {value!r} is not a time")
    return float(value)


def _is_regular(descriptor: int) -> bool:
    return stat.S_ISREG(os.fstat(descriptor).st_mode)
