"""The cluster's accounting report: a range and a grouping asked of Prometheus, as the accounting's
:class:`~nvdash.accounting.report.Report` (so the table, CSV and JSON writers serve it unchanged)."""

from __future__ import annotations

from collections.abc import Mapping

from nvdash.accounting.report import Report, accounting_range
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.accounting import CLUSTER_GROUPINGS, ClusterAccounting
from nvdash.history.ranges import RangeError, TimeRange

SOURCE = "prometheus"


def cluster_range(arguments: Mapping[str, str], by: str, now_s: float) -> tuple[TimeRange, str]:
    """The range and grouping asked for; raises :class:`RangeError` (one line) for either being wrong."""
    if by not in CLUSTER_GROUPINGS:
        raise RangeError(f"by must be one of {', '.join(CLUSTER_GROUPINGS)}, not {by!r}")
    return accounting_range(arguments, now_s), by


def cluster_report(cluster: ClusterRuntime, chosen: TimeRange, by: str) -> Report:
    """The rows over ``chosen`` from the cluster's Prometheus (blocks: call off the event loop); raises
    :class:`~nvdash.cluster.promapi.PrometheusError` when it cannot answer."""
    rows, _truncated = ClusterAccounting(cluster.client, cluster.scope).rows(chosen.start_s, chosen.end_s, by)
    return Report(chosen, by, rows, SOURCE)
