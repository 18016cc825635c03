"""The downsampled tiers: how raw readings are rolled up into 10 s, 1 min and 10 min buckets, and how long each
is kept.

Tier choices (8 GPUs at the default 0.5 s interval; sizes measured by ``benchmarks/history.py``):

- raw: every reading, kept 6 h (``RAW_KEEP_S``). Ranges up to about an hour read it, and the CSV export writes
  it as nvidia-smi logs would.
- 10 s: min/mean/max per bucket, kept 2 days: the 6 h and 12 h ranges.
- 1 min: kept for the whole retention: 24 h and 2 d ranges, and short custom ranges in the past.
- 10 min: kept for the whole retention: the 7-day range reads 1,008 buckets a series instead of 10,080.

10 s buckets are computed from raw rows, 1 min ones from 10 s ones and 10 min ones from 1 min ones, each
coarser mean weighted by the readings behind it (``n``), so every mean is the true mean of its readings while a
flush recomputes at most a few rows per tier. A query groups the chosen tier into its own step (see
:mod:`nvdash.history.query`), so no range returns more than a few thousand points a series. Counters keep
their largest value per bucket, flags and bitmasks their OR.

Low-water marks: each prune records, per table, the time before which its rows are gone (``meta`` key
``pruned_before:<table>``). A bucket that starts at or after its source's mark is complete in the source and is
recomputed (``INSERT OR REPLACE``). One before it is not: its source rows were pruned, so recomputing it would
replace the readings it summarises with whatever the source still holds (readings stamped there after the wall
clock jumped back, say). Such a bucket is only added where the tier has none (``INSERT OR IGNORE``); an existing
one is kept as it is, and the late readings stay in the finer tables.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from nvdash.history.catalog import Kind, Metric, Scope, metrics_of

RAW_KEEP_S = 6 * 3600.0
DAY_S = 86_400.0
DEFAULT_RETENTION_S = 7 * DAY_S


@dataclass(frozen=True)
class Tier:
    """One downsampled tier: its table suffix, bucket width and how long its rows are kept."""

    name: str
    step_s: float
    keep_s: float | None
    """Seconds kept before the newest row; ``None``: the whole retention."""
    source: str = "raw"
    """What it is computed from: ``raw``, or the name of a finer tier."""


TIERS: tuple[Tier, ...] = (
    Tier("10s", 10.0, 2 * DAY_S),
    Tier("1m", 60.0, None, source="10s"),
    Tier("10m", 600.0, None, source="1m"),
)


def bucket_start(time_s: float, step_s: float) -> float:
    """The start of the ``step_s`` bucket holding ``time_s``."""
    return math.floor(time_s / step_s) * step_s


def aggregates(metric: Metric, raw: bool) -> tuple[str, str, str]:
    """SQL for a bucket's minimum, mean and maximum of ``metric``, over raw rows or over a tier's buckets.

    Counters give their largest value, flags and bitmasks their OR, three times. Over a tier, the mean weighs
    each bucket by its readings (``n``), counting only the buckets that have a value.
    """
    name = metric.name
    if metric.kind is Kind.BITS:
        value = f"bit_or({metric.expression if raw else name + '_or'})"
        return value, value, value
    if metric.kind is Kind.COUNTER:
        value = f"max({metric.expression if raw else name + '_max'})"
        return value, value, value
    if raw:
        expression = metric.expression
        return f"min({expression})", f"avg({expression})", f"max({expression})"
    mean = f"sum({name}_mean * n) / sum(CASE WHEN {name}_mean IS NOT NULL THEN n END)"
    return f"min({name}_min)", mean, f"max({name}_max)"


def _tier_aggregates(metric: Metric, raw: bool) -> list[str]:
    """The aggregates filling ``metric.tier_columns()``."""
    minimum, mean, maximum = aggregates(metric, raw)
    if metric.kind is Kind.GAUGE:
        return [minimum, mean, maximum]
    return [maximum]


class BitOr:
    """SQLite aggregate: the bitwise OR of the non-null integer values, NULL when there are none."""

    def __init__(self) -> None:
        self.value: int | None = None

    def step(self, value: float | int | None) -> None:
        if value is not None:
            self.value = int(value) | (self.value or 0)

    def finalize(self) -> int | None:
        return self.value


def register_functions(connection: sqlite3.Connection) -> None:
    """Add the aggregates the rollups use to ``connection``."""
    connection.create_aggregate("bit_or", 1, BitOr)  # type: ignore[arg-type]


def rollup_sql(scope: Scope, tier: Tier, replace: bool = True) -> str:
    """The tier's buckets computed from its source's rows with ``? <= t < ?``: ``INSERT OR REPLACE`` (or
    ``INSERT OR IGNORE``: only buckets the tier lacks)."""
    metrics = metrics_of(scope)
    raw = tier.source == "raw"
    columns = [column for metric in metrics for column in metric.tier_columns()]
    values = [aggregate for metric in metrics for aggregate in _tier_aggregates(metric, raw)]
    bucket = f"(CAST(t / {tier.step_s} AS INTEGER) * {tier.step_s})"
    count = "count(*)" if raw else "sum(n)"
    source = f"{scope.value}_{tier.source}"
    verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
    if scope is Scope.GPU:
        return (f"{verb} INTO gpu_{tier.name} (t, gpu, n, {', '.join(columns)}) "
                f"SELECT {bucket} AS b, gpu, {count}, {', '.join(values)} FROM {source} "
                "WHERE t >= ? AND t < ? GROUP BY b, gpu")
    return (f"{verb} INTO host_{tier.name} (t, n, {', '.join(columns)}) "
            f"SELECT {bucket} AS b, {count}, {', '.join(values)} FROM {source} "
            "WHERE t >= ? AND t < ? GROUP BY b")


MARK_PREFIX = "pruned_before:"


def low_water_marks(connection: sqlite3.Connection) -> dict[str, float]:
    """Per table, the time before which a prune deleted its rows (see the module's docstring)."""
    return {key[len(MARK_PREFIX):]: float(value) for key, value in connection.execute(
        "SELECT key, value FROM meta WHERE key >= ? AND key < ?", (MARK_PREFIX, MARK_PREFIX[:-1] + ";"))}


def _spans(first: float, last: float, step_s: float, mark: float | None) -> list[tuple[bool, float, float]]:
    """``[first, last)`` split at the first bucket at or after ``mark``: ``(replace, start, end)`` spans."""
    split = first if mark is None else max(first, math.ceil(mark / step_s) * step_s)
    spans = []
    if split > first:
        spans.append((False, first, min(split, last)))
    if split < last:
        spans.append((True, split, last))
    return spans


def rollup(connection: sqlite3.Connection, start_s: float, end_s: float) -> None:
    """Recompute every tier's buckets overlapping ``[start_s, end_s)`` from their sources (in a transaction).

    Tiers are recomputed finest first, so one computed from another sees its new buckets. Buckets before their
    source's low-water mark are only added, never replaced."""
    marks = low_water_marks(connection)
    for tier in TIERS:
        first = bucket_start(start_s, tier.step_s)
        last = bucket_start(end_s, tier.step_s) + tier.step_s
        for scope in (Scope.GPU, Scope.HOST):
            for replace, span_start, span_end in _spans(first, last, tier.step_s,
                                                        marks.get(f"{scope.value}_{tier.source}")):
                connection.execute(rollup_sql(scope, tier, replace), (span_start, span_end))
    first, last = bucket_start(start_s, 60.0), bucket_start(end_s, 60.0) + 60.0
    for replace, span_start, span_end in _spans(first, last, 60.0, marks.get("processes")):
        statement = PROCESS_ROLLUP if replace else PROCESS_ROLLUP.replace("OR REPLACE", "OR IGNORE", 1)
        connection.execute(statement, (span_start, span_end))


PROCESS_ROLLUP = (
    "INSERT OR REPLACE INTO processes_1m (t, gpu, pid, n, started_s, mig_uuid, kinds, gpu_memory_bytes_max,"
    " sm_pct_mean, memory_pct_mean, user, command, container_id, pod_namespace, pod_name, container_name,"
    " slurm_job) SELECT (CAST(t / 60.0 AS INTEGER) * 60.0) AS b, gpu, pid, count(*), max(started_s),"
    " max(mig_uuid), max(kinds), max(gpu_memory_bytes), avg(sm_pct), avg(memory_pct), max(user), max(command),"
    " max(container_id), max(pod_namespace), max(pod_name), max(container_name), max(slurm_job) FROM processes"
    " WHERE t >= ? AND t < ? GROUP BY b, gpu, pid"
)
"""The per-minute process tier, from the process readings (one per process and reading)."""


def prune(connection: sqlite3.Connection, newest_s: float, retention_s: float) -> int:
    """Delete rows older than each table's horizon before ``newest_s`` (the writer's clock-safe horizon, see
    :mod:`nvdash.history.retention_clock`) and raise the tables' low-water marks; returns how many rows went."""
    horizons = {
        "gpu_raw": min(RAW_KEEP_S, retention_s), "host_raw": min(RAW_KEEP_S, retention_s),
        "nvlink_state": retention_s, "events": retention_s,
        "processes": min(RAW_KEEP_S, retention_s), "processes_1m": retention_s,
    }
    for tier in TIERS:
        keep = retention_s if tier.keep_s is None else min(tier.keep_s, retention_s)
        horizons[f"gpu_{tier.name}"] = keep
        horizons[f"host_{tier.name}"] = keep
    marks = low_water_marks(connection)
    removed = 0
    for table, keep in horizons.items():
        cutoff = newest_s - keep
        removed += connection.execute(f"DELETE FROM {table} WHERE t < ?", (cutoff,)).rowcount
        if cutoff > marks.get(table, -math.inf):
            connection.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                               (MARK_PREFIX + table, repr(cutoff)))
    return removed
