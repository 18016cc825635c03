"""One thread that asks Prometheus for the cluster's state, however many pages show it.

Like the sampler for the local GPUs: the pages only read the newest :class:`ClusterState`. The thread refreshes
every few seconds while a cluster page is open and sleeps when none has been for a minute. A failure keeps the last
good answer, says why, and is retried at the next refresh. One refresh (all its queries) has one deadline, the
client's timeout; any answer, however malformed, ends as a one-line reason, and the thread runs supervised.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

from nvdash.cluster.model import ClusterState, build_gpus, build_pods, cluster_queries
from nvdash.cluster.promapi import PrometheusAuthError, PrometheusClient, PrometheusError
from nvdash.cluster.selectors import HOST_LABEL, HOST_LABELS, SeriesScope
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)
DEFAULT_REFRESH_S = 5.0
IDLE_AFTER_S = 60.0
"""Stop asking Prometheus when no cluster page has been open for this long."""
THREAD = "nvdash-cluster"


class ClusterPoller:
    """Refreshes the cluster state from Prometheus on its own thread while pages want it."""

    def __init__(self, client: PrometheusClient, refresh_s: float = DEFAULT_REFRESH_S,
                 clock: Callable[[], float] = time.time, idle_after_s: float = IDLE_AFTER_S,
                 supervisor: Supervisor | None = None, *, scope: SeriesScope | None = None) -> None:
        self.client = client
        self.scope = scope if scope is not None else SeriesScope()
        self.queries = cluster_queries(self.scope)
        self.supervisor = supervisor if supervisor is not None else Supervisor()
        self.refresh_s = refresh_s
        self.clock = clock
        self.idle_after_s = idle_after_s
        self._state = ClusterState()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._wanted_at = -float("inf")
        self._thread: threading.Thread | None = None
        self._logged_failure: str | None = None

    @property
    def url(self) -> str:
        """The Prometheus endpoint asked."""
        return self.client.url

    def state(self) -> ClusterState:
        """The newest state (empty before the first refresh)."""
        with self._lock:
            return self._state

    def want(self) -> None:
        """A page shows the cluster: keep refreshing (and start now if the thread was sleeping)."""
        sleeping = time.monotonic() - self._wanted_at > self.idle_after_s
        self._wanted_at = time.monotonic()
        if sleeping:
            self._wake.set()

    def start(self) -> None:
        """Start the thread (it sleeps until a page wants the state)."""
        if self._thread is None:
            # A round lasts at most a refresh's deadline plus the pause; sleeping, the thread beats every pause.
            self._thread = self.supervisor.spawn(THREAD, self._run, self._stop,
                                                 expect_every_s=self.refresh_s + self.client.timeout_s)

    def stop(self) -> None:
        """Stop the thread (a query in flight ends within the client's timeout)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout_s + 1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._wanted_at > self.idle_after_s:
                if self._wake.wait(self.refresh_s):
                    self._wake.clear()
                self.supervisor.beat(THREAD)
                continue
            self.refresh()
            self.supervisor.beat(THREAD)
            self._stop.wait(self.refresh_s)

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
        current = self.client.instant(queries.gpus, deadline_mono=deadline)
        seen = self.client.instant(queries.seen, deadline_mono=deadline)
        allocated = self.client.instant(queries.allocated, deadline_mono=deadline)
        values = self.client.instant(queries.pod_values, deadline_mono=deadline)
        idle = self.client.instant(queries.idle, deadline_mono=deadline)
        host = self._host
        return ClusterState(
            time_s=now,
            gpus=build_gpus(((host(s.labels), s.value) for s in current.samples),
                            (host(s.labels) for s in seen.samples), now),
            pods=build_pods((host(s.labels) for s in allocated.samples),
                            ((host(s.labels), s.value) for s in values.samples),
                            ((host(s.labels), s.value) for s in idle.samples)),
            ok_time_s=now,
            truncated=any(answer.truncated for answer in (current, seen, allocated, values, idle)),
            generation=previous.generation + 1,
            queries_ms=(time.perf_counter() - began) * 1000.0,
        )

    def _host(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        """``labels`` with the configured host label read as ``Hostname`` (the model's name for it)."""
        label = self.scope.host_label
        if label in HOST_LABELS or label not in labels:
            return labels
        return {**{name: value for name, value in labels.items() if name not in HOST_LABELS},
                HOST_LABEL: labels[label]}
