"""A pod's timeline from Prometheus: its SM share and memory on every GPU it holds, summed per step.

Every node's nvdash exports ``nvdash_pod_gpu_sm_share_ratio`` (0-1 of the unit) and ``nvdash_pod_gpu_memory_bytes``
per pod container and unit. The pod's SM share is the sum over its containers and units of each series' mean over
the step (in devices-worth: 0.5 of one GPU plus 0.3 of another is 0.8; a MIG instance fully busy counts 1); its
memory the sum of the means.
"""

from __future__ import annotations

import math

import numpy as np

from nvdash.cluster.history import MIN_WINDOW_S, choose_step
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.selectors import SeriesScope, quote
from nvdash.history.share_table import PodTimeline, grid_times, on_grid

SM_SHARE = "nvdash_pod_gpu_sm_share_ratio"
MEMORY = "nvdash_pod_gpu_memory_bytes"


def pod_expression(family: str, namespace: str, pod: str, window_s: float, scope: SeriesScope | None = None) -> str:
    """The sum over the pod's series (within ``scope``) of each one's mean over the ``window_s`` before each step."""
    selector = (scope or SeriesScope()).series(family, f"namespace={quote(namespace)}", f"pod={quote(pod)}")
    return f"sum(avg_over_time({selector}[{round(window_s)}s]))"


class PrometheusPodHistory:
    """Pods' past shares across the cluster (blocking: run it off the event loop)."""

    def __init__(self, client: PrometheusClient, scope: SeriesScope | None = None) -> None:
        self.client = client
        self.scope = scope if scope is not None else SeriesScope()

    def timeline(self, namespace: str, pod: str, start_s: float, end_s: float) -> PodTimeline:
        """The pod's SM share (devices-worth) and memory over ``[start_s, end_s]``: one point per step, at the start of
        the step it summarises (NaN where Prometheus has nothing)."""
        if not (math.isfinite(start_s) and math.isfinite(end_s)) or start_s >= end_s:
            raise ValueError("the range's start must be before its end")
        step = choose_step(start_s, end_s)
        window = max(step, MIN_WINDOW_S)
        first = math.floor(start_s / step) * step + step
        last = max(first, math.ceil(end_s / step) * step)
        columns = []
        for family in (SM_SHARE, MEMORY):
            answer = self.client.range(pod_expression(family, namespace, pod, window, self.scope), first, last, step)
            found = answer.series[0] if answer.series else None
            times, values = (found.time_s - step, found.values) if found is not None else (np.zeros(0), np.zeros(0))
            columns.append(on_grid(times, values, first - step, last, step))
        return PodTimeline(grid_times(first - step, last, step), columns[0], columns[1], step)

    def describe(self) -> str:
        """Where the timelines come from."""
        return f"Prometheus at {self.client.url}"
