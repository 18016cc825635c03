"""A pod's timeline from the local history file (the pod shares table), for a single node without Prometheus."""

from __future__ import annotations

from nvdash.history.query import SqliteHistory
from nvdash.history.share_table import (
    BUCKET_S,
    PodKey,
    PodTimeline,
    PodUnit,
    grid_times,
    on_grid,
    pod_timeline,
    pod_units_seen,
    pods_seen,
)

TARGET_POINTS = 500
"""About this many points a range (a 7-day range: 10-minute steps, 1,008 points at most)."""
NICE_STEPS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def local_step(start_s: float, end_s: float) -> float:
    """The smallest whole-minute "nice" step giving at most about :data:`TARGET_POINTS` points (rows are minutes)."""
    wanted = (end_s - start_s) / TARGET_POINTS
    return float(next((step for step in NICE_STEPS_S if step >= max(wanted, BUCKET_S)), NICE_STEPS_S[-1]))


class LocalPodHistory:
    """Pods' past shares of this node's GPUs, read from its history file (blocking: run it off the event loop)."""

    def __init__(self, history: SqliteHistory) -> None:
        self.history = history

    def timeline(self, namespace: str, pod: str, start_s: float, end_s: float) -> PodTimeline:
        """The pod's SM share (devices-worth: a GPU or MIG instance fully busy is 1) and memory over
        ``[start_s, end_s]``, one point per step."""
        step = local_step(start_s, end_s)
        with self.history.reading() as connection:
            found = pod_timeline(connection, namespace, pod, start_s, end_s, step_s=step)
        return PodTimeline(grid_times(start_s, end_s, step),
                           on_grid(found.time_s, found.sm_gpus, start_s, end_s, step),
                           on_grid(found.time_s, found.memory_bytes, start_s, end_s, step), step)

    def pods(self, start_s: float, end_s: float) -> list[PodKey]:
        """The pods recorded in ``[start_s, end_s]``."""
        with self.history.reading() as connection:
            return pods_seen(connection, start_s, end_s)

    def units(self, start_s: float, end_s: float) -> list[PodUnit]:
        """Each pod container and unit recorded in ``[start_s, end_s]``."""
        with self.history.reading() as connection:
            return pod_units_seen(connection, start_s, end_s)

    def describe(self) -> str:
        """Where the timelines come from."""
        return f"this node's history ({self.history.describe()})"
