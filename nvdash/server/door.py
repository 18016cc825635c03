"""What every request passes on its way in and out, whichever handler (Bokeh's or nvdash's) serves it.

- The ``Host`` check: a server without a token answers only requests addressed to its own names, so a web page
  that points a name of its own at this machine (DNS rebinding) is refused (403, one line), websockets included.
- A browser that opened a page with ``?token=`` is sent (302) to the same URL without it, the cookie set: the
  token leaves the address bar, the history and the ``Referer``.
- Headers on every answer: a ``Content-Security-Policy`` that lets only this origin frame the pages (the JupyterLab
  pane is served by Jupyter's proxy on Jupyter's origin, so it is this origin too), ``nosniff``, ``no-referrer``.
- A path with a NUL character is a 400 (Bokeh's static files failed on it with a 500).
- Limits on what a connection may cost: request bodies, buffers, idle and half-sent requests.
- No log line carries a token (Tornado logs the URL of a refused or failed request).

It is installed once on the server's Tornado application (:func:`install`): its router is asked first.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from bokeh.server.server import Server
from tornado import httputil
from tornado.web import OutputTransform, RequestHandler

from nvdash.live.internals import tornado_app
from nvdash.server.access import host_allowed, redact_tokens, same_secret, without_token
from nvdash.server.auth import Gate

MAX_BODY_BYTES = 64 * 1024
"""The largest request body read (the login form, the only POST, is well under a kilobyte)."""
MAX_BUFFER_BYTES = 1024 * 1024
"""The most a connection buffers, and the largest websocket message a viewer may send (its clicks are small)."""
CONNECTION_TIMEOUT_S = 60.0
"""How long a connection may sit idle, send its headers or send its body before it is closed."""
CONTENT_SECURITY_POLICY = "frame-ancestors 'self'; base-uri 'self'; form-action 'self'; object-src 'none'"
"""Only this origin may frame the pages. Scripts are not restricted: Bokeh's pages run inline scripts."""
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
NUL_IN_PATH = "a path cannot hold a NUL character"
WRONG_HOST = ("this server answers only requests addressed to its own names and addresses; "
              "to reach it by another name, start it with --allow-host NAME")
LOGGERS = ("tornado.access", "tornado.application", "tornado.general", "bokeh")


def http_server_kwargs(connection_timeout_s: float = CONNECTION_TIMEOUT_S) -> dict[str, Any]:
    """Tornado's ``HTTPServer`` limits: body size, buffer size, and the idle, header and body timeouts.

    Tornado's header timeout is its idle timeout. A body over the limit is refused (400) before it is read.
    """
    return {"max_body_size": MAX_BODY_BYTES, "max_buffer_size": MAX_BUFFER_BYTES,
            "idle_connection_timeout": connection_timeout_s, "body_timeout": connection_timeout_s}


class WrongHost(RequestHandler):
    """Refuses a request addressed to a name this server does not answer to: 403 and one line."""

    def prepare(self) -> None:
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(WRONG_HOST + "\n")


class NulInPath(RequestHandler):
    """Refuses a path with a NUL character (no file or route has one; the file system refuses it): 400."""

    def prepare(self) -> None:
        self.set_status(400)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(NUL_IN_PATH + "\n")


class DropToken(RequestHandler):
    """Sets the cookie of a valid ``?token=`` and sends the browser to the same URL without it."""

    def initialize(self, gate: Gate, location: str) -> None:
        self._gate = gate
        self._location = location

    def prepare(self) -> None:
        self._gate.remember(self)
        self.set_header("Cache-Control", "no-store")
        self.redirect(self._location, status=302)


def _navigation(request: httputil.HTTPServerRequest) -> bool:
    """Whether a browser opens this URL as a page (not a script, an API call or a websocket)."""
    headers = request.headers
    if request.method not in ("GET", "HEAD") or "Upgrade" in headers:
        return False
    return headers.get("Sec-Fetch-Mode") == "navigate" or "text/html" in headers.get("Accept", "")


def _valid_query_token(request: httputil.HTTPServerRequest, gate: Gate) -> bool:
    values = request.query_arguments.get("token")
    if not values:
        return False
    try:
        return same_secret(values[-1].decode("utf-8"), gate.token)
    except UnicodeDecodeError:
        return False


def allowed_host(hosts: frozenset[str] | None) -> Callable[[str], bool]:
    """Whether a ``Host`` header may be answered: always when ``hosts`` is ``None``."""
    if hosts is None:
        return lambda _header: True
    return lambda header: host_allowed(header, hosts)


def install(server: Server, hosts: frozenset[str] | None, gate: Gate | None) -> None:
    """Route every request of ``server`` through the door: the ``Host`` check (``hosts``: the names answered
    besides loopback ones; ``None``: any), the token redirect (with ``gate``), the headers, the log filter."""
    application = tornado_app(server)
    routes = application.find_handler
    allowed = allowed_host(hosts)

    def find_handler(request: httputil.HTTPServerRequest, **kwargs: Any) -> httputil.HTTPMessageDelegate:
        if not allowed(request.headers.get("Host", "")):
            return application.get_handler_delegate(request, WrongHost)
        if "\x00" in urllib.parse.unquote(request.path):
            return application.get_handler_delegate(request, NulInPath)
        if gate is not None and _navigation(request) and _valid_query_token(request, gate):
            location = without_token(request.uri or "/")
            return application.get_handler_delegate(request, DropToken, {"gate": gate, "location": location})
        return routes(request, **kwargs)

    application.find_handler = find_handler  # type: ignore[method-assign,assignment]
    application.add_transform(SecurityHeaders)
    redact_logged_tokens()


class SecurityHeaders(OutputTransform):
    """Adds :data:`SECURITY_HEADERS` to every answer that does not set them itself."""

    def transform_first_chunk(self, status_code: int, headers: httputil.HTTPHeaders, chunk: bytes,
                              finishing: bool) -> tuple[int, httputil.HTTPHeaders, bytes]:
        for name, value in SECURITY_HEADERS.items():
            if name not in headers:
                headers[name] = value
        return status_code, headers, chunk


class RedactTokens(logging.Filter):
    """Rewrites a log record whose message carries a ``token=`` value, the value replaced."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_tokens(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redact_logged_tokens() -> None:
    """Put :class:`RedactTokens` on Tornado's and Bokeh's loggers and on the root logger's handlers (once each),
    so that a record logged anywhere below them is redacted before it is written."""
    targets: list[logging.Filterer] = [logging.getLogger(name) for name in LOGGERS]
    targets += logging.getLogger().handlers
    for target in targets:
        if not any(isinstance(existing, RedactTokens) for existing in target.filters):
            target.addFilter(RedactTokens())
