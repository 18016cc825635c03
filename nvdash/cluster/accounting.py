"""The accounting of many nodes through Prometheus: the nodes' accounting counters (``--metrics-accounting``) added
up per job, pod, user or project over a range, a job that ran on several nodes being one row.

What a range counts, per series: its value at the range's end less its value at the start (the last scrape at or
before each instant; a series that appeared within the range counts from 0), so a range whose counters did not
reset is exact, without ``increase()``'s extrapolation to the range's edges. A series whose counter reset within
the range (its nvdash restarted), or that has no value at the end (its node is gone), counts ``increase()`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvdash.accounting.ledger import Tally
from nvdash.accounting.summary import Row
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.selectors import SeriesScope
from nvdash.metrics.accounting_families import ACCOUNTING_COUNTERS, JOB_LABEL

CLUSTER_GROUPINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "job": (JOB_LABEL, ()),
    "pod": (JOB_LABEL, ('kind="pod"',)),
    "user": ("user", ()),
    "project": ("project", ()),
    "namespace": ("project", ()),
}
"""Grouping -> the label summed by, and the matchers choosing the series (``pod``: only pods' series)."""


def grouping_label(by: str) -> tuple[str, tuple[str, ...]]:
    """The label and matchers of grouping ``by``; raises :class:`ValueError` with one line."""
    found = CLUSTER_GROUPINGS.get(by)
    if found is None:
        raise ValueError(f"by must be one of {', '.join(CLUSTER_GROUPINGS)}, not {by!r}")
    return found


def counter_query(name: str, by: str, start_s: float, end_s: float, scope: SeriesScope) -> str:
    """The PromQL of one counter's growth over ``[start_s, end_s]`` summed by the grouping's label and ``kind`` (see
    the module's docstring)."""
    label, matchers = grouping_label(by)
    series = scope.series(name, *matchers)
    end, start = f"{end_s:.3f}", f"{start_s:.3f}"
    window = f"{max(1, round(end_s - start_s))}s"
    exact = f"({series} @ {end}) - ((({series} @ {start}) * 1) or (({series} @ {end}) * 0))"
    return (f"sum by ({label}, kind) (({exact}) unless (resets({series}[{window}] @ {end}) > 0) "
            f"or increase({series}[{window}] @ {end}))")


@dataclass
class ClusterAccounting:
    """Asks Prometheus for the counters' growth over a range and makes the accounting's rows of it."""

    client: PrometheusClient
    scope: SeriesScope

    def rows(self, start_s: float, end_s: float, by: str,
             deadline: Callable[[], float | None] = lambda: None) -> tuple[list[Row], bool]:
        """Rows grouped ``by``, most GPU-hours first, and whether Prometheus cut an answer off (too many series).
        Raises :class:`~nvdash.cluster.promapi.PrometheusError` (one line) when Prometheus cannot answer."""
        label, _matchers = grouping_label(by)
        rows: dict[str, Row] = {}
        truncated = False
        for family in ACCOUNTING_COUNTERS:
            answer = self.client.instant(counter_query(family.name, by, start_s, end_s, self.scope),
                                         deadline_mono=deadline())
            truncated = truncated or answer.truncated
            for sample in answer.samples:
                key = sample.labels.get(label, "")
                row = rows.get(key)
                if row is None:
                    row = rows[key] = Row(key, set(), set(), Tally(start_s=start_s, end_s=end_s))
                if sample.labels.get("kind"):
                    row.kinds.add(sample.labels["kind"])
                setattr(row.total, family.attribute, getattr(row.total, family.attribute) + max(0.0, sample.value))
        for row in rows.values():
            # Neither the energy counter's nor the throttling counters' reading time is exported: their shares are
            # of the allocated time.
            total = row.total
            total.energy_known_s = total.power_cap_known_s = total.thermal_known_s = total.allocated_s
        found = [row for row in rows.values() if row.total.allocated_s > 0]
        return sorted(found, key=lambda row: (-row.total.allocated_s, row.key)), truncated
