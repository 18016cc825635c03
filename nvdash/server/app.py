"""Builds the one Bokeh server: a route per available dashboard plus the server's own pages."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.document import Document
from bokeh.server.server import Server
from bokeh.settings import settings as bokeh_settings
from tornado.ioloop import IOLoop
from tornado.web import RequestHandler

from nvdash.apps import APPS, AppContext, AppSpec, unavailable_reason
from nvdash.cluster import ClusterRuntime
from nvdash.health.status import evaluate
from nvdash.history.csv_io import export_text
from nvdash.sampling.sampler import Sampler
from nvdash.server.history_api import ExportCsvHandler, HistoryJsonHandler, history_health
from nvdash.server.history_setup import HistoryRuntime
from nvdash.server.loop_monitor import LoopMonitor
from nvdash.server.metrics_handler import MetricsHandler, MetricsSetup
from nvdash.server.pages import (
    HtmlHandler,
    JsonHandler,
    index_json,
    info_json,
    render_index,
    render_unavailable,
)
from nvdash.server.snapshot import snapshot_json
from nvdash.server.usage_json import processes_json
from nvdash.settings import Settings
from nvdash.store import Store

WILDCARD_HOSTS = ("0.0.0.0", "::", "")
PROFILES_HINT = "dgx-h100, dgx-a100, dgx-b200, a100-pcie-2, t4"


@dataclass
class Runtime:
    """What the health endpoint reports on: the sampler, the store, NVML call counts, the event loop."""

    store: Store
    sampler: Sampler | None
    """``None`` when replaying a recording."""
    nvml_calls: Callable[[], int] = lambda: 0
    fake_nvml_calls: Callable[[], int] | None = None
    loop_monitor: LoopMonitor = field(default_factory=LoopMonitor)
    started_at: float = field(default_factory=time.time)
    """When this server process started (wall clock); a client sees a restart by its change."""
    xid_status: str = "not started"
    """``watching``, or why XID events are not watched."""
    history: HistoryRuntime = field(default_factory=HistoryRuntime)
    metrics: MetricsSetup | None = None
    """What ``/metrics`` exports (``None``: the default counters file, every label)."""
    cluster: ClusterRuntime | None = None
    """The cluster over Prometheus (``--prometheus``), else ``None``."""


def websocket_origins(settings: Settings) -> list[str]:
    """The browser origins allowed to open websockets: the given ones, else this server's own addresses."""
    if settings.allow_websocket_origin:
        return list(settings.allow_websocket_origin)
    port = settings.port
    origins = [f"localhost:{port}", f"127.0.0.1:{port}"]
    if settings.host in WILDCARD_HOSTS:
        origins += [f"{socket.gethostname()}:{port}", f"{socket.getfqdn()}:{port}"]
    else:
        origins.append(f"{settings.host}:{port}")
    return list(dict.fromkeys(origins))


def _application(spec: AppSpec, context: AppContext) -> Application:
    def build(doc: Document) -> None:
        spec.build(doc, context)

    return Application(FunctionHandler(build))


def _sampler_json(sampler: Sampler | None) -> dict[str, Any] | None:
    if sampler is None:
        return None
    stats = sampler.stats()
    return {
        "interval_s": sampler.interval_s,
        "sweeps": stats.sweeps,
        "errors": stats.errors,
        "last_sweep_ms": round(stats.last_sweep_s * 1000, 3),
        "max_sweep_ms": round(stats.max_sweep_s * 1000, 3),
    }


def health(
    runtime: Runtime, handler: RequestHandler, server: Callable[[], Server | None], routes: list[str]
) -> dict[str, Any]:
    """The numbers a benchmark or a monitor wants: sampler, store, NVML calls, event loop, sessions."""
    reset = handler.get_query_argument("reset", "") == "1"
    current = server()
    sessions = 0
    if current is not None:
        sessions = sum(len(current.get_sessions(route)) for route in routes)
    result: dict[str, Any] = {
        "status": "ok",
        "started_at": runtime.started_at,
        "sampler": _sampler_json(runtime.sampler),
        "history": history_health(runtime.history),
        "store": {"rows": len(runtime.store), "capacity": runtime.store.capacity, "last_seq": runtime.store.last_seq},
        "nvml_calls": runtime.nvml_calls(),
        "event_loop": runtime.loop_monitor.report(reset_window=reset),
        "sessions": sessions,
        "xid_events": runtime.xid_status,
        "events": runtime.store.event_seq,
    }
    if runtime.fake_nvml_calls is not None:
        result["fake_nvml_calls"] = runtime.fake_nvml_calls()
    return result


def make_server(settings: Settings, runtime: Runtime, io_loop: IOLoop | None = None) -> Server:
    """A Bokeh server (bound, not started) serving every available dashboard and the server's pages.

    Raises ``OSError`` when the port cannot be bound.
    """
    bokeh_settings.resources.set_value("server")
    store = runtime.store
    inventory = store.inventory
    history = runtime.history
    context = AppContext(store=store, interval_s=settings.interval_s, history=history.backend,
                         history_executor=history.executor, clock=history.clock, replay=history.replay,
                         cluster=runtime.cluster)
    cluster = runtime.cluster is not None
    prefix = settings.prefix
    applications: dict[str, Application] = {}
    unavailable_routes: list[tuple[str, type[RequestHandler], dict[str, Any]]] = []
    for spec in APPS:
        reason = unavailable_reason(spec, inventory, cluster)
        if reason is None:
            applications[spec.route] = _application(spec, context)
        else:
            page = render_unavailable(spec, reason, prefix)
            unavailable_routes.append(
                (spec.route + "/?", HtmlHandler, {"render": (lambda page=page: page), "status": 404})
            )

    def index_page() -> str:
        health = evaluate(inventory, store.latest(), store.events(), time.time())
        return render_index(inventory, prefix, settings.interval_s, store.capacity, PROFILES_HINT, health=health,
                            history=history.status, replay=history.replay, cluster=cluster)

    metrics = runtime.metrics or MetricsSetup.default(inventory.host.hostname)
    holder: list[Server] = []
    extra: list[tuple[str, type[RequestHandler], dict[str, Any]]] = [
        (r"/", HtmlHandler, {"render": index_page}),
        (r"/index\.json", JsonHandler, {"produce": lambda _h: index_json(inventory, replay=history.replay,
                                                                                   cluster=cluster)}),
        (r"/info\.json", JsonHandler, {"produce": lambda _h: info_json(inventory, history_health(history))}),
        (r"/metrics", MetricsHandler, {"store": store, "counters": metrics.counters, "options": metrics.options,
                                        "token": settings.metrics_token}),
        (r"/api/history\.json", HistoryJsonHandler, {"history": history}),
        (r"/export\.csv", ExportCsvHandler, {"history": history, "export": export_text}),
        (r"/api/snapshot\.json", JsonHandler, {"produce": lambda _h: snapshot_json(store)}),
        (r"/api/processes\.json", JsonHandler, {"produce": lambda _h: processes_json(store)}),
        (
            r"/health",
            JsonHandler,
            {"produce": lambda h: health(runtime, h, lambda: holder[0] if holder else None, list(applications))},
        ),
        *unavailable_routes,
    ]
    server = Server(
        applications,
        io_loop=io_loop,
        address=settings.host,
        port=settings.port,
        prefix=prefix,
        allow_websocket_origin=websocket_origins(settings),
        extra_patterns=extra,
        use_index=False,
        num_procs=1,
        unused_session_lifetime_milliseconds=10_000,
        check_unused_sessions_milliseconds=5_000,
        # Bokeh copies the request's headers and cookies into the session token it writes into each page;
        # behind Jupyter's proxy those are Jupyter's login cookie and token. The apps need neither.
        include_headers=[],
        include_cookies=[],
    )
    holder.append(server)
    return server
