"""The Bokeh and Tornado internals nvdash relies on: one list, and the accessors that reach them.

Neither library offers a public way to do what keeps many viewers cheap (batching a websocket's writes, seeing
what waits for a viewer, closing a viewer that stopped reading, discarding a document without a full garbage
collection) or what keeps the server safe (refusing requests Bokeh answers with a 500, admitting bracketed IPv6
origins, routing every request through the door). So nvdash reaches into private attributes, replaces routing
targets and module globals, and relies on behaviour no documentation promises. Each such reliance is an entry of
:data:`INTERNALS`; where the reliance is an attribute read, the code reads it through the accessor below, so that
this list is where the code reaches in. ``tests/unit/test_bokeh_internals.py`` checks every entry on the
installed release and names the feature that breaks when one is gone; pyproject bounds both libraries to the
releases the entries were checked against (:data:`CHECKED`).
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tornado.websocket import WebSocketHandler

if TYPE_CHECKING:
    from bokeh.server.connection import ServerConnection
    from bokeh.server.server import Server
    from bokeh.server.tornado import BokehTornado
    from tornado.httpserver import HTTPServer
    from tornado.iostream import BaseIOStream
    from tornado.routing import Rule
    from tornado.web import RequestHandler
    from tornado.websocket import WebSocketProtocol

Library = Literal["bokeh", "tornado"]

CHECKED: Mapping[Library, str] = types.MappingProxyType({"bokeh": "3.9.2", "tornado": "6.6.1"})
"""The releases every entry of :data:`INTERNALS` was read in and checked against."""


@dataclass(frozen=True)
class Internal:
    """One private attribute, replaced global or undocumented behaviour of Bokeh or Tornado that nvdash uses."""

    name: str
    """The dotted name of what is relied on."""
    library: Library
    what: str
    """What it is, and what nvdash relies on it doing."""
    feature: str
    """The nvdash feature that breaks without it, and the module that uses it."""
    why: str
    """Why no public API does instead."""

    def __str__(self) -> str:
        return f"{self.name} ({self.library} {CHECKED[self.library]}): {self.feature}"


INTERNALS: tuple[Internal, ...] = (
    Internal(
        "bokeh.server.server.Server._tornado", "bokeh",
        "the server's BokehTornado (a tornado.web.Application): its routes, connections, origins and auth provider",
        "batched websocket writes (nvdash.live.ws_batch), refused bad page requests (nvdash.live.preflight), "
        "stalled-viewer closing (nvdash.live.stalled), the door and the token gate (nvdash.server.door, "
        "nvdash.server.auth), bracketed IPv6 origins (nvdash.server.app)",
        "Server offers no public handle on its Tornado application"),
    Internal(
        "bokeh.server.server.Server._http", "bokeh",
        "the server's tornado.httpserver.HTTPServer, which serves any socket given to add_sockets",
        "serving the socket the Jupyter proxy entry point bound before start-up (nvdash.server.app)",
        "Server binds its own sockets and takes no listening socket"),
    Internal(
        "bokeh.server.tornado.BokehTornado._clients", "bokeh",
        "the set of ServerConnection objects, one per open websocket",
        "stalled-viewer closing and the /health websocket counts (nvdash.live.stalled)",
        "BokehTornado lists sessions, not connections"),
    Internal(
        "bokeh.server.tornado.BokehTornado.websocket_origins", "bokeh",
        "the mutable set of allowed websocket origins that WSHandler.check_origin consults at each connection",
        "websocket origins in bracketed IPv6 form (nvdash.server.app)",
        "Bokeh's allow_websocket_origin parser splits on ':' and refuses them; the set is reached via _tornado"),
    Internal(
        "bokeh.server.connection.ServerConnection._socket", "bokeh",
        "the WSHandler (a tornado WebSocketHandler) of a connection",
        "backpressure (nvdash.live.backpressure) and stalled-viewer closing (nvdash.live.stalled)",
        "a connection does not expose its websocket"),
    Internal(
        "bokeh.server.session.ServerSession._subscribed_connections", "bokeh",
        "the set of ServerConnection objects subscribed to a session (connection_count is its length)",
        "backpressure: skipping ticks while a viewer has too much waiting (nvdash.live.backpressure)",
        "a session exposes only the number of its connections"),
    Internal(
        "bokeh.server.views.ws.WSHandler._async_open", "bokeh",
        "the coroutine that opens a session's connection and sets WSHandler.connection; the session then sends "
        "each document change through that connection's send_patch_document, which writes with "
        "WSHandler.send_message",
        "batched websocket writes and cheap stream/patch messages (nvdash.live.ws_batch)",
        "Bokeh makes the connection itself and offers no hook for its class or its writes"),
    Internal(
        "bokeh.protocol.message.Message.send", "bokeh",
        "the frames a protocol message is written as: header, metadata and content text frames, then a text "
        "frame with each buffer's ref followed by a binary frame with its bytes",
        "batched websocket writes, which frame messages themselves (nvdash.live.ws_batch)",
        "the wire layout is Bokeh's protocol, not a documented API"),
    Internal(
        "bokeh.protocol.messages.patch_doc.patch_doc.create", "bokeh",
        "serializes a PATCH-DOC's events with the document's synced models as references (a walk of every model "
        "of the document per message); a stream, a patch or a property set to a value without models (a str, "
        "number, bool, None, or a list, tuple or dict of those) serializes to the same JSON with no references, "
        "and leaves the document's new models as they were",
        "cheap stream, patch and plain property messages, several in one message (nvdash.live.ws_batch)",
        "Bokeh offers no way to make a message of an event without the document's models"),
    Internal(
        "bokeh.document.document.gc", "bokeh",
        "the gc module as a global of Bokeh's document module; Document.destroy calls gc.collect() through it",
        "the garbage-collection policy: no full collection per discarded session (nvdash.live.gc_policy)",
        "Bokeh offers no option to skip the collection"),
    Internal(
        "bokeh.document.Document.destroy", "bokeh",
        "called once for each session Bokeh discards, with the document's models still reachable before it runs",
        "scrubbing discarded documents' models (nvdash.live.gc_policy)",
        "Bokeh offers no hook after a session's document is destroyed"),
    Internal(
        "bokeh.core.has_props.HasProps._property_values", "bokeh",
        "a model's property values, with _unstable_default_values and _unstable_themed_values beside it",
        "scrubbing discarded documents' models (nvdash.live.gc_policy)",
        "the property containers a model holds are reachable only through these dicts"),
    Internal(
        "bokeh.core.property.wrappers.PropertyValueContainer._owners", "bokeh",
        "the set of (model, descriptor) pairs a list or dict property value points back at",
        "scrubbing discarded documents' models (nvdash.live.gc_policy)",
        "the back-references make the reference cycles that keep a discarded document alive"),
    Internal(
        "bokeh.server.views.session_handler.SessionHandler.get_session", "bokeh",
        "the coroutine DocHandler.get and AutoloadJsHandler.get await for the request's session; it raises "
        "ProtocolError on an empty session id",
        "bad session ids and tokens answered with 400, not 500 (nvdash.live.preflight)",
        "Bokeh offers no hook for its per-dashboard handlers, so they are subclassed"),
    Internal(
        "bokeh.server.views.autoload_js_handler.AutoloadJsHandler.options", "bokeh",
        "answers a CORS preflight by echoing the request's Origin header (KeyError, a 500, without one)",
        "a preflight without Origin answered with 400 (nvdash.live.preflight)",
        "Bokeh offers no hook for its per-dashboard handlers, so they are subclassed"),
    Internal(
        "tornado.web.Application.wildcard_router", "tornado",
        "the router holding the application's handlers as Rule objects whose target may be replaced (Bokeh's "
        "DocHandler, AutoloadJsHandler and WSHandler routes are there)",
        "batched websocket writes (nvdash.live.ws_batch) and refused bad page requests (nvdash.live.preflight)",
        "neither Bokeh nor Tornado offers a way to change a route's handler class"),
    Internal(
        "tornado.web.Application.find_handler", "tornado",
        "looked up on the application instance for every request, so an instance attribute takes every request",
        "the door: Host check, token redirect, NUL-in-path refusal (nvdash.server.door)",
        "Bokeh makes the application, so it cannot be subclassed"),
    Internal(
        "tornado.iostream.BaseIOStream._total_write_index", "tornado",
        "bytes ever queued for writing, with _total_write_done_index the bytes ever written to the socket",
        "backpressure (nvdash.live.backpressure) and stalled-viewer closing (nvdash.live.stalled)",
        "a stream does not say how much of what it was given it still holds"),
    Internal(
        "tornado.websocket.WebSocketProtocol13._compressor", "tornado",
        "None unless the connection negotiated per-message compression; frames of an uncompressed, unmasked "
        "connection may be written to its stream as they are",
        "batched websocket writes (nvdash.live.ws_batch)",
        "the protocol does not say whether it compresses"),
)
"""Every Bokeh and Tornado internal nvdash relies on."""

_BY_NAME = {internal.name: internal for internal in INTERNALS}


def internal(name: str) -> Internal:
    """The entry called ``name`` (a ``KeyError`` names an internal nobody listed)."""
    return _BY_NAME[name]


def tornado_app(server: Server) -> BokehTornado:
    """The Bokeh server's Tornado application (``Server._tornado``)."""
    application: BokehTornado = server._tornado
    return application


def http_server(server: Server) -> HTTPServer:
    """The Bokeh server's Tornado HTTP server (``Server._http``)."""
    http: HTTPServer = server._http
    return http


def server_connections(server: Server) -> list[ServerConnection]:
    """Every connection the Bokeh server holds now (``BokehTornado._clients``; none when unreadable)."""
    application: Any = getattr(server, "_tornado", None)
    return list(getattr(application, "_clients", ()))


def websocket_origins(server: Server) -> set[str]:
    """The set of websocket origins the server accepts, which it consults at each connection."""
    return tornado_app(server).websocket_origins


def connection_websocket(connection: Any) -> WebSocketHandler | None:
    """A Bokeh connection's websocket handler (``ServerConnection._socket``); ``None`` when it has none."""
    handler = getattr(connection, "_socket", None)
    return handler if isinstance(handler, WebSocketHandler) else None


def session_connections(session: Any) -> list[ServerConnection]:
    """The connections subscribed to a Bokeh ``ServerSession`` (``_subscribed_connections``)."""
    connections: Iterable[ServerConnection] = getattr(session, "_subscribed_connections", ())
    return list(connections)


def route_rules(server: Server) -> list[Rule]:
    """The Tornado application's routing rules (``wildcard_router.rules``), whose targets may be replaced."""
    rules: list[Rule] = tornado_app(server).wildcard_router.rules
    return rules


def replace_route_targets(server: Server,
                          replacements: Mapping[type[RequestHandler], type[RequestHandler]]) -> int:
    """Point every route whose handler class is a key of ``replacements`` at its value; returns how many."""
    changed = 0
    for rule in route_rules(server):
        replacement = replacements.get(rule.target)
        if replacement is not None:
            rule.target = replacement
            changed += 1
    return changed


def write_indexes(stream: BaseIOStream) -> tuple[int, int]:
    """Bytes ever queued on ``stream`` and bytes ever written to its socket (0, 0 when unreadable)."""
    queued = int(getattr(stream, "_total_write_index", 0))
    written = int(getattr(stream, "_total_write_done_index", 0))
    return queued, written


def compresses(protocol: WebSocketProtocol) -> bool:
    """Whether a websocket connection negotiated per-message compression (``_compressor``)."""
    return getattr(protocol, "_compressor", None) is not None


def property_value_maps(model: Any) -> tuple[dict[str, Any], ...]:
    """A Bokeh model's dicts of property values: set, unstable defaults, unstable themed."""
    return model._property_values, model._unstable_default_values, model._unstable_themed_values


def forget_owners(container: Any) -> None:
    """Make a Bokeh property value container forget the models it belongs to (``_owners``)."""
    container._owners.clear()


def document_gc(document_module: types.ModuleType) -> Any:
    """What Bokeh's document module calls ``gc`` (the ``gc`` module unless replaced)."""
    return getattr(document_module, "gc", None)


def set_document_gc(document_module: types.ModuleType, collector: Any) -> None:
    """Make Bokeh's ``Document.destroy`` collect through ``collector`` instead of the ``gc`` module."""
    document_module.gc = collector  # type: ignore[attr-defined]
