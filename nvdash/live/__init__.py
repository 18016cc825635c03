"""What makes many viewers cheap: the transport between the store and the browsers.

Per-document following of the store (:mod:`~nvdash.live.follow`), per-tick work shared by a route's sessions
(:mod:`~nvdash.live.ticks`), pages built in stages (:mod:`~nvdash.live.stages`), no updates for viewers that do
not read (:mod:`~nvdash.live.backpressure`) or cannot see the page (:mod:`~nvdash.live.visibility`), batched
websocket writes (:mod:`~nvdash.live.ws_batch`), closing stalled viewers (:mod:`~nvdash.live.stalled`), the
garbage-collection policy (:mod:`~nvdash.live.gc_policy`) and refusing bad page requests
(:mod:`~nvdash.live.preflight`). :func:`install` puts the server-wide parts on a Bokeh server;
:mod:`~nvdash.live.internals` lists the Bokeh and Tornado internals all of it relies on.

It sits below the dashboards (``nvdash.apps``) and the server (``nvdash.server``) and imports neither. Importing
this package loads nothing: the dashboards import its modules without Bokeh's server (which imports psutil).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bokeh.server.server import Server

    from nvdash.live.stages import Staging
    from nvdash.live.stalled import StalledViewers


def install(server: Server, viewers: StalledViewers, stall_timeout_s: float | None = None) -> None:
    """Make ``server`` (bound, its event loop not yet running) cheap for many viewers, once, before it serves:

    - its dashboards' pages and ``autoload.js`` refuse requests Bokeh would answer with a 500 (a 400 instead);
    - its websockets write each loop turn's messages with one socket write;
    - a discarded session's document is scrubbed and collected only now and then, the young generation is
      collected more rarely, and what is alive now is frozen out of the collector's sight;
    - ``viewers`` closes, every few seconds, the websockets that took nothing for ``stall_timeout_s``
      (``None``: its own timeout) and counts them for ``/health``; the caller stops it with the server.
    """
    from nvdash.live import gc_policy, preflight, ws_batch  # noqa: PLC0415 - see the module's docstring

    preflight.refuse_preflights_without_origin(server)
    ws_batch.batch_websocket_writes(server)
    gc_policy.install()
    gc_policy.tune_thresholds()
    gc_policy.freeze_startup_objects()
    viewers.start(server, stall_timeout_s)


def staging() -> Staging:
    """How a server's dashboards build heavy pages: in stages, each under the garbage-collection policy's
    page-building guard (no collection inside a building turn)."""
    from nvdash.live.gc_policy import building  # noqa: PLC0415 - see the module's docstring
    from nvdash.live.stages import Staging  # noqa: PLC0415

    return Staging(guard=building)
