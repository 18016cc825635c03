"""The jupyter-server-proxy entry point: Jupyter starts nvdash on demand under ``<base_url>nvdash/``.

Registered in the ``jupyter_serverproxy_servers`` entry-point group as ``nvdash``. Jupyter authenticates every
request (HTTP and websocket) before proxying it, and checks the browser's Origin against its own host.

A user-only socket: the proxied nvdash listens on a unix socket, in a new directory of mode 0700 that
jupyter-server-proxy makes (``unix_socket: True``), the socket file itself of mode 0600, and on no TCP port. A
port on 127.0.0.1 would let every local user reach the dashboards around Jupyter's login; the socket admits this
user only.

The websocket origin: the browser's Origin is JupyterLab's (``https://hub.example.org``), a name nvdash cannot
know in advance, and jupyter-server-proxy forwards it unchanged. Rather than accept any origin, the proxy presents
``http://localhost``, the address of a client of nvdash's socket, which nvdash on a unix socket accepts by
default. The browser-facing origin check stays where it belongs, in Jupyter.

Restarts: jupyter-server-proxy (4.x) runs the process under simpervisor, which restarts it at once when it exits
with a non-zero status and never when it exits with 0. After a zero exit the proxy keeps the dead process as its
own (it starts one only when it holds none), so every later request fails until Jupyter restarts; simpervisor's
``always_restart`` is not configurable through the proxy. So the proxied process is :func:`main`, which exits
with ``EX_TEMPFAIL`` (75) after nvdash stops cleanly (SIGTERM): a stop from outside is restarted like a crash,
while Jupyter's own shutdown, which simpervisor marks as a kill, still ends it for good.

Startup: :func:`main` binds the socket before anything else and hands it to the server, so a request that arrives
while nvdash starts (Bokeh takes seconds to import), the first after a restart included, waits for its answer
instead of failing on a socket nobody listens on. What remains is the moment between the old process's exit and
the new one's bind (a Python start, about 0.1 s): jupyter-server-proxy does not check that its process runs before
proxying, and answers a refused connection with 500.

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
import socket
import stat
import sys
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
"""The exit status after a clean stop (``EX_TEMPFAIL``): non-zero, so that simpervisor starts nvdash again."""


def command() -> list[str]:
    """The command line of the proxied server; ``{unix_socket}`` and ``{base_url}`` are filled in by the proxy."""
    return [sys.executable, "-m", MODULE, "--unix-socket", "{unix_socket}", "--prefix", "{base_url}" + NAME]


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
    try:
        listener = bind_private_socket(path)
    except OSError as error:
        print(f"nvdash: error: cannot listen on unix socket {path}: {error.strerror or error}", file=sys.stderr)
        return 1

    from nvdash.cli import UsageError, parse_settings  # noqa: PLC0415 - after the socket is bound

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
    return RESTART_STATUS


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
