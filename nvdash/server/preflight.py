"""A CORS preflight without an ``Origin`` is a 400, not a 500.

Bokeh's autoload script handler (``/<dashboard>/autoload.js``) answers ``OPTIONS`` by echoing the request's
``Origin`` header, and failed with a ``KeyError`` (a 500 and a logged traceback) when there was none. Bokeh offers
no hook for its per-dashboard handlers, so the server's routing rules are pointed at a subclass that refuses such a
request first.
"""

from __future__ import annotations

from typing import Any

from bokeh.server.server import Server
from bokeh.server.views.autoload_js_handler import AutoloadJsHandler
from tornado.web import HTTPError


class AutoloadJs(AutoloadJsHandler):
    """Bokeh's handler, with ``OPTIONS`` refused (400) when the request names no ``Origin``."""

    async def options(self, *args: Any, **kwargs: Any) -> None:
        if "Origin" not in self.request.headers:
            raise HTTPError(400, "a preflight request needs an Origin header")
        await super().options(*args, **kwargs)  # type: ignore[no-untyped-call]


def refuse_preflights_without_origin(server: Server) -> int:
    """Route each dashboard's ``autoload.js`` to :class:`AutoloadJs`; returns how many routes were changed."""
    changed = 0
    for rule in server._tornado.wildcard_router.rules:
        if rule.target is AutoloadJsHandler:
            rule.target = AutoloadJs
            changed += 1
    return changed
