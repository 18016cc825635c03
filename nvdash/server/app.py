"""Builds the one Bokeh server: a route per available dashboard plus the server's own pages."""

from __future__ import annotations

import errno
import math
import os
import socket
import stat
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.document import Document
from bokeh.server.auth_provider import AuthProvider, NullAuth
from bokeh.server.server import Server
from bokeh.settings import settings as bokeh_settings
from tornado.ioloop import IOLoop
from tornado.web import RequestHandler

from nvdash import live
from nvdash.accounting.report import AccountingBook
from nvdash.apps import APPS, AppContext, AppSpec, reads_prometheus, unavailable_reason
from nvdash.apps.stale_banner import add_stale_banner
from nvdash.cluster import ClusterRuntime
from nvdash.freshness import STALE_MIN_S, Stale, iso_time, merge, stale_since
from nvdash.health.status import GpuHealth, evaluate
from nvdash.history.csv_io import export_chunks
from nvdash.history.query import SqliteHistory
from nvdash.live import internals
from nvdash.live.stalled import StalledViewers
from nvdash.sampling.fake.profiles import profile_names
from nvdash.sampling.host_source import interface_addresses
from nvdash.sampling.sampler import Sampler
from nvdash.server import door
from nvdash.server.access import host_of, is_loopback, url_host
from nvdash.server.accounting_api import AccountingCsvHandler, AccountingJsonHandler
from nvdash.server.auth import Gate, TokenAuth, admitted, gate_of_server
from nvdash.server.cluster_accounting_api import cluster_accounting_routes
from nvdash.server.export_gate import ExportGate
from nvdash.server.history_api import ExportCsvHandler, HistoryJsonHandler, history_health
from nvdash.server.history_setup import HistoryRuntime
from nvdash.server.loop_monitor import LoopMonitor, scheduled_timers
from nvdash.server.metrics_handler import MetricsHandler, MetricsSetup
from nvdash.server.notebooks_json import notebooks_json
from nvdash.server.pages import (
    BadQuery,
    HtmlHandler,
    JsonAnswer,
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
from nvdash.supervision import Supervisor

WILDCARD_HOSTS = ("0.0.0.0", "::", "")
UNIX_SOCKET_ORIGIN = "localhost"
"""The websocket origin a server on a unix socket accepts unless told otherwise."""


@dataclass(frozen=True)
class Runtime:
    """What the server serves and ``/health`` reports on: the sampler, the store, NVML call counts, the event loop.

    Built once, complete, and never changed after (the parts it holds change their own state)."""

    store: Store
    sampler: Sampler | None
    """``None`` when replaying a recording."""
    clock: Callable[[], float] = time.time
    """"Now" for every verdict on freshness and health (the index page, ``/api/snapshot.json``, the dashboards): the
    wall clock, or a replay's recording end, so that each view judges the same state the same way."""
    nvml_calls: Callable[[], int] = lambda: 0
    loop_monitor: LoopMonitor = field(default_factory=LoopMonitor)
    viewers: StalledViewers = field(default_factory=StalledViewers)
    """Watches the websockets; closes those whose viewer stopped reading."""
    started_at: float = field(default_factory=time.time)
    """When this server process started (wall clock); a client sees a restart by its change."""
    xid_status: str = "not started"
    """``watching``, or why XID events are not watched."""
    history: HistoryRuntime = field(default_factory=HistoryRuntime)
    metrics: MetricsSetup | None = None
    """What ``/metrics`` exports (``None``: the default counters file, every label)."""
    cluster: ClusterRuntime | None = None
    """The cluster over Prometheus (``--prometheus``), else ``None``."""
    accounting: AccountingBook = field(default_factory=AccountingBook)
    """Where the accounting is read (the history's table, else the accountant's memory)."""
    supervisor: Supervisor = field(default_factory=Supervisor)
    """Runs and watches the background threads (their deaths and restarts are on ``/health``)."""


def is_socket(path: str) -> bool:
    """Whether ``path`` is a unix socket now (a Kubernetes node's kubelet pod-resources socket, for the pods page)."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def websocket_origins(settings: Settings, addresses: Callable[[], list[str]] = interface_addresses) -> list[str]:
    """The browser origins allowed to open websockets: the given ones, else this server's own addresses.

    A server on a wildcard address is reached by any of this machine's names and ``addresses`` (IPv6 ones in
    brackets, as a browser writes them in the Origin).

    On a unix socket the own address is ``localhost`` (the ``Host`` that clients of a socket send, and the Origin
    the Jupyter proxy presents): only this user can connect to the socket at all.
    """
    if settings.allow_websocket_origin:
        return list(settings.allow_websocket_origin)
    if settings.unix_socket:
        return [UNIX_SOCKET_ORIGIN]
    port = settings.port
    origins = [f"localhost:{port}", f"127.0.0.1:{port}"]
    if settings.host in WILDCARD_HOSTS:
        origins += [f"{socket.gethostname()}:{port}", f"{socket.getfqdn()}:{port}"]
        origins += [f"{url_host(address)}:{port}" for address in addresses()]
    else:
        origins.append(f"{url_host(settings.host)}:{port}")
    return list(dict.fromkeys(origins))


def allowed_hosts(settings: Settings, addresses: Callable[[], list[str]] = interface_addresses
                  ) -> frozenset[str] | None:
    """The names (besides loopback ones) a request's ``Host`` may give; ``None``: any.

    Any, when a token is required (a request without it is refused anyway) or on a unix socket (no browser reaches
    one directly; Jupyter's proxy forwards the browser's own ``Host`` and checks it itself) or when told ``*``.
    Otherwise the bound address (every address of this machine when bound to a wildcard), this machine's names when
    it listens beyond loopback, ``--allow-host`` names and the hosts of ``--allow-websocket-origin``.
    """
    if settings.token is not None or settings.unix_socket is not None:
        return None
    names = {host_of(name) for name in settings.allow_hosts}
    names |= {"*" if origin.strip() == "*" else host_of(origin.partition("://")[2] or origin)
              for origin in settings.allow_websocket_origin}
    if "*" in names:
        return None
    if settings.host in WILDCARD_HOSTS:
        names |= {host_of(url_host(address)) for address in addresses()}
    else:
        names.add(host_of(url_host(settings.host)))
    if not is_loopback(settings.host):
        names |= {host_of(socket.gethostname()), host_of(socket.getfqdn())}
    names.discard("")
    return frozenset(names)


def _application(spec: AppSpec, context: AppContext) -> Application:
    guard = context.staging.guard if context.staging is not None else nullcontext

    def build(doc: Document) -> None:
        with guard():
            spec.build(doc, context)
            if not reads_prometheus(spec, context.cluster is not None):  # Prometheus's readings, not this sampler's
                add_stale_banner(doc, context)

    return Application(FunctionHandler(build))


def sampler_json(sampler: Sampler | None) -> dict[str, Any] | None:
    """``/health``'s ``sampler`` part: its interval, sweeps, errors and when it last completed a round."""
    if sampler is None:
        return None
    stats = sampler.stats()
    return {
        "interval_s": sampler.interval_s,
        "sweeps": stats.sweeps,
        "errors": stats.errors,
        "last_sweep_ms": round(stats.last_sweep_s * 1000, 3),
        "max_sweep_ms": round(stats.max_sweep_s * 1000, 3),
        "skipped_device_reads": stats.skipped_device_reads,
        "last_sweep_at": stats.last_sweep_at,
        "last_process_reading_at": stats.last_usage_at,
        "relearned": stats.relearned,
        "last_relearn": None if stats.last_relearn is None else {
            "gpu": stats.last_relearn.gpu, "reason": stats.last_relearn.reason, "at": stats.last_relearn.at},
    }


def _since(text: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise BadQuery(f"since must be an earlier answer's event_loop.at (a number), not {text!r}")
    return value


def stuck_parts(runtime: Runtime) -> list[Stale]:
    """The parts that stopped completing rounds: the sampler's sweeps or process readings, supervised threads overdue
    for at least ``STALE_MIN_S`` (none for a replay, which has no sampler)."""
    if runtime.sampler is None:
        return []
    overdue = [Stale(item.name, item.since_wall) for item in runtime.supervisor.overdue() if item.age_s > STALE_MIN_S]
    return merge(runtime.sampler.stale(), overdue)


def index_verdict(runtime: Runtime, interval_s: float) -> tuple[tuple[GpuHealth, ...], float | None]:
    """What the index page judges, at ``runtime.clock()`` (the clock the dashboards and the snapshot API judge by):
    each GPU's health, and since when readings stopped arriving (``None``: fresh, or a replay)."""
    now = runtime.clock()
    store = runtime.store
    latest = store.latest()
    health = evaluate(store.inventory, latest, store.events(), now, idle=runtime.accounting.idle()[1])
    stale = None
    if runtime.sampler is not None:
        stale = stale_since(latest.time_s if latest is not None else runtime.started_at, now, interval_s)
    return health, stale


STALE_STATUS = 503
"""``/health``'s status while a part is stuck: a liveness probe restarts the server."""


def health(
    runtime: Runtime, handler: RequestHandler, server: Callable[[], Server | None], routes: list[str]
) -> dict[str, Any] | JsonAnswer:
    """The numbers a benchmark or a monitor wants: sampler, store, NVML calls, event loop, sessions.

    Without the token a server requires, only ``{"status": "ok"}`` (what a liveness probe needs). While a part is
    stuck (:func:`stuck_parts`) the answer is a 503 with ``"status": "stale"`` and ``stuck``: the parts' names (with
    the token also since when, ISO 8601 and Unix time).
    ``?since=T``, with ``T`` an earlier answer's ``event_loop.at``, adds the longest event-loop stall after ``T``.
    """
    stuck = stuck_parts(runtime)
    status = "stale" if stuck else "ok"
    if not admitted(handler):
        brief: dict[str, Any] = {"status": status}
        if stuck:
            brief["stuck"] = [item.part for item in stuck]
            return JsonAnswer(brief, STALE_STATUS)
        return brief
    since = _since(handler.get_query_argument("since", ""))
    current = server()
    sessions = 0
    if current is not None:
        sessions = sum(len(current.get_sessions(route)) for route in routes)
    result: dict[str, Any] = {
        "status": status,
        "stuck": [{"part": item.part, "since": iso_time(item.since_wall), "since_epoch": item.since_wall}
                  for item in stuck],
        "started_at": runtime.started_at,
        "sampler": sampler_json(runtime.sampler),
        "history": {**history_health(runtime.history), **runtime.history.health()},
        "accounting": runtime.accounting.status(),
        "store": {"rows": len(runtime.store), "capacity": runtime.store.capacity, "last_seq": runtime.store.last_seq},
        "nvml_calls": runtime.nvml_calls(),
        "event_loop": runtime.loop_monitor.report(since=since),
        "sessions": sessions,
        "websockets": runtime.viewers.report(),
        "timers": 0 if current is None else scheduled_timers(current.io_loop),
        "xid_events": runtime.xid_status,
        "events": runtime.store.event_seq,
        "threads": runtime.supervisor.report(),
    }
    if runtime.cluster is not None:
        result["cluster"] = cluster_health(runtime.cluster)
    return JsonAnswer(result, STALE_STATUS) if stuck else result


def cluster_health(cluster: ClusterRuntime) -> dict[str, Any]:
    """The cluster pages' Prometheus: its URL, the last refresh's failure (``None``: it answered), when it last
    answered (epoch seconds, ``None``: never), how long the last refresh took, and what it held: nodes, GPUs, and
    whether the nodes were aggregated in PromQL (fleet size) with how many read GPU by GPU."""
    state = cluster.poller.state()
    return {"prometheus": cluster.client.url, "error": state.error, "last_answer_at": state.ok_time_s,
            "refreshes": state.generation, "refresh_ms": round(state.queries_ms, 1), "nodes": len(state.nodes),
            "gpus": state.gpu_count, "aggregated": state.fleet,
            "nodes_read_per_gpu": len({gpu.hostname for gpu in state.gpus})}


def _listen_on(settings: Settings, *, own_socket: bool = False) -> dict[str, Any]:
    """Bokeh's arguments for where to listen; raises ``OSError`` when the unix socket's path is taken.

    Bokeh (Tornado) replaces whatever socket file is at the path, so a live server's socket is checked for first
    (unless the socket there is this process's own, ``own_socket``).
    """
    path = settings.unix_socket
    if path is None:
        return {"address": settings.host, "port": settings.port}
    if own_socket:
        return {"unix_socket": path + BOKEH_SOCKET_SUFFIX}
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return {"unix_socket": path}
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, "a file that is not a socket is in the way")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except TimeoutError:
            pass
        except OSError:
            return {"unix_socket": path}  # a stale socket file: nobody listens on it
    raise OSError(errno.EADDRINUSE, "another server is listening on it")


BOKEH_SOCKET_SUFFIX = ".bokeh"


def make_server(settings: Settings, runtime: Runtime, io_loop: IOLoop | None = None,
                listener: socket.socket | None = None,
                extra_routes: Sequence[tuple[str, type[RequestHandler], dict[str, Any]]] = ()) -> Server:
    """A Bokeh server (bound, not started) serving every available dashboard and the server's pages.

    Listens on ``settings.unix_socket`` (a file of mode 0600) when given, else on ``host``:``port``. Raises
    ``OSError`` when that cannot be bound. ``listener``: a socket this process bound at ``settings.unix_socket``
    before starting up (the proxy's entry point does, so that requests wait rather than fail while nvdash starts);
    it is served, and left open when the server stops. ``extra_routes``: more handlers (the simulation's own).
    """
    bokeh_settings.resources.set_value("server")
    store = runtime.store
    inventory = store.inventory
    history = runtime.history
    context = AppContext(store=store, interval_s=settings.interval_s, history=history.backend,
                         history_executor=history.executor, clock=runtime.clock, replay=history.replay,
                         cluster=runtime.cluster, accounting=runtime.accounting,
                         staging=live.staging())
    cluster = runtime.cluster is not None
    local_history = (isinstance(history.backend, SqliteHistory) and settings.process_interval_s > 0
                     and is_socket(settings.kubelet_socket))
    notebooks = settings.jupyter_kernels is not None and settings.process_interval_s > 0
    prefix = settings.prefix
    applications: dict[str, Application] = {}
    unavailable_routes: list[tuple[str, type[RequestHandler], dict[str, Any]]] = []
    for spec in APPS:
        reason = unavailable_reason(spec, inventory, cluster, local_history, notebooks)
        if reason is None:
            applications[spec.route] = _application(spec, context)
        else:
            page = render_unavailable(spec, reason, prefix)
            unavailable_routes.append(
                (spec.route + "/?", HtmlHandler, {"render": (lambda page=page: page), "status": 404})
            )

    def index_page() -> str:
        health, stale = index_verdict(runtime, settings.interval_s)
        return render_index(inventory, prefix, settings.interval_s, store.capacity, ", ".join(profile_names()),
                            health=health, history=history.status, replay=history.replay, cluster=cluster,
                            local_history=local_history, notebooks=notebooks, stale_since=stale)

    metrics = runtime.metrics or MetricsSetup.default(inventory.host.hostname)
    holder: list[Server] = []
    extra: list[tuple[str, type[RequestHandler], dict[str, Any]]] = [
        (r"/", HtmlHandler, {"render": index_page}),
        (r"/index\.json", JsonHandler, {"produce": lambda _h: index_json(inventory, replay=history.replay,
                                                                                   cluster=cluster,
                                                                                   local_history=local_history,
                                                                                   notebooks=notebooks)}),
        (r"/info\.json", JsonHandler, {"produce": lambda _h: info_json(inventory, history_health(history))}),
        (r"/metrics", MetricsHandler, {"store": store, "counters": metrics.counters, "options": metrics.options,
                                        "token": settings.metrics_token, "accounting": runtime.accounting,
                                        "clock": runtime.clock}),
        (r"/api/history\.json", HistoryJsonHandler, {"history": history}),
        (r"/export\.csv", ExportCsvHandler, {"history": history, "gate": ExportGate(), "export": export_chunks}),
        (r"/api/snapshot\.json", JsonHandler,
         {"produce": lambda _h: snapshot_json(store, runtime.clock, idle=runtime.accounting.idle()[1])}),
        (r"/api/processes\.json", JsonHandler, {"produce": lambda _h: processes_json(store)}),
        (r"/api/notebooks\.json", JsonHandler, {"produce": lambda _h: notebooks_json(store, settings)}),
        (r"/api/accounting\.json", AccountingJsonHandler, {"book": runtime.accounting, "executor": history.executor}),
        (r"/api/accounting\.csv", AccountingCsvHandler, {"book": runtime.accounting, "executor": history.executor}),
        (
            r"/health",
            JsonHandler,
            {"produce": lambda h: health(runtime, h, lambda: holder[0] if holder else None, list(applications)),
             "guarded": False},
        ),
        *cluster_accounting_routes(runtime.cluster),
        *extra_routes,
        *unavailable_routes,
    ]
    origins = websocket_origins(settings)
    server = Server(
        applications,
        io_loop=io_loop,
        **_listen_on(settings, own_socket=listener is not None),
        prefix=prefix,
        allow_websocket_origin=[origin for origin in origins if not origin.startswith("[")],
        auth_provider=_auth_provider(settings),
        ssl_certfile=settings.certfile,
        ssl_keyfile=settings.keyfile,
        extra_patterns=extra,
        use_index=False,
        num_procs=1,
        unused_session_lifetime_milliseconds=10_000,
        check_unused_sessions_milliseconds=5_000,
        # Bokeh copies the request's headers and cookies into the session token it writes into each page;
        # behind Jupyter's proxy those are Jupyter's login cookie and token. The apps need neither.
        include_headers=[],
        include_cookies=[],
        http_server_kwargs=door.http_server_kwargs(settings.connection_timeout_s),
        websocket_max_message_size=door.MAX_BUFFER_BYTES,
    )
    if listener is not None:
        # Bokeh's Server binds its own socket (beside the path, unlinked at once: nobody connects to it) and offers
        # no public way to add one to its Tornado HTTPServer. A duplicate: Tornado closes its sockets on stop, and
        # the caller's listener stays open for the next nvdash.
        os.unlink(f"{settings.unix_socket}{BOKEH_SOCKET_SUFFIX}")
        internals.http_server(server).add_sockets([listener.dup()])
    _allow_bracketed_origins(server, [origin for origin in origins if origin.startswith("[")])
    door.install(server, allowed_hosts(settings), gate_of_server(server))
    holder.append(server)
    return server


def _auth_provider(settings: Settings) -> AuthProvider:
    """The token check of Bokeh's pages and websockets (and, through it, of nvdash's own handlers)."""
    if settings.token is None:
        return NullAuth()
    return TokenAuth(Gate(settings.token, settings.port, settings.prefix))


def _allow_bracketed_origins(server: Server, origins: list[str]) -> None:
    """Allow IPv6 origins (``[fd00::2]:8000``), which Bokeh's option parser refuses (it splits on ``:``).

    Bokeh's websocket handler checks an Origin by exact membership in its application's set first, so adding
    them there works; Bokeh offers no public way to reach that set from the ``Server``.
    """
    if origins:
        internals.websocket_origins(server).update(origins)
