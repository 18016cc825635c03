"""``GET /metrics``: the Prometheus text format (OpenMetrics when the scraper asks for it), optionally behind a
bearer token.

Who may scrape: with ``--metrics-token``, a scraper sending ``Authorization: Bearer <that token>``; when the
dashboards require a token, also whoever the dashboards admit (their token as a bearer token, or the browser's
cookie); when neither applies, anyone, like the dashboards themselves.

On a live server the accounting book's accountant adds ``nvdash_gpu_allocated_idle_seconds`` and, with
``--metrics-job-label``, the owners' ``hpc_job`` label; a replay has no accountant, so neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from tornado.web import RequestHandler

from nvdash.freshness import stale_after
from nvdash.metrics.accounting_families import OwnerBound
from nvdash.metrics.collector import GPU_LABELS, LABEL_FIELDS, ExportOptions, StoreCollector, unknown_fields
from nvdash.metrics.compat import naming
from nvdash.metrics.counters import Counter, default_counters, load_counters
from nvdash.metrics.exposition import TEXT_CONTENT_TYPE, text_format
from nvdash.server.access import same_secret, token_from_authorization
from nvdash.server.auth import gate_of
from nvdash.settings import Settings
from nvdash.store import Store

if TYPE_CHECKING:
    from nvdash.accounting.accountant import Accountant
    from nvdash.accounting.report import AccountingBook


@dataclass(frozen=True)
class MetricsSetup:
    """The families ``/metrics`` exports and its labels, checked at start."""

    counters: tuple[Counter, ...]
    options: ExportOptions

    @staticmethod
    def default(hostname: str) -> MetricsSetup:
        """The default counters file, every label."""
        return MetricsSetup(tuple(default_counters()), ExportOptions(hostname=hostname))


def metrics_setup(settings: Settings, hostname: str) -> tuple[MetricsSetup, list[str]]:
    """The settings' counters file and labels, and the names in the file nvdash cannot export. A live server's
    scrapes leave out GPU readings older than ``freshness.stale_after`` the interval and say when the newest were
    taken.

    Raises :class:`~nvdash.metrics.counters.CountersError` with one line for an unreadable file."""
    counters = load_counters(settings.metrics_counters)
    drop: frozenset[str] = frozenset()
    if settings.metrics_labels is not None:
        drop = frozenset(label for label in (*GPU_LABELS, *LABEL_FIELDS) if label not in settings.metrics_labels)
    stale_after_s = None if settings.replay is not None else stale_after(settings.interval_s)
    options = ExportOptions(hostname=settings.hostname or hostname, drop_labels=drop, pods=settings.metrics_pods,
                            processes=settings.metrics_processes, job_label=settings.metrics_job_label,
                            naming=naming(settings.metrics_compat), stale_after_s=stale_after_s,
                            accounting=None if settings.metrics_accounting_owners is None
                            else OwnerBound(settings.metrics_accounting_owners))
    return MetricsSetup(tuple(counters), options), unknown_fields(counters)


def registry_for(store: Store, counters: Sequence[Counter], options: ExportOptions, openmetrics: bool,
                 accountant: Accountant | None = None, *,
                 clock: Callable[[], float] = time.time) -> CollectorRegistry:
    """A registry holding only the store's collector (none of the process's default collectors); ``clock``: the
    server's "now" (a replay's is the recording's end), which the health verdicts are judged at."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, counters, options, openmetrics=openmetrics, accountant=accountant,
                                     clock=clock))
    return registry


class MetricsHandler(RequestHandler):
    """Serves one scrape from the store to the scrapers the module's rules admit (401 for the others)."""

    def initialize(self, store: Store, counters: Sequence[Counter], options: ExportOptions,
                   token: str | None = None, accounting: AccountingBook | None = None, *,
                   clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._counters = counters
        self._options = options
        self._token = token
        self._accountant = accounting.accountant if accounting is not None else None
        self._registries: dict[bool, CollectorRegistry] = {}

    def _admitted(self) -> bool:
        if self._token is not None:
            given = token_from_authorization(self.request.headers.get("Authorization", ""))
            if given is not None and same_secret(given, self._token):
                return True
        gate = gate_of(self)
        if gate is not None:
            return gate.admits(self)
        return self._token is None

    def get(self) -> None:
        if not self._admitted():
            self.set_status(401)
            self.set_header("WWW-Authenticate", 'Bearer realm="nvdash metrics"')
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish("a bearer token is needed for /metrics\n")
            return
        encoder, content_type = choose_encoder(self.request.headers.get("Accept", ""))
        openmetrics = content_type.startswith("application/openmetrics-text")
        registry = registry_for(self._store, self._counters, self._options, openmetrics, self._accountant,
                                clock=self._clock)
        self.set_header("Cache-Control", "no-store")
        if openmetrics:
            self.set_header("Content-Type", content_type)
            self.finish(encoder(registry))
        else:
            self.set_header("Content-Type", TEXT_CONTENT_TYPE)
            self.finish(text_format(registry.collect()))
