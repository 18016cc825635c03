"""Starting and stopping the whole thing: hardware, store, sampler, server, signals."""

from __future__ import annotations

import errno
import faulthandler
import logging
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path
from types import FrameType

from nvdash import live
from nvdash.accounting.accountant import Accountant
from nvdash.accounting.report import AccountingBook
from nvdash.cluster import ClusterRuntime, open_cluster
from nvdash.cluster.access import CredentialsError
from nvdash.health.events import EventDetector
from nvdash.health.quota_judge import watch as watch_quotas
from nvdash.history.database import HistoryError
from nvdash.metrics.counters import CountersError
from nvdash.sampling.cgroups import pod_names_from_logs
from nvdash.sampling.hardware import Hardware, open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.kubelet import PodResourcesClient, PodResourcesWatcher
from nvdash.sampling.notebooks import NotebookTracker
from nvdash.sampling.records import GpuEvent, Inventory
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.usage import UsageCollector
from nvdash.sampling.user_names import NameResolver
from nvdash.server.access import dashboard_token, is_loopback, start_url
from nvdash.server.app import WILDCARD_HOSTS, Runtime, make_server
from nvdash.server.history_setup import open_history, open_replay
from nvdash.server.metrics_handler import MetricsSetup, metrics_setup
from nvdash.server.simulation_api import simulation_routes
from nvdash.settings import Settings
from nvdash.store import Store
from nvdash.supervision import Supervisor


class StartupError(Exception):
    """The server could not start; the message is one line for the user."""


def _usage_collector(settings: Settings, hardware: Hardware, supervisor: Supervisor,
                     names: NameResolver) -> UsageCollector | None:
    """The process/pod/MIG collector (its kubelet watcher started), or ``None`` when turned off."""
    if settings.process_interval_s <= 0:
        return None
    watcher = PodResourcesWatcher(PodResourcesClient(settings.kubelet_socket), supervisor=supervisor)
    pod_log_dir = Path(settings.pod_log_dir)
    watcher.start()
    hardware.on_close(watcher.stop)
    return UsageCollector(hardware.gpus, HostProcessTable(names=names), watcher,
                          lambda: pod_names_from_logs(pod_log_dir))


def _notebooks(settings: Settings) -> NotebookTracker | None:
    """The join of the Jupyter server's kernels to the GPU processes, when nvdash was given its kernels file and
    reads the GPU processes (without them, ``/api/notebooks.json`` says so)."""
    if settings.jupyter_kernels is None or settings.process_interval_s <= 0:
        return None
    return NotebookTracker(settings.jupyter_kernels)


def _accountant(settings: Settings, inventory: Inventory, names: NameResolver) -> Accountant:
    """The accountant of the GPUs found, following the job-mapping directory when one was given."""
    return Accountant({gpu.index: gpu.uuid for gpu in inventory.gpus},
                      job_mapping_dir=Path(settings.job_mapping_dir) if settings.job_mapping_dir else None,
                      idle_after_s=settings.idle_after_s, retention_s=settings.accounting_retention_s, names=names)


def _live_runtime(settings: Settings) -> tuple[Hardware, Runtime]:
    supervisor = Supervisor()
    try:
        hardware = open_hardware(settings.simulate, seed=settings.seed, faults=settings.faults,
                                 process_file=settings.fake_process_file)
    except ValueError as error:
        raise StartupError(str(error)) from None
    try:
        metrics = _metrics(settings, hardware.inventory)
    except StartupError:
        hardware.close()
        raise
    store = Store(hardware.inventory, capacity=settings.live_samples)
    names = NameResolver(supervisor=supervisor)
    names.start()
    hardware.on_close(names.stop)
    accountant = _accountant(settings, hardware.inventory, names)
    store.add_listener(accountant)
    watch_quotas(store)
    try:
        history = open_history(settings, store, accountant, supervisor)
    except HistoryError as error:
        hardware.close()
        raise StartupError(f"{error} (or start with --no-history)") from None
    sampler = Sampler(
        store,
        hardware.host,
        hardware.gpus,
        interval_s=settings.interval_s,
        derive_events=EventDetector(hardware.inventory),
        usage=_usage_collector(settings, hardware, supervisor, names),
        usage_interval_s=settings.process_interval_s,
        supervisor=supervisor,
        wall_clock=history.clock,
        notebooks=_notebooks(settings),
    )
    gpus = hardware.gpus
    xid_status = "not started"
    if gpus is not None:

        def record(event: GpuEvent) -> None:
            store.add_events([event])

        xid_status = gpus.watch_xids(record, supervisor) or "watching"
    runtime = Runtime(
        store=store,
        sampler=sampler,
        clock=history.clock,
        nvml_calls=(lambda: gpus.calls) if gpus is not None else (lambda: 0),
        xid_status=xid_status,
        history=history,
        metrics=metrics,
        cluster=_cluster(settings, supervisor),
        accounting=AccountingBook(accountant, history.connect, clock=history.clock),
        supervisor=supervisor,
    )
    return hardware, runtime


def _metrics(settings: Settings, inventory: Inventory) -> MetricsSetup:
    """The ``/metrics`` setup; raises :class:`StartupError` for an unusable counters file."""
    try:
        metrics, unknown = metrics_setup(settings, inventory.host.hostname)
    except CountersError as error:
        raise StartupError(str(error)) from None
    if unknown:
        logging.getLogger(__name__).warning("the counters file names fields nvdash does not read, left out: %s",
                                            ", ".join(unknown))
    return metrics


def _cluster(settings: Settings, supervisor: Supervisor) -> ClusterRuntime | None:
    """The cluster pages' Prometheus client (unstarted) when ``--prometheus`` was given, else ``None``."""
    if settings.prometheus_url is None:
        return None
    try:
        return open_cluster(settings.prometheus_url, supervisor=supervisor, access=settings.prometheus_access)
    except CredentialsError as error:
        raise StartupError(str(error)) from None


def start_runtime(settings: Settings) -> tuple[Hardware | None, Runtime]:
    """Open the hardware, the store, the history, the XID watch and the (unstarted) sampler; for a replay, only the
    recording. The runtime is complete when returned (nothing is set on it later)."""
    if settings.replay is None:
        return _live_runtime(settings)
    supervisor = Supervisor()
    try:
        store, history = open_replay(settings.replay, settings.live_samples, supervisor)
    except HistoryError as error:
        raise StartupError(str(error)) from None
    try:
        metrics = _metrics(settings, store.inventory)
    except StartupError:
        history.close()
        raise
    runtime = Runtime(store=store, sampler=None, clock=history.clock, history=history,
                      xid_status="replay: no live events", metrics=metrics, cluster=_cluster(settings, supervisor),
                      accounting=AccountingBook(connection=history.connect, clock=history.clock),
                      supervisor=supervisor)
    return None, runtime


def _describe(runtime: Runtime) -> str:
    inventory = runtime.store.inventory
    if runtime.history.replay:
        return f"{runtime.history.status} ({len(inventory.gpus)} GPUs recorded)"
    if inventory.gpus:
        names = sorted({gpu.name for gpu in inventory.gpus})
        kind = f"simulated ({inventory.simulated}) " if inventory.simulated else ""
        return f"{len(inventory.gpus)} {kind}GPU{'s' if len(inventory.gpus) != 1 else ''}: {', '.join(names)}"
    cluster = f" and the cluster views over {runtime.cluster.client.url}" if runtime.cluster is not None else ""
    return f"no GPU ({inventory.nvml_error}); serving the machine dashboard{cluster} only"


def with_token(settings: Settings) -> Settings:
    """The settings with the token the dashboards will require (generated when none was given and the server
    listens beyond loopback); logs a warning when ``--no-token`` leaves a public address open."""
    if settings.unix_socket is not None:
        return settings
    if settings.no_token and not is_loopback(settings.host):
        logging.getLogger(__name__).warning(
            "--no-token: the dashboards on %s port %s are open to anyone who can reach this machine",
            settings.host or "every address", settings.port)
    return replace(settings, token=dashboard_token(settings.token, settings.no_token, settings.host))


def start_lines(settings: Settings) -> list[str]:
    """The lines that tell where to open the dashboards: with the token, and https when serving TLS."""
    scheme = "https" if settings.certfile else "http"
    wildcard = settings.host in WILDCARD_HOSTS
    host = "localhost" if wildcard or settings.host == "127.0.0.1" else settings.host
    lines = [f"nvdash: open {start_url(scheme, host, settings.port, settings.prefix, settings.token)}"]
    name = next((name for name in (socket.getfqdn(), socket.gethostname()) if name and not is_loopback(name)), None)
    if wildcard and name is not None:
        lines.append(f"nvdash: from other machines: "
                     f"{start_url(scheme, name, settings.port, settings.prefix, settings.token)}")
    return lines


def serve(settings: Settings, listener: socket.socket | None = None) -> int:
    """Run the server until interrupted; returns the exit status. ``listener``: see :func:`make_server`."""
    logging.basicConfig(level=logging.WARNING, format="nvdash: %(levelname)s: %(message)s")
    settings = with_token(settings)
    hardware, runtime = start_runtime(settings)
    try:
        try:
            server = make_server(settings, runtime, listener=listener,
                                 extra_routes=simulation_routes(hardware.fake if hardware else None, runtime.sampler))
        except OSError as error:
            if settings.unix_socket is not None:
                reason = error.strerror or str(error)
                raise StartupError(f"cannot listen on unix socket {settings.unix_socket}: {reason}") from None
            if error.errno == errno.EADDRINUSE:
                raise StartupError(
                    f"port {settings.port} on {settings.host} is already in use; choose another with --port"
                ) from None
            raise StartupError(f"cannot listen on {settings.host}:{settings.port}: {error.strerror}") from None
        live.install(server, runtime.viewers, settings.viewer_stall_timeout_s)
        if runtime.sampler is not None:
            runtime.sampler.start()
        if runtime.cluster is not None:
            runtime.cluster.start()
        server.start()
        runtime.loop_monitor.start(server.io_loop)
        print(f"nvdash: {_describe(runtime)}", flush=True)
        if settings.unix_socket is not None:
            print(f"nvdash: listening on unix socket {settings.unix_socket} (this user only), "
                  f"serving {settings.prefix}/", flush=True)
        else:
            for line in start_lines(settings):
                print(line, flush=True)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            server.io_loop.add_callback_from_signal(server.io_loop.stop)

        signal.signal(signal.SIGTERM, on_signal)
        # `kill -USR1 PID` prints every thread's stack to stderr: what a stuck server is doing, without stopping it.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        try:
            server.io_loop.start()
        except KeyboardInterrupt:
            print("nvdash: stopped", file=sys.stderr)
        runtime.loop_monitor.stop()
        runtime.viewers.stop()
        server.stop()
    finally:
        if runtime.sampler is not None:
            runtime.sampler.stop()
        if runtime.cluster is not None:
            runtime.cluster.close()
        runtime.history.close()
        if hardware is not None:
            hardware.close()
    return 0
