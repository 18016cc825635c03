"""The cluster over Prometheus: a client of its HTTP API, the cluster's state refreshed on one thread, and one
node's past readings behind the history interface. nvdash stores nothing of the cluster itself."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nvdash.cluster.history import PrometheusHistory
from nvdash.cluster.poller import DEFAULT_REFRESH_S, ClusterPoller
from nvdash.cluster.promapi import DEFAULT_TIMEOUT_S, PrometheusClient
from nvdash.supervision import Supervisor

QUERY_THREADS = 4


@dataclass
class ClusterRuntime:
    """What the cluster pages share: the client, the state poller, and the threads their range queries run on."""

    client: PrometheusClient
    poller: ClusterPoller
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=QUERY_THREADS, thread_name_prefix="nvdash-prom"))

    def history(self, hostname: str = "") -> PrometheusHistory:
        """A node's past readings (one per page: the page changes its node)."""
        return PrometheusHistory(self.client, hostname)

    def start(self) -> None:
        """Start the poller's thread (it asks Prometheus only while a cluster page is open)."""
        self.poller.start()

    def close(self) -> None:
        """Stop the poller and the query threads."""
        self.poller.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)


def open_cluster(url: str, timeout_s: float = DEFAULT_TIMEOUT_S, refresh_s: float = DEFAULT_REFRESH_S,
                 supervisor: Supervisor | None = None) -> ClusterRuntime:
    """The cluster runtime for the Prometheus-API endpoint at ``url`` (nothing is asked yet); its poller's thread
    runs under ``supervisor``."""
    client = PrometheusClient(url, timeout_s=timeout_s)
    return ClusterRuntime(client, ClusterPoller(client, refresh_s=refresh_s, supervisor=supervisor))


__all__ = ["ClusterRuntime", "PrometheusHistory", "open_cluster"]
