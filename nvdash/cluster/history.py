"""Past readings of one node from Prometheus, behind the same :class:`~nvdash.history.query.HistoryBackend`
interface as the local history file, so the time range control and the timelines work unchanged.

Each metric is read as three range queries (``avg_``, ``min_`` and ``max_over_time`` over the step's window), with
a step chosen for the range (about :data:`TARGET_POINTS` points, never finer than :data:`MIN_STEP_S`), and turned
back from dcgm-exporter's units into nvdash's in the query itself.

Each query reads the family under dcgm-exporter 4.8's name and 4.9's, with either host label, each in its own unit:
``max by (gpu) (A or on (gpu) B ...)`` takes, at each step, the first naming that has the GPU, so a node exporting
both is counted once and a node upgraded mid-range keeps one line per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nvdash.cluster.model import MIB, names, unit_back
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.selectors import SeriesScope, quote
from nvdash.history.query import GAP_STEPS, HistoryResult, Series, with_gaps
from nvdash.sampling.records import GpuEvent

TARGET_POINTS = 500
MIN_STEP_S = 15.0
"""Prometheus's usual scrape interval: a finer step only repeats samples."""
MIN_WINDOW_S = 60.0
"""Each point summarises at least the last minute, so a point always holds a few scrapes."""
NICE_STEPS_S = (15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True)
class PromMetric:
    """How a history metric reads from Prometheus: the family and the factor to nvdash's unit."""

    family: str
    """dcgm-exporter 4.8's name (4.9's follows from :mod:`nvdash.metrics.compat`)."""
    scale: float = 1.0
    """nvdash's unit per 4.8's unit."""

    def namings(self) -> list[tuple[str, float, float]]:
        """(family, multiplier, divisor) under each naming: the family's value * multiplier / divisor is in
        nvdash's unit."""
        found = []
        for name in names(self.family):
            _family, multiplier, divisor = unit_back(name)
            multiplier *= self.scale
            if multiplier == divisor:
                multiplier = divisor = 1.0
            found.append((name, multiplier, divisor))
        return found


METRICS: dict[str, PromMetric] = {
    "utilization_pct": PromMetric("DCGM_FI_DEV_GPU_UTIL"),
    "memory_used_bytes": PromMetric("DCGM_FI_DEV_FB_USED", MIB),
    "temperature_c": PromMetric("DCGM_FI_DEV_GPU_TEMP"),
    "power_w": PromMetric("DCGM_FI_DEV_POWER_USAGE"),
    "clock_sm_mhz": PromMetric("DCGM_FI_DEV_SM_CLOCK"),
    "pcie_tx_bytes_per_s": PromMetric("nvdash_pcie_transmit_bytes_per_second"),
    "pcie_rx_bytes_per_s": PromMetric("nvdash_pcie_receive_bytes_per_second"),
}
"""The history metrics a node's cluster timelines read, by their names in :mod:`nvdash.history.catalog`."""
AGGREGATES = (("mean", "avg_over_time"), ("minimum", "min_over_time"), ("maximum", "max_over_time"))


def choose_step(start_s: float, end_s: float) -> float:
    """The smallest "nice" step giving at most about :data:`TARGET_POINTS` points over the range."""
    wanted = (end_s - start_s) / TARGET_POINTS
    for step in NICE_STEPS_S:
        if step >= max(wanted, MIN_STEP_S):
            return float(step)
    return float(math.ceil(wanted / 86400.0) * 86400)


class PrometheusHistory:
    """One node's past readings; ``hostname`` (its host label's value) can be changed between queries. Every
    series is selected within ``scope``."""

    def __init__(self, client: PrometheusClient, hostname: str = "", scope: SeriesScope | None = None) -> None:
        self.client = client
        self.hostname = hostname
        self.scope = scope if scope is not None else SeriesScope()

    def selector(self, family: str, gpus: Sequence[int] | None, host_label: str | None = None) -> str:
        """``family`` of this node's whole GPUs (MIG instances' series left out), optionally some GPUs only."""
        matchers = [f"{host_label or self.scope.host_label}={quote(self.hostname)}", 'GPU_I_ID=""']
        if gpus is not None:
            matchers.append("gpu=~" + quote("|".join(str(int(gpu)) for gpu in gpus)))
        return self.scope.series(family, *matchers)

    def expression(self, function: str, metric: PromMetric, window: str, gpus: Sequence[int] | None) -> str:
        """``function`` over ``window`` of the metric, in nvdash's unit, one series per GPU: each naming and host
        label in turn, the first that has the GPU at a step giving its value."""
        terms = []
        for family, multiplier, divisor in metric.namings():
            for label in self.scope.host_labels:
                term = f"{function}({self.selector(family, gpus, label)}[{window}])"
                if multiplier != 1.0:
                    term += f" * {float(multiplier)!r}"
                if divisor != 1.0:
                    term += f" / {float(divisor)!r}"
                terms.append(term)
        return "max by (gpu) (" + " or on (gpu) ".join(terms) + ")"

    def query(self, metrics: Sequence[str], start_s: float, end_s: float,
              gpus: Sequence[int] | None = None, step_s: float | None = None) -> HistoryResult:
        """The named metrics of this node's GPUs over ``[start_s, end_s]``."""
        unknown = [name for name in metrics if name not in METRICS]
        if unknown:
            raise ValueError(f"metric {unknown[0]!r} is not read from Prometheus; known: {', '.join(METRICS)}")
        if not (math.isfinite(start_s) and math.isfinite(end_s)) or start_s >= end_s:
            raise ValueError("the range's start must be before its end")
        step = step_s if step_s is not None else choose_step(start_s, end_s)
        window = f"{round(max(step, MIN_WINDOW_S))}s"
        first = math.floor(start_s / step) * step + step
        last = max(first, math.ceil(end_s / step) * step)
        series: dict[str, dict[int | None, Series]] = {}
        for name in metrics:
            metric = METRICS[name]
            parts: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
            for field_name, function in AGGREGATES:
                answer = self.client.range(self.expression(function, metric, window, gpus), first, last, step)
                for item in answer.series:
                    gpu = item.labels.get("gpu", "")
                    if gpu.isdigit():
                        parts.setdefault(int(gpu), {})[field_name] = (item.time_s, item.values)
            series[name] = {gpu: self._series(found, step) for gpu, found in sorted(parts.items())}
        return HistoryResult(start_s=start_s, end_s=end_s, step_s=step, resolution=f"Prometheus, {step:g} s steps",
                             series=series)

    @staticmethod
    def _series(found: dict[str, tuple[np.ndarray, np.ndarray]], step: float) -> Series:
        """Min, mean and max on the mean's times (bucket starts: a point summarises the step before it)."""
        times, mean = found.get("mean", (np.zeros(0), np.zeros(0)))
        columns = []
        for field_name in ("minimum", "maximum"):
            other_times, values = found.get(field_name, (times, mean))
            lookup = dict(zip(other_times.tolist(), values.tolist(), strict=True))
            columns.append(np.array([lookup.get(t, math.nan) for t in times.tolist()], dtype=np.float64))
        held = Series(np.asarray(times - step, dtype=np.float64), np.asarray(mean, dtype=np.float64), *columns)
        return with_gaps(held, GAP_STEPS * step)

    def extent(self) -> tuple[float, float] | None:
        """Unknown: Prometheus keeps its own retention."""
        return None

    def events(self, start_s: float, end_s: float, limit: int) -> list[GpuEvent]:
        """None: Prometheus keeps levels, not nvdash's event log."""
        return []

    def describe(self) -> str:
        """Where the readings come from."""
        return f"Prometheus at {self.client.url}"
