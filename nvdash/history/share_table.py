"""The history's pod shares table: each pod container's part of each GPU unit (SM share and memory), per minute.

A shared GPU's device-wide readings repeat on every pod holding it; this table keeps what each pod itself did, so a
single node without Prometheus can still draw a pod's timeline over the whole retention. Rows are one minute (the
history's 1 min tier, which is kept for the whole retention) per unit and container: storing a snapshot's shares
adds to the row of its minute (readings counted in ``n``), so a row's means are the means of the snapshots behind
it. Only pod owners are stored (processes and bare containers have no pod to look up).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from nvdash.sampling.share_records import UnitShares

BUCKET_S = 60.0
"""A row's span: the 1 min tier's step."""
TABLE = (
    "CREATE TABLE IF NOT EXISTS pod_shares (t REAL NOT NULL, unit TEXT NOT NULL, gpu INTEGER NOT NULL,"
    " namespace TEXT NOT NULL, pod TEXT NOT NULL, container TEXT NOT NULL, sharing TEXT NOT NULL,"
    " n INTEGER NOT NULL, sm_n INTEGER NOT NULL, sm_pct_sum REAL NOT NULL, memory_n INTEGER NOT NULL,"
    " memory_bytes_sum REAL NOT NULL, PRIMARY KEY (t, unit, namespace, pod, container)) WITHOUT ROWID"
)
"""The table (created in every history; ``IF NOT EXISTS`` adds it to a file written before it existed)."""
UPSERT = (
    "INSERT INTO pod_shares (t, unit, gpu, namespace, pod, container, sharing, n, sm_n, sm_pct_sum, memory_n,"
    " memory_bytes_sum) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)"
    " ON CONFLICT (t, unit, namespace, pod, container) DO UPDATE SET n = n + 1, sm_n = sm_n + excluded.sm_n,"
    " sm_pct_sum = sm_pct_sum + excluded.sm_pct_sum, memory_n = memory_n + excluded.memory_n,"
    " memory_bytes_sum = memory_bytes_sum + excluded.memory_bytes_sum, sharing = excluded.sharing"
)
_TIMELINE = (
    "SELECT b, sum(sm), sum(memory), count(sm), count(memory) FROM ("
    " SELECT CAST(t / :step AS INTEGER) * :step AS b, unit, container,"
    " sum(sm_pct_sum) / NULLIF(sum(sm_n), 0) AS sm, sum(memory_bytes_sum) / NULLIF(sum(memory_n), 0) AS memory"
    " FROM pod_shares WHERE t >= :start AND t < :end AND namespace = :namespace AND pod = :pod"
    " GROUP BY b, unit, container) GROUP BY b ORDER BY b"
)

FloatArray = npt.NDArray[np.float64]


def bucket_of(time_s: float) -> float:
    """The start of the minute holding ``time_s``."""
    return math.floor(time_s / BUCKET_S) * BUCKET_S


def share_rows(time_s: float, shares: Iterable[UnitShares]) -> list[tuple[Any, ...]]:
    """The upsert parameters of one snapshot's shares: one per pod owner and unit."""
    rows = []
    bucket = bucket_of(time_s)
    for unit in shares:
        for share in unit.owners:
            owner = share.owner
            if owner.kind != "pod" or not owner.namespace or not owner.pod:
                continue
            rows.append((bucket, unit.unit, unit.gpu_index, owner.namespace, owner.pod, owner.container or "",
                         unit.sharing, 0 if share.sm_pct is None else 1, share.sm_pct or 0.0,
                         0 if share.memory_bytes is None else 1, float(share.memory_bytes or 0)))
    return rows


def store(connection: sqlite3.Connection, time_s: float, shares: Iterable[UnitShares]) -> int:
    """Add one snapshot's pod shares (inside the caller's transaction); returns the rows touched."""
    rows = share_rows(time_s, shares)
    connection.executemany(UPSERT, rows)
    return len(rows)


def prune(connection: sqlite3.Connection, before_s: float) -> int:
    """Delete the minutes that started before ``before_s``; returns the rows deleted."""
    return connection.execute("DELETE FROM pod_shares WHERE t < ?", (before_s,)).rowcount


def has_table(connection: sqlite3.Connection) -> bool:
    """Whether the file has the table (a history written before it did not)."""
    count: int = connection.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'pod_shares'").fetchone()[0]
    return count > 0


@dataclass(frozen=True)
class PodTimeline:
    """A pod's use over a range, one point per step (bucket starts): SM share in devices-worth (a GPU or a MIG
    instance fully busy is 1; the sum over its containers and units of each one's mean SM share, 0.5 + 0.3 on two
    GPUs = 0.8) and memory in bytes (the sum of each one's mean); NaN where nothing was recorded."""

    time_s: FloatArray
    sm_gpus: FloatArray
    memory_bytes: FloatArray
    step_s: float


@dataclass(frozen=True)
class PodKey:
    """A pod seen in the table, with the sharing kinds of the units it held."""

    namespace: str
    pod: str
    sharing: tuple[str, ...]


def pod_timeline(connection: sqlite3.Connection, namespace: str, pod: str, start_s: float, end_s: float,
                 *, step_s: float) -> PodTimeline:
    """``namespace/pod``'s timeline over ``[start_s, end_s)`` in ``step_s`` buckets (a multiple of a minute is
    exact: each minute falls in one bucket)."""
    if not step_s > 0 or not end_s > start_s:
        raise ValueError("a pod timeline needs a positive step and a start before its end")
    rows = connection.execute(_TIMELINE, {"step": step_s, "start": start_s, "end": end_s, "namespace": namespace,
                                          "pod": pod}).fetchall()

    def column(index: int, known: int) -> FloatArray:
        return np.array([row[index] if row[known] else math.nan for row in rows], dtype=np.float64)

    return PodTimeline(np.array([row[0] for row in rows], dtype=np.float64), column(1, 3) / 100.0, column(2, 4),
                       step_s)


def pods_seen(connection: sqlite3.Connection, start_s: float, end_s: float) -> list[PodKey]:
    """The pods with rows in ``[start_s, end_s)``, by namespace and name."""
    rows = connection.execute(
        "SELECT namespace, pod, group_concat(DISTINCT sharing) FROM pod_shares WHERE t >= ? AND t < ?"
        " GROUP BY namespace, pod ORDER BY namespace, pod", (start_s, end_s)).fetchall()
    return [PodKey(str(ns), str(pod), tuple(sorted(str(kinds).split(",")))) for ns, pod, kinds in rows]


@dataclass(frozen=True)
class PodUnit:
    """A pod container seen on one unit (a GPU or MIG instance UUID) in the table, with how the unit was shared."""

    namespace: str
    pod: str
    container: str
    unit: str
    gpu: int
    sharing: str


def pod_units_seen(connection: sqlite3.Connection, start_s: float, end_s: float) -> list[PodUnit]:
    """Each pod container and unit with rows in ``[start_s, end_s)`` (its newest row's sharing kind), sorted (none
    from a file written before the table existed)."""
    if not has_table(connection):
        return []
    rows = connection.execute(
        "SELECT namespace, pod, container, unit, gpu, sharing, max(t) FROM pod_shares WHERE t >= ? AND t < ?"
        " GROUP BY namespace, pod, container, unit ORDER BY namespace, pod, container, gpu, unit",
        (start_s, end_s)).fetchall()
    return [PodUnit(str(ns), str(pod), str(container), str(unit), int(gpu), str(sharing))
            for ns, pod, container, unit, gpu, sharing, _newest in rows]


def on_grid(times: FloatArray, values: FloatArray, start_s: float, end_s: float, step_s: float) -> FloatArray:
    """``values`` (at bucket starts ``times``) on every bucket start of ``[start_s, end_s)``, NaN where none: a line
    breaks where nothing was recorded."""
    grid = grid_times(start_s, end_s, step_s)
    lookup = dict(zip(times.tolist(), values.tolist(), strict=True))
    return np.array([lookup.get(t, math.nan) for t in grid.tolist()], dtype=np.float64)


def grid_times(start_s: float, end_s: float, step_s: float) -> FloatArray:
    """The bucket starts (multiples of ``step_s``) from the one holding ``start_s`` to the one before ``end_s``."""
    first = math.floor(start_s / step_s) * step_s
    count = max(0, math.ceil((end_s - first) / step_s))
    return first + step_s * np.arange(count, dtype=np.float64)
