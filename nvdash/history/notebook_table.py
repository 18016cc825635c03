"""The history's notebook memory table: each Jupyter kernel's GPU memory and SM use per minute and GPU.

Rows are one minute (the history's 1 min tier, kept for the whole retention) per kernel and GPU, written from each
process reading's :class:`~nvdash.sampling.notebook_records.NotebookView` (a reading repeated in several snapshots
is stored once): storing a reading adds to its minute's row (readings counted in ``n``), so a row's means are the
means of the readings behind it and its maximum their largest. Only kernels that hold GPU memory are stored (a kernel
holding nothing has no row, so a minute with no row reads as nothing held). MIG instances of one GPU held by one
kernel are summed into the GPU's row (their SM % is averaged).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nvdash.sampling.notebook_records import KernelGpuUse, NotebookView

BUCKET_S = 60.0
"""A row's span: the 1 min tier's step."""
TABLE = (
    "CREATE TABLE IF NOT EXISTS notebook_memory (t REAL NOT NULL, kernel_id TEXT NOT NULL, title TEXT NOT NULL,"
    " gpu_uuid TEXT NOT NULL, gpu INTEGER NOT NULL, n INTEGER NOT NULL, memory_n INTEGER NOT NULL,"
    " memory_bytes_sum REAL NOT NULL, memory_bytes_max REAL, sm_n INTEGER NOT NULL, sm_pct_sum REAL NOT NULL,"
    " PRIMARY KEY (t, kernel_id, gpu_uuid)) WITHOUT ROWID"
)
"""The table (created in every history; ``IF NOT EXISTS`` adds it to a file written before it existed)."""
UPSERT = (
    "INSERT INTO notebook_memory (t, kernel_id, title, gpu_uuid, gpu, n, memory_n, memory_bytes_sum,"
    " memory_bytes_max, sm_n, sm_pct_sum) VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?)"
    " ON CONFLICT (t, kernel_id, gpu_uuid) DO UPDATE SET n = n + 1, title = excluded.title,"
    " memory_n = memory_n + excluded.memory_n, memory_bytes_sum = memory_bytes_sum + excluded.memory_bytes_sum,"
    " memory_bytes_max = CASE WHEN excluded.memory_bytes_max IS NULL THEN memory_bytes_max"
    " WHEN memory_bytes_max IS NULL THEN excluded.memory_bytes_max"
    " ELSE max(memory_bytes_max, excluded.memory_bytes_max) END,"
    " sm_n = sm_n + excluded.sm_n, sm_pct_sum = sm_pct_sum + excluded.sm_pct_sum"
)
_READ = (
    "SELECT t, kernel_id, title, gpu_uuid, gpu, n, memory_bytes_max,"
    " memory_bytes_sum / NULLIF(memory_n, 0), sm_pct_sum / NULLIF(sm_n, 0)"
    " FROM notebook_memory WHERE t >= ? AND t < ? ORDER BY t, kernel_id, gpu"
)


def bucket_of(time_s: float) -> float:
    """The start of the minute holding ``time_s``."""
    return math.floor(time_s / BUCKET_S) * BUCKET_S


def _per_gpu(gpus: Iterable[KernelGpuUse]) -> dict[str, tuple[int, int | None, float | None]]:
    """Per GPU UUID: its index, the memory held on it (``None`` when a part is unknown) and the mean SM %."""
    found: dict[str, tuple[int, int | None, list[float]]] = {}
    for use in gpus:
        index, memory, sm = found.get(use.gpu_uuid, (use.gpu_index, 0, []))
        memory = None if memory is None or use.memory_bytes is None else memory + use.memory_bytes
        found[use.gpu_uuid] = (index, memory, sm + ([] if use.sm_pct is None else [use.sm_pct]))
    return {uuid: (index, memory, sum(sm) / len(sm) if sm else None) for uuid, (index, memory, sm) in found.items()}


def notebook_rows(view: NotebookView | None) -> list[tuple[Any, ...]]:
    """The upsert parameters of one process reading: one per kernel holding memory and GPU it holds memory on."""
    if view is None or view.state != "ok":
        return []
    rows = []
    bucket = bucket_of(view.time_s)
    for use in view.kernels:
        if not use.holds_memory:
            continue
        for uuid, (index, memory, sm) in _per_gpu(use.gpus).items():
            if memory == 0:
                continue
            rows.append((bucket, use.kernel.id, use.kernel.title, uuid, index, 0 if memory is None else 1,
                         float(memory or 0), None if memory is None else float(memory),
                         0 if sm is None else 1, sm or 0.0))
    return rows


def store(connection: sqlite3.Connection, view: NotebookView | None) -> int:
    """Add one process reading's kernels (inside the caller's transaction); returns the rows touched."""
    rows = notebook_rows(view)
    connection.executemany(UPSERT, rows)
    return len(rows)


def prune(connection: sqlite3.Connection, before_s: float) -> int:
    """Delete the minutes that started before ``before_s``; returns the rows deleted."""
    return connection.execute("DELETE FROM notebook_memory WHERE t < ?", (before_s,)).rowcount


def has_table(connection: sqlite3.Connection) -> bool:
    """Whether the file has the table (a history written before it did not)."""
    count: int = connection.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'notebook_memory'").fetchone()[0]
    return count > 0


@dataclass(frozen=True, slots=True)
class NotebookMinute:
    """One kernel's use of one GPU over one minute."""

    minute_s: float
    """The minute's start (seconds since the epoch)."""
    kernel_id: str
    title: str
    """The notebook's path (the newest reading's), or ``Kernel <name> <id prefix>`` for a kernel without one."""
    gpu_uuid: str
    gpu_index: int
    readings: int
    memory_bytes_max: float | None
    """The largest memory held in the minute's readings; ``None`` when none gave a value."""
    memory_bytes_mean: float | None
    sm_pct_mean: float | None


def notebook_minutes(connection: sqlite3.Connection, start_s: float, end_s: float) -> list[NotebookMinute]:
    """The rows of the minutes starting in ``[start_s, end_s)``, by minute, kernel and GPU."""
    return [NotebookMinute(float(t), str(kernel), str(title), str(uuid), int(gpu), int(n),
                           None if peak is None else float(peak), None if mean is None else float(mean),
                           None if sm is None else float(sm))
            for t, kernel, title, uuid, gpu, n, peak, mean, sm in connection.execute(_READ, (start_s, end_s))]
