"""One thread that asks Prometheus for the fleet's day (XIDs, GPU counts a day ago), however many fleet pages are open.

The day's queries read a day of every GPU's XID series, far more than the 5 s poller's instant queries, so they run
on their own, slower round (every 60 s by default) and only while a fleet page has looked in the last minute. A
failure keeps the last good answer and says why, as the cluster poller does.

Where Prometheus has nvdash's recording rules loaded, and has had for the whole window the queries read, the round
reads their series instead (a day of non-zero XID codes, not of every GPU's gauge): a one-sample check, repeated
every few minutes, decides, and the answer says which it read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from nvdash.cluster.fleet import RECORDED_WINDOW, FleetDay, FleetQueries, fleet_queries, per_host
from nvdash.cluster.promapi import PrometheusClient, PrometheusError
from nvdash.cluster.recorded import presence_query
from nvdash.cluster.rounds import PageRounds
from nvdash.cluster.selectors import SeriesScope
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)
DEFAULT_FLEET_REFRESH_S = 60.0
IDLE_AFTER_S = 60.0
THREAD = "nvdash-fleet"
RECHECK_S = 300.0
"""How often the round asks again whether the recording rules cover the day."""


class FleetPoller(PageRounds):
    """Refreshes the fleet's day from Prometheus on its own thread while a fleet page wants it."""

    thread_name = THREAD

    def __init__(self, client: PrometheusClient, *, scope: SeriesScope | None = None,
                 refresh_s: float = DEFAULT_FLEET_REFRESH_S, supervisor: Supervisor | None = None,
                 clock: Callable[[], float] = time.time, idle_after_s: float = IDLE_AFTER_S,
                 recheck_s: float = RECHECK_S) -> None:
        super().__init__(client, refresh_s, idle_after_s, supervisor)
        self.scope = scope if scope is not None else SeriesScope()
        self.raw_queries = fleet_queries(self.scope)
        self.recorded_queries = fleet_queries(self.scope, recorded=True)
        self.recheck_s = recheck_s
        self._recorded: bool | None = None
        self._checked_at = 0.0
        self.clock = clock
        self._day = FleetDay()

    def day(self) -> FleetDay:
        """The newest answer (empty before the first)."""
        with self._lock:
            return self._day

    def refresh(self) -> FleetDay:
        """Ask the day's queries once, within the client's timeout for all of them, and keep the answer (or the last
        one with the reason)."""
        began = time.perf_counter()
        deadline = time.monotonic() + self.client.timeout_s
        previous = self.day()
        try:
            queries = self.queries(deadline)
            answers = [self.client.instant(query, deadline_mono=deadline) for query in queries.all()]
            xids, xid_gpus, now, then = (per_host(((s.labels, s.value) for s in answer.samples), self.scope)
                                                for answer in answers)
            day = FleetDay(xids, xid_gpus, now, then, ok_time_s=self.clock(),
                           generation=previous.generation + 1, queries_ms=(time.perf_counter() - began) * 1000.0,
                           recorded=queries.recorded)
        except PrometheusError as error:
            if previous.error != str(error):
                log.warning("fleet view: %s", error)
            day = dataclasses.replace(previous, error=str(error), generation=previous.generation + 1,
                                      queries_ms=(time.perf_counter() - began) * 1000.0)
        with self._lock:
            self._day = day
        return day

    def queries(self, deadline_mono: float | None = None) -> FleetQueries:
        """The recorded queries when the recording rules have been recording for the whole window the queries read,
        else the raw ones; asked of Prometheus at most every ``recheck_s`` (raises :class:`PrometheusError`)."""
        now = self.clock()
        if self._recorded is None or abs(now - self._checked_at) >= self.recheck_s:
            answer = self.client.instant(presence_query(RECORDED_WINDOW), deadline_mono=deadline_mono)
            recorded = bool(answer.samples)
            if recorded != self._recorded:
                log.info("fleet view: reading the %s series", "recorded" if recorded else "raw")
            self._recorded, self._checked_at = recorded, now
        return self.recorded_queries if self._recorded else self.raw_queries
