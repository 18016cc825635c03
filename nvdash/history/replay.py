"""Replaying a recording: the newest readings of a history file turned back into snapshots and events.

``nvdash replay FILE`` fills the in-memory store from these, so the bar charts and tables show the end of the
recording, and serves the timelines' past ranges from the file itself. NVML is never touched.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from nvdash.history.catalog import METRICS as _METRICS
from nvdash.history.catalog import Kind, gpu_raw_columns, host_raw_columns
from nvdash.history.database import HistoryError
from nvdash.history.trust import file_of, readable_error
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, Snapshot

T = TypeVar("T")

_BOOLEAN = frozenset(name for name in gpu_raw_columns() if _METRICS[name].kind is Kind.BITS
                     and name != "clock_event_reasons")
_INTEGRAL = frozenset({"memory_used_bytes", "memory_total_bytes", "memory_reserved_bytes", "energy_mj", "pstate",
                       "clock_event_reasons", "pcie_generation_current", "pcie_width_current"}
                      | {name for name in gpu_raw_columns() if _METRICS[name].kind is Kind.COUNTER})


def _value(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in _BOOLEAN:
        return bool(value)
    if name in _INTEGRAL:
        return int(value)
    return float(value)


def gpu_sample(index: int, values: dict[str, Any], error: str | None = None) -> GpuSample:
    """A ``GpuSample`` from raw column values (as stored: numbers, 0/1 flags)."""
    fields = {name: _value(name, values.get(name)) for name in gpu_raw_columns()}
    fields["lost"] = bool(fields["lost"])
    fields["nvlink_partial"] = bool(fields["nvlink_partial"])
    return GpuSample(index=index, error=error, **fields)


def _readable(connection: sqlite3.Connection, read: Callable[[], T]) -> T:
    """``read()``, a failure (a query past its budget, a value of the wrong type) as a one-line ``HistoryError``."""
    try:
        return read()
    except HistoryError:
        raise
    except (sqlite3.Error, ValueError, TypeError, OverflowError) as error:
        raise readable_error(file_of(connection), error) from None


def recent_snapshots(connection: sqlite3.Connection, limit: int) -> list[Snapshot]:
    """The newest ``limit`` readings as snapshots, oldest first; raises a one-line ``HistoryError``."""
    return _readable(connection, lambda: _recent_snapshots(connection, limit))


def _recent_snapshots(connection: sqlite3.Connection, limit: int) -> list[Snapshot]:
    gpu_columns = gpu_raw_columns()
    host_columns = host_raw_columns()
    times = [row[0] for row in connection.execute(
        "SELECT DISTINCT t FROM gpu_raw ORDER BY t DESC LIMIT ?", (limit,))]
    host_times = [row[0] for row in connection.execute(
        "SELECT t FROM host_raw ORDER BY t DESC LIMIT ?", (limit,))]
    times = sorted(set(times) | set(host_times))[-limit:]
    if not times:
        return []
    first = times[0]
    gpus: dict[float, list[GpuSample]] = defaultdict(list)
    for row in connection.execute(
            f"SELECT t, gpu, error, {', '.join(gpu_columns)} FROM gpu_raw WHERE t >= ? ORDER BY t, gpu", (first,)):
        gpus[row[0]].append(gpu_sample(int(row[1]), dict(zip(gpu_columns, row[3:], strict=True)), row[2]))
    hosts: dict[float, HostSample] = {}
    for row in connection.execute(f"SELECT t, {', '.join(host_columns)} FROM host_raw WHERE t >= ?", (first,)):
        hosts[row[0]] = HostSample(**{name: int(value) if value is not None and name.endswith("_bytes") else value
                                      for name, value in zip(host_columns, row[1:], strict=True)})
    return [Snapshot(time_s=t, gpus=tuple(gpus.get(t, ())), host=hosts.get(t, HostSample())) for t in times]


def recent_events(connection: sqlite3.Connection, limit: int) -> list[GpuEvent]:
    """The newest ``limit`` events, oldest first; raises a one-line ``HistoryError``."""
    return _readable(connection, lambda: _recent_events(connection, limit))


def _recent_events(connection: sqlite3.Connection, limit: int) -> list[GpuEvent]:
    rows = connection.execute(
        "SELECT t, gpu, kind, message, severity, code, counter FROM events ORDER BY t DESC, id DESC LIMIT ?",
        (limit,)).fetchall()
    return [GpuEvent(time_s=row[0], gpu_index=row[1], kind=row[2], message=row[3], severity=row[4], code=row[5],
                     counter=row[6]) for row in reversed(rows)]
