"""The cluster over Prometheus: a client of its HTTP API, the cluster's state refreshed on one thread, and one
node's past readings behind the history interface. nvdash stores nothing of the cluster itself."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nvdash.cluster.access import Credentials, PrometheusAccess, tls_context
from nvdash.cluster.fleet_poller import FleetPoller
from nvdash.cluster.history import PrometheusHistory
from nvdash.cluster.poller import DEFAULT_REFRESH_S, ClusterPoller
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.selectors import SeriesScope
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)

QUERY_THREADS = 4


@dataclass
class ClusterRuntime:
    """What the cluster pages share: the client, the state poller, and the threads their range queries run on."""

    client: PrometheusClient
    poller: ClusterPoller
    scope: SeriesScope = field(default_factory=SeriesScope)
    """The host label and matchers of every series the cluster pages select."""
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=QUERY_THREADS, thread_name_prefix="nvdash-prom"))
    fleet: FleetPoller | None = None
    """The fleet page's day (XIDs, GPU counts a day ago) on its own slower round; made from the client if not given."""

    def __post_init__(self) -> None:
        if self.fleet is None:
            self.fleet = FleetPoller(self.client, scope=self.scope, supervisor=self.poller.supervisor)

    def history(self, hostname: str = "") -> PrometheusHistory:
        """A node's past readings (one per page: the page changes its node)."""
        return PrometheusHistory(self.client, hostname, self.scope)

    def start(self) -> None:
        """Start the pollers' threads (they ask Prometheus only while a cluster page is open)."""
        self.poller.start()
        if self.fleet is not None:
            self.fleet.start()

    def close(self) -> None:
        """Stop the poller and the query threads."""
        self.poller.stop()
        if self.fleet is not None:
            self.fleet.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)


def open_cluster(url: str, timeout_s: float | None = None, refresh_s: float = DEFAULT_REFRESH_S,
                 supervisor: Supervisor | None = None, access: PrometheusAccess | None = None) -> ClusterRuntime:
    """The cluster runtime for the Prometheus-API endpoint at ``url`` (nothing is asked yet), reached as ``access``
    says (its credential files are read now: raises :class:`~nvdash.cluster.access.CredentialsError`); its poller's
    thread runs under ``supervisor``. Every query (the pollers', the history's, the accounting's: they share the one
    client) may take ``timeout_s``, by default ``access.timeout_s``."""
    access = access if access is not None else PrometheusAccess()
    timeout_s = access.timeout_s if timeout_s is None else timeout_s
    if access.insecure_skip_verify:
        log.warning("cluster view: the certificate of Prometheus at %s is not verified "
                    "(--prometheus-insecure-skip-verify)", url)
    client = PrometheusClient(url, timeout_s=timeout_s, headers=dict(access.headers),
                              credentials=Credentials(access), tls=tls_context(access))
    poller = ClusterPoller(client, refresh_s=refresh_s, supervisor=supervisor, scope=access.scope)
    return ClusterRuntime(client, poller, scope=access.scope)


__all__ = ["ClusterRuntime", "PrometheusHistory", "open_cluster"]
