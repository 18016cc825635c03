"""Reading the history back: one interface (:class:`HistoryBackend`), an SQLite backend, series with gaps.

A query names metrics, a time range and optionally GPUs and a step. The backend picks the coarsest stored
resolution that still has at least one point per step and covers the range, groups it into ``step`` buckets
(min of the minima, the mean weighted by readings, max of the maxima) and returns one series per GPU (or one
for the host).
Where nothing was recorded for longer than a few steps (nvdash was not running, a GPU was lost) the series
holds a NaN point, so a plot shows a gap instead of a line across it.
"""

from __future__ import annotations

import itertools
import math
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from nvdash.history import inventory_json
from nvdash.history.catalog import METRICS, Metric, Scope
from nvdash.history.database import HistoryError, open_database
from nvdash.history.tiers import TIERS, aggregates, register_functions
from nvdash.history.trust import QUERY_BUDGET_S, Deadline, guard, readable_error
from nvdash.sampling.records import GpuEvent, Inventory

FloatArray = npt.NDArray[np.float64]
TARGET_POINTS = 1000
"""About this many points a series (at most twice as many), whatever the range: a 7-day view reads a thousand
buckets a GPU, not a million readings."""
MAX_POINTS = 20_000
"""The most buckets a query may ask for with ``step``."""
GAP_STEPS = 3.0
"""A silence longer than this many steps (or resolution steps) is drawn as a gap."""


@dataclass(frozen=True)
class Series:
    """One series: bucket start times (epoch seconds) and the min, mean and max of each bucket."""

    time_s: FloatArray
    mean: FloatArray
    minimum: FloatArray
    maximum: FloatArray


@dataclass(frozen=True)
class HistoryResult:
    """A query's answer: per metric, per GPU index (``None`` for a host metric), one series."""

    start_s: float
    end_s: float
    step_s: float
    resolution: str
    """What was read: ``raw``, ``10s`` or ``1m`` (or the Prometheus backend's own name)."""
    series: dict[str, dict[int | None, Series]]
    events: tuple[GpuEvent, ...] = ()
    """The range's events, newest last, when they were asked for (see :meth:`HistoryBackend.events`)."""


class HistoryBackend(Protocol):
    """Where past readings come from: the local file, or (for a cluster) Prometheus."""

    def query(self, metrics: Sequence[str], start_s: float, end_s: float,
              gpus: Sequence[int] | None = None, step_s: float | None = None) -> HistoryResult:
        """The named metrics over ``[start_s, end_s]``; raises ``ValueError`` for a bad request."""
        ...

    def extent(self) -> tuple[float, float] | None:
        """The oldest and newest reading held, ``None`` when empty."""
        ...

    def events(self, start_s: float, end_s: float, limit: int) -> list[GpuEvent]:
        """The newest ``limit`` events in ``[start_s, end_s]``, oldest first (empty where none are kept)."""
        ...

    def describe(self) -> str:
        """Where the history comes from, for the index page and ``/health``."""
        ...


def check_request(metrics: Sequence[str], start_s: float, end_s: float, step_s: float | None) -> list[Metric]:
    """The metrics named; raises ``ValueError`` with a one-line message for an unknown one or a bad range."""
    unknown = [name for name in metrics if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; known metrics: {', '.join(METRICS)}")
    if not metrics:
        raise ValueError("name at least one metric")
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or start_s >= end_s:
        raise ValueError("the range's start must be before its end")
    if step_s is not None and (not math.isfinite(step_s) or step_s <= 0):
        raise ValueError("step must be a positive number of seconds")
    if step_s is not None and (end_s - start_s) / step_s > MAX_POINTS:
        raise ValueError(f"step {step_s:g} s gives more than {MAX_POINTS} points over this range; choose a larger one")
    return [METRICS[name] for name in metrics]


def with_gaps(series: Series, gap_s: float) -> Series:
    """``series`` with a NaN point after each silence longer than ``gap_s``."""
    times = series.time_s
    if len(times) < 2:
        return series
    breaks = np.nonzero(np.diff(times) > gap_s)[0]
    if not len(breaks):
        return series
    at = breaks + 1
    gap_times = times[breaks] + gap_s / GAP_STEPS

    def insert(values: FloatArray, filler: FloatArray | float) -> FloatArray:
        return np.insert(values, at, filler)

    return Series(insert(times, gap_times), insert(series.mean, math.nan), insert(series.minimum, math.nan),
                  insert(series.maximum, math.nan))


@dataclass(frozen=True)
class _Source:
    name: str
    step_s: float
    raw: bool


class SqliteHistory:
    """Queries over a history file; each thread reads through its own read-only, guarded connection (see
    :mod:`nvdash.history.trust`): each query ends within ``query_budget_s`` or fails with a ``HistoryError``."""

    def __init__(self, path: Path, query_budget_s: float = QUERY_BUDGET_S) -> None:
        self.path = path
        self.query_budget_s = query_budget_s
        self._local = threading.local()

    def connection(self) -> sqlite3.Connection:
        """This thread's read-only connection to the file (opened on first use)."""
        return self._connection()

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = open_database(self.path, read_only=True)
            try:
                register_functions(connection)
                guard(connection, self.path, self._deadline())
            except BaseException:
                connection.close()
                raise
            self._local.connection = connection
        return connection

    def close(self) -> None:
        """Close this thread's connection (the next read opens a new one)."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is not None:
            self._local.connection = None
            connection.close()

    def _deadline(self) -> Deadline:
        deadline: Deadline | None = getattr(self._local, "deadline", None)
        if deadline is None:
            deadline = self._local.deadline = Deadline(self.query_budget_s)
        return deadline

    @contextmanager
    def reading(self, budget_s: float | None = None) -> Iterator[sqlite3.Connection]:
        """This thread's connection, its statements inside bounded by ``budget_s`` (the query budget by
        default); a failed read (a spent budget, an oversized value, a crafted file) is a one-line
        ``HistoryError``."""
        deadline = self._deadline()
        try:
            connection = self._connection()
            with deadline.budget(self.query_budget_s if budget_s is None else budget_s):
                yield connection
        except (sqlite3.Error, ValueError, TypeError, OverflowError) as error:
            raise readable_error(self.path, error, deadline) from None

    def describe(self) -> str:
        return f"file {self.path}"

    def _fetch(self, sql: str, parameters: Sequence[float | int] = ()) -> list[tuple[Any, ...]]:
        """All rows of ``sql``; a damaged file or a query past its budget is a one-line ``HistoryError``."""
        with self.reading() as connection:
            return connection.execute(sql, parameters).fetchall()

    def raw_interval_s(self) -> float:
        """The newest session's sampling interval (the raw resolution), 1 s when unknown."""
        rows = self._fetch("SELECT interval_s FROM sessions WHERE interval_s > 0 ORDER BY id DESC LIMIT 1")
        return float(rows[0][0]) if rows else 1.0

    def inventory_text(self) -> str | None:
        """The newest session's inventory as stored (JSON), ``None`` when no session was recorded."""
        rows = self._fetch("SELECT inventory FROM sessions ORDER BY id DESC LIMIT 1")
        return None if not rows else str(rows[0][0])

    def inventory(self) -> Inventory | None:
        """The newest session's inventory."""
        text = self.inventory_text()
        try:
            return None if text is None else inventory_json.loads(text)
        except ValueError as error:
            raise HistoryError(f"history file {self.path} holds an unreadable inventory ({error})") from None

    def extent(self) -> tuple[float, float] | None:
        oldest: list[float] = []
        newest: list[float] = []
        for table in ("gpu_raw", "host_raw", *(f"{scope}_{tier.name}" for tier in TIERS for scope in ("gpu", "host"))):
            first, last = self._fetch(f"SELECT min(t), max(t) FROM {table}")[0]
            if first is not None:
                oldest.append(first)
                newest.append(last)
        return (min(oldest), max(newest)) if oldest else None

    def events(self, start_s: float, end_s: float, limit: int) -> list[GpuEvent]:
        rows = self._fetch("SELECT t, gpu, kind, message, severity, code, counter FROM events WHERE t >= ? AND t <= ?"
                           " ORDER BY t DESC, id DESC LIMIT ?", (start_s, end_s, limit))
        return [GpuEvent(time_s=row[0], gpu_index=row[1], kind=row[2], message=row[3], severity=row[4], code=row[5],
                         counter=row[6]) for row in reversed(rows)]

    def _oldest(self, table: str) -> float | None:
        rows = self._fetch(f"SELECT min(t) FROM {table}")
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def _choose(self, scope: Scope, start_s: float, step_s: float) -> _Source:
        """The coarsest source whose resolution fits in ``step_s`` and that covers ``start_s``."""
        raw = _Source("raw", self.raw_interval_s(), True)
        sources = [raw, *(_Source(tier.name, tier.step_s, False) for tier in TIERS)]
        fitting = [source for source in sources if source.step_s <= step_s] or [raw]
        oldest = {source.name: self._oldest(f"{scope.value}_{source.name}") for source in fitting}
        for source in reversed(fitting):
            first = oldest[source.name]
            if first is not None and first <= start_s + source.step_s:
                return source
        held = [source for source in fitting if oldest[source.name] is not None]
        if not held:
            return fitting[-1]
        return min(reversed(held), key=lambda source: oldest[source.name] or math.inf)

    def query(self, metrics: Sequence[str], start_s: float, end_s: float,
              gpus: Sequence[int] | None = None, step_s: float | None = None) -> HistoryResult:
        chosen = check_request(metrics, start_s, end_s, step_s)
        wanted = step_s if step_s is not None else (end_s - start_s) / TARGET_POINTS
        result: dict[str, dict[int | None, Series]] = {}
        resolution = "raw"
        used_step = wanted
        for scope in (Scope.GPU, Scope.HOST):
            group = [metric for metric in chosen if metric.scope is scope]
            if not group:
                continue
            source = self._choose(scope, start_s, wanted)
            step = max(wanted, source.step_s)
            if not source.raw:
                step = math.floor(step / source.step_s) * source.step_s
            resolution, used_step = source.name, step
            result.update(self._read(scope, group, source, start_s=start_s, end_s=end_s,
                                     step_s=step, gpus=gpus))
        return HistoryResult(start_s, end_s, used_step, resolution, {name: result[name] for name in metrics})

    def _read(self, scope: Scope, metrics: Sequence[Metric], source: _Source, *, start_s: float, end_s: float,
              step_s: float, gpus: Sequence[int] | None) -> dict[str, dict[int | None, Series]]:
        origin = math.floor(start_s / step_s) * step_s
        selects: list[str] = []
        for metric in metrics:
            selects += aggregates(metric, source.raw)
        table = f"{scope.value}_{source.name}"
        key = "gpu" if scope is Scope.GPU else "NULL"
        sql = (f"SELECT CAST((t - ?) / ? AS INTEGER) AS k, {key} AS g, {', '.join(selects)} FROM {table} "
               "WHERE t >= ? AND t <= ?")
        parameters: list[float | int] = [origin, step_s, start_s, end_s]
        if gpus is not None and scope is Scope.GPU:
            sql += f" AND gpu IN ({', '.join('?' * len(gpus))})"
            parameters += list(gpus)
        sql += " GROUP BY g, k ORDER BY g, k"
        rows = self._fetch(sql, parameters)
        result: dict[str, dict[int | None, Series]] = {metric.name: {} for metric in metrics}
        if not rows:
            return result
        data = np.array(rows, dtype=np.float64)
        keys = [row[1] for row in rows]
        gap_s = GAP_STEPS * max(step_s, source.step_s)
        bounds = [0, *[i for i in range(1, len(keys)) if keys[i] != keys[i - 1]], len(keys)]
        for first, last in itertools.pairwise(bounds):
            block = data[first:last]
            times = origin + block[:, 0] * step_s
            gpu = keys[first]
            for offset, metric in enumerate(metrics):
                column = 2 + 3 * offset
                series = Series(times, block[:, column + 1], block[:, column], block[:, column + 2])
                result[metric.name][None if gpu is None else int(gpu)] = with_gaps(series, gap_s)
        return result
