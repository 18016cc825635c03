"""``GET /metrics``: the Prometheus text format (OpenMetrics when the scraper asks for it), optionally behind a
bearer token."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from tornado.web import RequestHandler

from nvdash.metrics.collector import GPU_LABELS, LABEL_FIELDS, ExportOptions, StoreCollector, unknown_fields
from nvdash.metrics.counters import Counter, default_counters, load_counters
from nvdash.metrics.exposition import TEXT_CONTENT_TYPE, text_format
from nvdash.settings import Settings
from nvdash.store import Store


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
    """The settings' counters file and labels, and the names in the file nvdash cannot export.

    Raises :class:`~nvdash.metrics.counters.CountersError` with one line for an unreadable file."""
    counters = load_counters(settings.metrics_counters)
    drop: frozenset[str] = frozenset()
    if settings.metrics_labels is not None:
        drop = frozenset(label for label in (*GPU_LABELS, *LABEL_FIELDS) if label not in settings.metrics_labels)
    options = ExportOptions(hostname=settings.hostname or hostname, drop_labels=drop, pods=settings.metrics_pods,
                            processes=settings.metrics_processes)
    return MetricsSetup(tuple(counters), options), unknown_fields(counters)


def registry_for(store: Store, counters: Sequence[Counter], options: ExportOptions, openmetrics: bool
                 ) -> CollectorRegistry:
    """A registry holding only the store's collector (none of the process's default collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, counters, options, openmetrics=openmetrics))
    return registry


class MetricsHandler(RequestHandler):
    """Serves one scrape from the store; ``token`` (when set) must come as ``Authorization: Bearer <token>``."""

    def initialize(self, store: Store, counters: Sequence[Counter], options: ExportOptions,
                   token: str | None = None) -> None:
        self._store = store
        self._counters = counters
        self._options = options
        self._token = token
        self._registries: dict[bool, CollectorRegistry] = {}

    def get(self) -> None:
        if self._token is not None:
            given = self.request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode()):
                self.set_status(401)
                self.set_header("WWW-Authenticate", 'Bearer realm="nvdash metrics"')
                self.finish("a bearer token is needed for /metrics\n")
                return
        encoder, content_type = choose_encoder(self.request.headers.get("Accept", ""))
        openmetrics = content_type.startswith("application/openmetrics-text")
        registry = registry_for(self._store, self._counters, self._options, openmetrics)
        self.set_header("Cache-Control", "no-store")
        if openmetrics:
            self.set_header("Content-Type", content_type)
            self.finish(encoder(registry))
        else:
            self.set_header("Content-Type", TEXT_CONTENT_TYPE)
            self.finish(text_format(registry.collect()))
