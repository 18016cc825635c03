"""One thread that asks Prometheus for the cluster's state, however many pages show it.

Like the sampler for the local GPUs: the pages only read the newest :class:`ClusterState`. The thread refreshes
every few seconds while a cluster page is open and sleeps when none has been for a minute. A failure keeps the last
good answer, says why, and is retried at the next refresh. One refresh (all its queries) has one deadline, the
client's timeout; any answer, however malformed, ends as a one-line reason, and the thread runs supervised.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

from nvdash.cluster.model import ClusterGpu, ClusterNode, ClusterState, build_gpus, build_pods, cluster_queries
from nvdash.cluster.nodes import (
    DETAIL_NODES_MAX,
    FLEET_FROM_GPUS,
    NodeAnswers,
    detail_hosts,
    detail_queries,
    fleet_nodes,
    node_queries,
)
from nvdash.cluster.promapi import Answer, PrometheusAuthError, PrometheusClient, PrometheusError
from nvdash.cluster.rounds import PageRounds
from nvdash.cluster.selectors import HOST_LABEL, HOST_LABELS, SeriesScope
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)
DEFAULT_REFRESH_S = 5.0
IDLE_AFTER_S = 60.0
"""Stop asking Prometheus when no cluster page has been open for this long."""
THREAD = "nvdash-cluster"


class ClusterPoller(PageRounds):
    """Refreshes the cluster state from Prometheus on its own thread while pages want it."""

    thread_name = THREAD

    def __init__(self, client: PrometheusClient, refresh_s: float = DEFAULT_REFRESH_S,
                 clock: Callable[[], float] = time.time, idle_after_s: float = IDLE_AFTER_S,
                 supervisor: Supervisor | None = None, *, scope: SeriesScope | None = None,
                 fleet_from_gpus: int = FLEET_FROM_GPUS, detail_nodes_max: int = DETAIL_NODES_MAX) -> None:
        super().__init__(client, refresh_s, idle_after_s, supervisor)
        self.scope = scope if scope is not None else SeriesScope()
        self.queries = cluster_queries(self.scope)
        self.node_queries = node_queries(self.scope)
        self.fleet_from_gpus = fleet_from_gpus
        """Above this many GPUs, nodes are summarized by aggregation and only some nodes' GPUs are read."""
        self.detail_nodes_max = detail_nodes_max
        self._wanted_nodes: dict[str, float] = {}
        self.clock = clock
        self._state = ClusterState()
        self._logged_failure: str | None = None

    @property
    def url(self) -> str:
        """The Prometheus endpoint asked."""
        return self.client.url

    def state(self) -> ClusterState:
        """The newest state (empty before the first refresh)."""
        with self._lock:
            return self._state

    def want_node(self, hostname: str) -> None:
        """A page shows ``hostname``'s GPUs: at fleet size, read them at every refresh for the next minute (and
        refresh now if they are not read yet)."""
        with self._lock:
            self._wanted_nodes[hostname] = time.monotonic()
            state = self._state
        if state.fleet and not any(gpu.hostname == hostname for gpu in state.gpus):
            self.wake()

    def wanted_nodes(self) -> list[str]:
        """The nodes pages showed within the last minute, the newest first."""
        horizon = time.monotonic() - self.idle_after_s
        with self._lock:
            for host in [host for host, at in self._wanted_nodes.items() if at < horizon]:
                del self._wanted_nodes[host]
            return sorted(self._wanted_nodes, key=lambda host: -self._wanted_nodes[host])

    def refresh(self) -> ClusterState:
        """Ask Prometheus once, within the client's timeout for all the queries together, and keep the answer (or,
        on failure, the last one with the reason)."""
        began = time.perf_counter()
        deadline = time.monotonic() + self.client.timeout_s
        now = self.clock()
        previous = self.state()
        try:
            state = self._ask(now, deadline, previous, began)
        except PrometheusError as error:
            state = self._failed(previous, str(error), began, refused=isinstance(error, PrometheusAuthError))
        except Exception as error:
            # A bug of nvdash's over an answer nobody foresaw: say so on the page, once with the traceback in the log.
            detail = " ".join(str(error).split())
            reason = f"nvdash could not read Prometheus's answer: {type(error).__name__}: {detail}"
            if self._logged_failure != type(error).__name__:
                log.exception("cluster view: %s", reason)
                self._logged_failure = type(error).__name__
            state = self._failed(previous, reason[:300], began)
        with self._lock:
            self._state = state
        return state

    def _failed(self, previous: ClusterState, reason: str, began: float, *, refused: bool = False) -> ClusterState:
        if previous.error != reason:
            log.warning("cluster view: %s", reason)
        return dataclasses.replace(previous, error=reason, refused=refused, generation=previous.generation + 1,
                                   queries_ms=(time.perf_counter() - began) * 1000.0)

    def _ask(self, now: float, deadline: float, previous: ClusterState, began: float) -> ClusterState:
        queries = self.queries
        ask = self.client.instant
        reporting = ask(self.node_queries.reporting, deadline_mono=deadline)
        answers: list[Answer] = [reporting]
        fleet = sum(sample.value for sample in reporting.samples if sample.value >= 0) > self.fleet_from_gpus
        if fleet:
            gpus, nodes = self._fleet(reporting, deadline, now, answers)
        else:
            current = ask(queries.gpus, deadline_mono=deadline)
            seen = ask(queries.seen, deadline_mono=deadline)
            answers += [current, seen]
            gpus, nodes = self._gpus(current, seen, now), ()
        allocated = ask(queries.allocated, deadline_mono=deadline)
        values = ask(queries.pod_values, deadline_mono=deadline)
        idle = ask(queries.idle, deadline_mono=deadline)
        host = self._host
        return ClusterState(
            time_s=now, gpus=gpus, nodes=nodes, fleet=fleet,
            pods=build_pods((host(s.labels) for s in allocated.samples),
                            ((host(s.labels), s.value) for s in values.samples),
                            ((host(s.labels), s.value) for s in idle.samples)),
            ok_time_s=now,
            truncated=any(answer.truncated for answer in (*answers, allocated, values, idle)),
            generation=previous.generation + 1,
            queries_ms=(time.perf_counter() - began) * 1000.0,
        )

    def _gpus(self, current: Answer, seen: Answer, now: float) -> tuple[ClusterGpu, ...]:
        host = self._host
        return build_gpus(((host(s.labels), s.value) for s in current.samples),
                          (host(s.labels) for s in seen.samples), now, self.scope.group_label)

    def _fleet(self, reporting: Answer, deadline: float, now: float,
               answers: list[Answer]) -> tuple[tuple[ClusterGpu, ...], tuple[ClusterNode, ...]]:
        """The nodes from the aggregations, and the GPUs of the nodes wanted by pages or needing a closer look."""
        asked = [self.client.instant(query, deadline_mono=deadline) for query in self.node_queries.all()[1:]]
        answers += asked

        def labelled(answer: Answer) -> list[tuple[Mapping[str, str], float]]:
            return [(self._host(sample.labels), sample.value) for sample in answer.samples]

        last_hour_nodes, sums, counts, verdict_nodes, verdicts, xids = (labelled(answer) for answer in asked)
        summary = NodeAnswers(labelled(reporting), last_hour_nodes, sums, counts, verdict_nodes, verdicts, xids,
                              group_label=self.scope.group_label)
        hosts = detail_hosts(summary, self.wanted_nodes(), self.detail_nodes_max)
        gpus: tuple[ClusterGpu, ...] = ()
        if hosts:
            readings, seen = detail_queries(self.scope, hosts)
            current = self.client.instant(readings, deadline_mono=deadline)
            last_hour = self.client.instant(seen, deadline_mono=deadline)
            answers += [current, last_hour]
            gpus = self._gpus(current, last_hour, now)
        return gpus, fleet_nodes(summary, gpus, hosts)

    def _host(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        """``labels`` with the configured host label read as ``Hostname`` (the model's name for it)."""
        label = self.scope.host_label
        if label in HOST_LABELS or label not in labels:
            return labels
        return {**{name: value for name, value in labels.items() if name not in HOST_LABELS},
                HOST_LABEL: labels[label]}
