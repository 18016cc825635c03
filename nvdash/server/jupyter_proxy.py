"""The jupyter-server-proxy entry point: Jupyter starts nvdash on demand under ``<base_url>nvdash/``.

Registered in the ``jupyter_serverproxy_servers`` entry-point group as ``nvdash``. Jupyter authenticates every
request (HTTP and websocket) before proxying it, and checks the browser's Origin against its own host.

Notebooks: nvdash is told (``--jupyter-kernels``) the kernels file that nvdash's Jupyter server extension
(:mod:`nvdash.jupyter`) keeps for this Jupyter server, to join the GPU processes to this server's kernels.

A user-only socket: the proxied nvdash listens on a unix socket, in a new directory of mode 0700 that
jupyter-server-proxy makes (``unix_socket: True``), the socket file itself of mode 0600, and on no TCP port. A
port on 127.0.0.1 would let every local user reach the dashboards around Jupyter's login; the socket admits this
user only.

The websocket origin: the browser's Origin is JupyterLab's (``https://hub.example.org``), a name nvdash cannot
know in advance, and jupyter-server-proxy forwards it unchanged. Rather than accept any origin, the proxy presents
``http://localhost``, the address of a client of nvdash's socket, which nvdash on a unix socket accepts by
default. The browser-facing origin check stays where it belongs, in Jupyter.

Restarts: jupyter-server-proxy (4.x) starts the process once and then proxies every request straight to its
socket, never checking that the process still runs; a refused connection becomes a 500. simpervisor restarts a
process that exits non-zero (never one that exits 0), but a request in the moment between the old process's exit
and the new one's bind would still fail. So after a clean stop (SIGTERM) :func:`main` restarts nvdash *in place*:
it execs a fresh nvdash in the same process, handing it the listening socket, which therefore never stops
listening; requests meanwhile wait in its backlog and are answered by the fresh nvdash (the first request after
the SIGTERM included). Jupyter's own shutdown also sends SIGTERM: a watcher ends nvdash for good once the Jupyter
process that started it is gone (checked every ``PARENT_CHECK_S``). When the exec fails, nvdash exits with
``EX_TEMPFAIL`` (75) for simpervisor to restart it.

Startup: :func:`main` binds the socket before anything else and hands it to the server, so a request that arrives
while nvdash starts (Bokeh takes seconds to import) waits for its answer instead of failing on a socket nobody
listens on.

Start failures: the proxy polls the socket with HTTP requests until anything answers (up to
``$NVDASH_START_TIMEOUT`` seconds) and does not notice the process exiting. A configuration nvdash rejects at
once (an unknown ``NVDASH_SIMULATE``) would show only as "could not start in time" after the whole timeout, with
the process restarted in a tight loop meanwhile. So :func:`main` binds the socket before anything else, and when
nvdash cannot start it answers every request there with 500 and nvdash's one-line message (also on stderr, in
Jupyter's log): the proxy's pending readiness check gets that answer at once, and the browser shows the text. It
answers so until stopped; stopped by SIGTERM, it is restarted and tries again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

NAME = "nvdash"
"""The URL path under Jupyter's base URL, and the entry point's name."""
MODULE = "nvdash.server.jupyter_proxy"
"""This module, run by the proxy as the nvdash process (``python -m``)."""
ENV_START_TIMEOUT = "NVDASH_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 30.0
"""How long Jupyter waits for nvdash to answer (it needs about 2 s; NVML on many GPUs or a cold disk more)."""
PROXY_ORIGIN = "http://localhost"
"""The Origin the proxy presents to nvdash, one that nvdash on a unix socket accepts by default."""
RESTART_STATUS = 75
"""The exit status when a restart in place failed (``EX_TEMPFAIL``): non-zero, so that simpervisor starts nvdash
again."""
ENV_LISTEN_FD = "NVDASH_PROXY_LISTEN_FD"
ENV_PARENT = "NVDASH_PROXY_PARENT"
"""Set by a restart in place only: the listening socket's descriptor and the Jupyter process that started nvdash."""
PARENT_CHECK_S = 0.5


def command() -> list[str]:
    """The command line of the proxied server; ``{unix_socket}`` and ``{base_url}`` are filled in by the proxy.

    ``--jupyter-kernels`` names the kernels file this Jupyter server's extension (:mod:`nvdash.jupyter`) keeps in
    Jupyter's runtime folder: run in the Jupyter process, ``os.getpid()`` is that server's. Its braces are doubled
    because the proxy fills the command in with ``str.format``.
    """
    from jupyter_core.paths import jupyter_runtime_dir  # noqa: PLC0415 - only in the Jupyter process

    from nvdash.sampling.jupyter_kernels import kernels_file_path  # noqa: PLC0415

    kernels = str(kernels_file_path(jupyter_runtime_dir(), os.getpid())).replace("{", "{{").replace("}", "}}")
    return [
        sys.executable, "-m", MODULE, "--unix-socket", "{unix_socket}", "--prefix", "{base_url}" + NAME,
        "--jupyter-kernels", kernels,
    ]


def start_timeout_s(environ: Mapping[str, str]) -> float:
    """``$NVDASH_START_TIMEOUT`` seconds when it is a positive number, else the default."""
    try:
        value = float(environ.get(ENV_START_TIMEOUT, ""))
    except ValueError:
        return DEFAULT_START_TIMEOUT_S
    return value if value > 0 else DEFAULT_START_TIMEOUT_S


def setup() -> dict[str, Any]:
    """The server process description jupyter-server-proxy reads from the entry point.

    ``unix_socket: True`` has the proxy make a private directory for the socket and pass its path as
    ``{unix_socket}``. ``absolute_url`` keeps the full ``<base_url>nvdash/...`` path on the forwarded requests,
    matching the ``--prefix`` nvdash serves under, so the pages' links, static files and websocket all resolve
    through the proxy. The environment passes through unchanged (``NVDASH_SIMULATE`` selects simulated GPUs).
    A server that does not answer within ``$NVDASH_START_TIMEOUT`` seconds is stopped, and the request fails
    with 500.
    """
    return {
        "command": command(),
        "unix_socket": True,
        "absolute_url": True,
        "timeout": start_timeout_s(os.environ),
        "request_headers_override": {"Origin": PROXY_ORIGIN},
        "exclude_last_activity_patterns": [r".*/" + NAME + r"/health$"],
        "new_browser_tab": False,
        "launcher_entry": {"enabled": False, "title": "GPU Dashboards"},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Serve nvdash for the proxy on ``--unix-socket PATH``; returns the exit status (see the module docstring)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    path = _socket_path(arguments)
    if path is None:
        print(f"nvdash: error: python -m {MODULE} needs --unix-socket PATH", file=sys.stderr)
        return 2
    parent = _restarted_by(os.environ)
    if parent is not None and os.getppid() != parent:
        return 0  # Jupyter went away while nvdash restarted: nothing to serve
    listener = _inherited_listener(os.environ, path) if parent is not None else None
    for name in (ENV_LISTEN_FD, ENV_PARENT):
        os.environ.pop(name, None)
    if listener is None:
        try:
            listener = bind_private_socket(path)
        except OSError as error:
            print(f"nvdash: error: cannot listen on unix socket {path}: {error.strerror or error}", file=sys.stderr)
            return 1
    parent = os.getppid()
    orphaned = threading.Event()
    threading.Thread(target=_watch_parent, args=(parent, orphaned), name="nvdash-proxy-parent", daemon=True).start()

    from nvdash.server.options import UsageError, parse_settings  # noqa: PLC0415 - after the socket is bound

    try:
        settings = parse_settings(arguments, os.environ)
    except UsageError as error:
        return _report_until_stopped(listener, str(error), status=2)
    from nvdash.server.run import StartupError, serve  # noqa: PLC0415 - Bokeh takes seconds to import

    try:
        # The socket stays bound while nvdash starts: a request meanwhile waits for the answer rather than failing.
        serve(settings, listener=listener)
    except StartupError as error:
        listener.close()
        return _report_until_stopped(bind_private_socket(path), str(error), status=1)
    if orphaned.is_set():
        return 0
    _restart_in_place(listener, parent, arguments)
    return RESTART_STATUS


def _restarted_by(environ: Mapping[str, str]) -> int | None:
    """The Jupyter process that started the nvdash this one replaces (``None``: a first start)."""
    text = environ.get(ENV_PARENT, "")
    return int(text) if text.isascii() and text.isdigit() else None


def _inherited_listener(environ: Mapping[str, str], path: str) -> socket.socket | None:
    """The listening socket at ``path`` the replaced nvdash left open (``None``: none, or not that one)."""
    text = environ.get(ENV_LISTEN_FD, "")
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        listener = socket.socket(fileno=int(text))
    except OSError:
        return None
    try:
        if listener.family == socket.AF_UNIX and listener.getsockname() == path:
            listener.set_inheritable(False)
            listener.setblocking(False)
            return listener
    except OSError:
        pass
    listener.detach()
    return None


def _watch_parent(parent: int, orphaned: threading.Event) -> None:
    """Stop nvdash for good once the Jupyter that started it is gone (its shutdown also sends SIGTERM)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    orphaned.set()
    os.kill(os.getpid(), signal.SIGTERM)


def _restart_in_place(listener: socket.socket, parent: int, arguments: Sequence[str]) -> None:
    """Replace this process with a fresh nvdash that keeps ``listener``: requests wait in its backlog meanwhile.

    Returns only when the exec failed (the caller then exits for simpervisor to restart it).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    listener.set_inheritable(True)
    environ = {**os.environ, ENV_LISTEN_FD: str(listener.fileno()), ENV_PARENT: str(parent)}
    try:
        os.execve(sys.executable, [sys.executable, "-m", MODULE, *arguments], environ)
    except OSError as error:
        print(f"nvdash: cannot restart in place ({error.strerror or error}); exiting to be restarted",
              file=sys.stderr, flush=True)


def bind_private_socket(path: str) -> socket.socket:
    """A listening, non-blocking unix socket at ``path`` of mode 0600, replacing a socket file left there.

    Tornado's ``bind_unix_socket`` does the same, but importing Tornado (and asyncio) first would delay the
    moment the proxy's readiness check can connect.
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    listener.setblocking(False)
    return listener


def _socket_path(arguments: Sequence[str]) -> str | None:
    for index, argument in enumerate(arguments):
        if argument == "--unix-socket" and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith("--unix-socket="):
            return argument.partition("=")[2]
    return None


def _report_until_stopped(listener: socket.socket, reason: str, status: int) -> int:
    """Print nvdash's one-line error, answer every request on ``listener`` with it until SIGTERM; ``status``."""
    import asyncio  # noqa: PLC0415 - only when nvdash cannot start

    message = f"nvdash: error: {reason}"
    print(message, file=sys.stderr, flush=True)
    asyncio.run(_answer_with(listener, message))
    return status


async def _answer_with(listener: socket.socket, message: str) -> None:
    import asyncio  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from tornado.httpserver import HTTPServer  # noqa: PLC0415
    from tornado.web import Application, RequestHandler  # noqa: PLC0415

    class Failure(RequestHandler):
        def prepare(self) -> None:
            self.set_status(500)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            self.finish(message + "\n")

    server = HTTPServer(Application([(r".*", Failure)], log_function=lambda _handler: None))
    server.add_sockets([listener])
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    server.stop()


if __name__ == "__main__":
    sys.exit(main())
