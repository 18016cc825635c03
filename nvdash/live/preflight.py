"""Bad requests to Bokeh's per-dashboard pages are a 400, not a 500.

Bokeh's autoload script handler (``/<dashboard>/autoload.js``) answers ``OPTIONS`` by echoing the request's
``Origin`` header, and failed with a ``KeyError`` (a 500 and a logged traceback) when there was none. Bokeh's page
and autoload handlers failed with a ``ProtocolError`` (a 500) on an empty ``bokeh-session-id`` (argument or
``Bokeh-Session-Id`` header), and with decoding errors on a ``bokeh-token`` argument they could not read. Bokeh
offers no hook for its per-dashboard handlers, so the server's routing rules are pointed at subclasses that refuse
such requests first.
"""

from __future__ import annotations

from typing import Any

from bokeh.protocol.exceptions import ProtocolError
from bokeh.server.server import Server
from bokeh.server.session import ServerSession
from bokeh.server.views.autoload_js_handler import AutoloadJsHandler
from bokeh.server.views.doc_handler import DocHandler
from bokeh.server.views.session_handler import SessionHandler
from bokeh.util.token import get_session_id, get_token_payload
from tornado.web import HTTPError, RequestHandler

from nvdash.live.internals import replace_route_targets


def _check_token(token: str) -> None:
    """Raise a 400 when Bokeh cannot read ``token`` (what it would fail on with a 500 and a traceback)."""
    try:
        get_session_id(token)
        get_token_payload(token)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise HTTPError(400, f"bad bokeh-token: {type(error).__name__}") from None


async def _session(handler: SessionHandler) -> ServerSession:
    """Bokeh's session for the request; a session id or a session token Bokeh cannot read is a 400."""
    token = handler.get_argument("bokeh-token", default=None)
    if token is not None:
        _check_token(token)
    try:
        session: ServerSession = await SessionHandler.get_session(handler)  # type: ignore[misc]
    except ProtocolError as error:
        raise HTTPError(400, f"bad bokeh-session-id: {error}") from None
    return session


class Doc(DocHandler):
    """Bokeh's page handler, with a session id it cannot use refused (400)."""

    async def get_session(self) -> ServerSession:  # type: ignore[override]
        return await _session(self)


class AutoloadJs(AutoloadJsHandler):
    """Bokeh's autoload handler: ``OPTIONS`` without ``Origin`` and an unusable session id refused (400)."""

    async def get_session(self) -> ServerSession:  # type: ignore[override]
        return await _session(self)

    async def options(self, *args: Any, **kwargs: Any) -> None:
        if "Origin" not in self.request.headers:
            raise HTTPError(400, "a preflight request needs an Origin header")
        await super().options(*args, **kwargs)  # type: ignore[no-untyped-call]


REPLACEMENTS: dict[type[RequestHandler], type[RequestHandler]] = {AutoloadJsHandler: AutoloadJs, DocHandler: Doc}


def refuse_preflights_without_origin(server: Server) -> int:
    """Route each dashboard's page and ``autoload.js`` to :class:`Doc` and :class:`AutoloadJs`; returns how many
    routes were changed."""
    return replace_route_targets(server, REPLACEMENTS)
