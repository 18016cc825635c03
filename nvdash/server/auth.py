"""The dashboard token at the door: Bokeh's pages and websockets, nvdash's own handlers, the login form.

One :class:`Gate` per server holds the token. Bokeh asks it through :class:`TokenAuth` (its ``auth_provider``
hook, called in the ``prepare`` of its document, autoload, metadata and websocket handlers); nvdash's own
handlers ask it in their ``prepare`` (:class:`GuardedHandler`). A request is admitted with the token as
``?token=``, as an ``Authorization: token X`` or ``Bearer X`` header, or with the cookie that a valid
``?token=`` (or the login form) sets. Anything else gets a 403 that says how to get in, before any work is
done, and, for a websocket, before the handshake. Bokeh's static files stay open.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from bokeh.server.auth_provider import AuthProvider
from jinja2 import Environment, select_autoescape
from tornado.web import RequestHandler

from nvdash.live.internals import tornado_app
from nvdash.server.access import (
    COOKIE_MAX_AGE_S,
    cookie_name,
    cookie_valid,
    local_target,
    same_secret,
    sign_cookie,
    token_from_authorization,
)

LOGIN_PATH = "/login"
HINT = ("a token is needed: open the URL nvdash printed at start (it ends in ?token=...), "
        "or send the header 'Authorization: token TOKEN'")
WRONG_TOKEN = "That is not the token this server was started with."
_env = Environment(autoescape=select_autoescape(default=True))


class Gate:
    """The token one server requires, and how a request shows it knows it."""

    def __init__(self, token: str, port: int, prefix: str = "", clock: Callable[[], float] = time.time) -> None:
        self.token = token
        self.prefix = prefix
        self.cookie = cookie_name(port)
        self._clock = clock

    def admits(self, handler: RequestHandler) -> bool:
        """Whether the request carries the token (query or header) or a valid cookie.

        A valid ``?token=`` also sets the cookie, so the page's websocket and later bookmarks need no token.
        """
        query = handler.get_query_argument("token", None)
        if query is not None and same_secret(query, self.token):
            self.remember(handler)
            return True
        header = token_from_authorization(handler.request.headers.get("Authorization", ""))
        if header is not None and same_secret(header, self.token):
            return True
        cookie = handler.get_cookie(self.cookie)
        return cookie is not None and cookie_valid(self.token, cookie, self._clock())

    def remember(self, handler: RequestHandler) -> None:
        """Set the signed cookie: HttpOnly, SameSite=Lax, Secure when served over TLS."""
        handler.set_cookie(self.cookie, sign_cookie(self.token, self._clock()), path=self.prefix + "/",
                           max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="Lax",
                           secure=handler.request.protocol == "https")


class TokenAuth(AuthProvider):
    """Bokeh's authentication hook over a :class:`Gate`; refuses (and answers) in the handler's ``prepare``."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        super().__init__()

    @property
    def get_user_async(self) -> Callable[[Any], Awaitable[Any]]:
        return self._user

    @property
    def login_url(self) -> str:
        return LOGIN_PATH

    @property
    def login_handler(self) -> type[RequestHandler]:
        return LoginHandler

    async def _user(self, handler: RequestHandler) -> str | None:
        if self.gate.admits(handler):
            return "token"
        refuse(handler)  # finished here: tornado runs no handler method after a prepare that finished
        return None


def gate_of(handler: RequestHandler) -> Gate | None:
    """The gate of the server ``handler`` belongs to, or ``None`` when its dashboards are open."""
    provider = getattr(handler.application, "auth_provider", None)
    return provider.gate if isinstance(provider, TokenAuth) else None


def gate_of_server(server: Any) -> Gate | None:
    """The gate of a Bokeh ``Server``, or ``None`` when its dashboards are open."""
    provider = getattr(tornado_app(server), "auth_provider", None)
    return provider.gate if isinstance(provider, TokenAuth) else None


def admitted(handler: RequestHandler) -> bool:
    """Whether the request may see what the dashboards show (always, when no token is required)."""
    gate = gate_of(handler)
    return gate is None or gate.admits(handler)


def _login_page(handler: RequestHandler, target: str, message: str = "") -> str:
    text = resources.files("nvdash.server").joinpath("templates").joinpath("login.html").read_text(encoding="utf-8")
    prefix = getattr(handler.application, "prefix", "")
    return str(_env.from_string(text).render(action=prefix + LOGIN_PATH, next=target, message=message))


def refuse(handler: RequestHandler) -> None:
    """Answer 403: JSON for the JSON endpoints, the login form for a browser, else one line of text."""
    handler.set_status(403)
    handler.set_header("Cache-Control", "no-store")
    path = handler.request.path
    if path.endswith((".json", "/health")):
        handler.set_header("Content-Type", "application/json")
        handler.finish(json.dumps({"error": HINT}))
    elif "text/html" in handler.request.headers.get("Accept", "") and handler.request.method in ("GET", "HEAD"):
        handler.set_header("Content-Type", "text/html; charset=utf-8")
        handler.finish(_login_page(handler, handler.request.uri or "/"))
    else:
        handler.set_header("Content-Type", "text/plain; charset=utf-8")
        handler.finish(HINT + "\n")


class GuardedHandler(RequestHandler):
    """A handler of nvdash's own that serves only requests its server's gate admits."""

    guarded = True
    """``False`` for a route that decides for itself what an anonymous request may see (``/health``)."""

    def prepare(self) -> None:
        gate = gate_of(self)
        if self.guarded and gate is not None and not gate.admits(self):
            refuse(self)


class LoginHandler(RequestHandler):
    """``GET /login`` shows the form; ``POST`` with the right token sets the cookie and goes back to ``next``."""

    def _target(self, value: str) -> str:
        return local_target(value, getattr(self.application, "prefix", "") + "/")

    def _form(self, status: int, target: str, message: str = "") -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(_login_page(self, target, message))

    def get(self) -> None:
        self._form(200, self._target(self.get_query_argument("next", "")))

    def post(self) -> None:
        gate = gate_of(self)
        target = self._target(self.get_body_argument("next", ""))
        if gate is None:
            self.redirect(target, status=303)
            return
        if not same_secret(self.get_body_argument("token", "").strip(), gate.token):
            self._form(403, target, WRONG_TOKEN)
            return
        gate.remember(self)
        self.redirect(target, status=303)
