"""``nvdash export`` / ``/export.csv`` and ``nvdash import``: the history as nvidia-smi CSV logs, both ways.

Export writes one line per GPU and reading, as ``nvidia-smi --query-gpu=... --format=csv -l`` would have: the
raw readings where they are still kept, the finest tier's bucket means (one line per bucket) before that.
Import reads such a log into the history; a reading already there (same time, same GPU) is not added twice.
"""

from __future__ import annotations

import itertools
import math
import sqlite3
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvdash.history import inventory_json, nvsmi_csv
from nvdash.history.catalog import METRICS, Kind, gpu_raw_columns
from nvdash.history.database import (
    HistoryError,
    lock_for_writing,
    open_database,
    transaction,
)
from nvdash.history.query import SqliteHistory
from nvdash.history.ranges import TimeRange
from nvdash.history.tiers import TIERS, register_functions, rollup
from nvdash.history.trust import check_file
from nvdash.history.writer import gpu_insert_sql
from nvdash.sampling.records import GpuInfo, HostInfo, Inventory

DEFAULT_FIELDS = "timestamp,index,name,utilization.gpu,memory.used,temperature.gpu,power.draw"
"""The fields exported when none are named (a common nvidia-smi logging command's)."""
BATCH_ROWS = 2000
"""Rows read (export) or written (import) at a time: memory holds one batch, whatever the range or the log."""
CHUNK_CHARS = 64 * 1024
"""About this much CSV text is sent at a time by ``/export.csv``."""
INTERVAL_SAMPLE = 10_000
"""Distinct reading times an import looks at for the log's sampling interval (their median step)."""
MAX_IDENTITIES = 4096
"""GPU identities counted for an import's summary (a log of more is not one machine's)."""


def _layout(text: str) -> tuple[bool, bool]:
    """``(header, units)`` from nvidia-smi's ``--format`` value (``csv[,noheader][,nounits]``)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or parts[0] != "csv" or any(part not in ("noheader", "nounits") for part in parts[1:]):
        raise ValueError(f"format {text!r} is not csv, csv,noheader, csv,nounits or csv,noheader,nounits")
    return "noheader" not in parts, "nounits" not in parts


MAX_FIELDS = 4 * len(nvsmi_csv.SUPPORTED_FIELDS)
"""The most fields an export may name (a field may repeat, but not without end)."""


def _fields(text: str) -> list[str]:
    fields = [part.strip() for part in (text or DEFAULT_FIELDS).split(",") if part.strip()]
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"{len(fields)} fields named; at most {MAX_FIELDS}")
    for name in fields:
        nvsmi_csv.resolve_field(name)
    return fields


def _tier_value(name: str) -> str:
    kind = METRICS[name].kind
    return f"{name}_mean" if kind is Kind.GAUGE else f"{name}_max" if kind is Kind.COUNTER else f"{name}_or"


def _batches(history: SqliteHistory, sql: str, parameters: Sequence[float]) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``sql`` in batches of :data:`BATCH_ROWS`, each fetched within the query budget; the
    consumer's time between batches does not count."""
    with history.reading() as connection:
        cursor = connection.execute(sql, parameters)
        batch = cursor.fetchmany(BATCH_ROWS)
    while batch:
        yield batch
        with history.reading():
            batch = cursor.fetchmany(BATCH_ROWS)


def _first(history: SqliteHistory, sql: str, parameters: Sequence[float] = ()) -> Any:
    with history.reading() as connection:
        return connection.execute(sql, parameters).fetchone()[0]


def _rows(history: SqliteHistory, start_s: float, end_s: float,
          gpus: Sequence[int] | None) -> Iterator[tuple[float, int, dict[str, Any]]]:
    """``(time, gpu, values)`` in time order: bucket means before the oldest raw reading, raw readings after."""
    columns = gpu_raw_columns()
    where = "" if gpus is None else f" AND gpu IN ({', '.join(str(int(gpu)) for gpu in gpus)})"
    raw_first = _first(history, "SELECT min(t) FROM gpu_raw")
    covered = end_s if raw_first is None else min(end_s, raw_first)
    if covered > start_s:
        yield from _tier_rows(history, start_s, covered, where)
    query = f"SELECT t, gpu, {', '.join(columns)} FROM gpu_raw WHERE t >= ? AND t <= ?{where} ORDER BY t, gpu"
    for batch in _batches(history, query, (start_s, end_s)):
        for row in batch:
            yield row[0], row[1], dict(zip(columns, row[2:], strict=True))


def _tier_rows(history: SqliteHistory, start_s: float, end_s: float,
               where: str) -> Iterator[tuple[float, int, dict[str, Any]]]:
    """The finest tier's bucket means over ``[start_s, end_s)``, each tier filling what the finer one lacks."""
    columns = gpu_raw_columns()
    select = ", ".join(_tier_value(name) for name in columns)
    pieces: list[tuple[str, float, float, float]] = []
    stop = end_s
    for tier in TIERS:
        if stop <= start_s:
            break
        first = _first(history, f"SELECT min(t) FROM gpu_{tier.name} WHERE t >= ?", (start_s,))
        if first is None or first + tier.step_s > stop:
            continue
        pieces.append((tier.name, tier.step_s, first, stop))
        stop = first
    # Only whole buckets before the finer data: a bucket overlapping raw readings is not written twice.
    for name, step, first, last in reversed(pieces):
        query = f"SELECT t, gpu, {select} FROM gpu_{name} WHERE t >= ? AND t <= ?{where} ORDER BY t, gpu"
        for batch in _batches(history, query, (first, last - step)):
            for row in batch:
                yield row[0], row[1], dict(zip(columns, row[2:], strict=True))


def export_lines(history: SqliteHistory, chosen: TimeRange, *, fields_text: str, layout: str,
                 gpus: Sequence[int] | None) -> Iterator[str]:
    """The CSV lines (without line ends) of the history over ``chosen``, read in batches as they are consumed.

    Raises ``ValueError`` for bad options before the first line, and a one-line ``HistoryError`` for a file
    that cannot be read (a query past its budget, a value that is not a number)."""
    fields = _fields(fields_text)
    header, units = _layout(layout)
    return _export_lines(history, chosen, fields, header=header, units=units, gpus=gpus)


def _export_lines(history: SqliteHistory, chosen: TimeRange, fields: list[str], *, header: bool, units: bool,
                  gpus: Sequence[int] | None) -> Iterator[str]:
    inventory = history.inventory()
    infos = {gpu.index: gpu for gpu in inventory.gpus} if inventory is not None else {}
    driver = inventory.driver_version if inventory is not None else None
    if header:
        yield nvsmi_csv.format_header(fields, units=True)
    for time_s, gpu, values in _rows(history, chosen.start_s, chosen.end_s, gpus):
        try:
            info = infos.get(gpu) or _unknown_gpu(int(gpu))
            line = nvsmi_csv.format_row(fields, time_s, info, values, driver, units=units)
        except (ValueError, TypeError, OverflowError, OSError) as error:
            raise HistoryError(f"history file {history.path} holds a reading nvdash cannot write at t={time_s!r} "
                               f"({error})") from None
        yield line


def _unknown_gpu(index: int) -> GpuInfo:
    return GpuInfo(index=index, name="", uuid="", memory_total_bytes=None, pcie_generation=None, pcie_width=None,
                   pcie_max_bytes_per_s=None, nvlink_links=0, nvlink_max_bytes_per_s=None)


def export_chunks(path: Path, chosen: TimeRange, fields: str, layout: str,
                  gpus: list[int] | None) -> Iterator[str]:
    """The export of the history at ``path`` as text chunks of about :data:`CHUNK_CHARS` (for ``/export.csv``,
    which sends each as it comes). Options are checked before the first chunk; the file is read through its
    own connection, closed when the chunks end or are closed."""
    history = SqliteHistory(path)
    lines = export_lines(history, chosen, fields_text=fields, layout=layout, gpus=gpus)
    return _chunks(history, lines)


def _chunks(history: SqliteHistory, lines: Iterator[str]) -> Iterator[str]:
    try:
        pending: list[str] = []
        size = 0
        for line in lines:
            pending.append(line + "\n")
            size += len(line) + 1
            if size >= CHUNK_CHARS:
                yield "".join(pending)
                pending, size = [], 0
        if pending:
            yield "".join(pending)
    finally:
        history.close()


@dataclass
class _Tally:
    """What an import learnt from the rows it has seen (bounded: per GPU, and a sample of the times)."""

    indices: dict[str, int] = field(default_factory=dict)
    """For logs without ``index``: each UUID (or bus id) numbered in order of first appearance."""
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    driver: str | None = None
    first_s: float = math.inf
    last_s: float = -math.inf
    times: list[float] = field(default_factory=list)
    """The first :data:`INTERVAL_SAMPLE` distinct reading times, for the sampling interval."""
    identities: set[tuple[int | None, str | None, str | None]] = field(default_factory=set)
    rows: int = 0

    def index(self, row: nvsmi_csv.LogRow) -> int:
        if row.index is not None:
            return row.index
        key = row.uuid or row.pci_bus_id or ""
        return self.indices.setdefault(key, len(self.indices))

    def add(self, row: nvsmi_csv.LogRow, index: int) -> None:
        self.rows += 1
        entry = self.gpus.setdefault(index, {})
        entry.setdefault("name", row.name)
        entry.setdefault("uuid", row.uuid)
        entry.setdefault("pci_bus_id", row.pci_bus_id)
        if row.values.get("memory_total_bytes") is not None:
            entry["memory_total_bytes"] = row.values["memory_total_bytes"]
        self.driver = self.driver or row.driver_version
        self.first_s, self.last_s = min(self.first_s, row.time_s), max(self.last_s, row.time_s)
        if len(self.times) < INTERVAL_SAMPLE and (not self.times or self.times[-1] != row.time_s):
            self.times.append(row.time_s)
        if len(self.identities) < MAX_IDENTITIES:
            self.identities.add((row.index, row.uuid, row.pci_bus_id))

    def interval_s(self) -> float:
        times = sorted(set(self.times))
        return statistics.median([b - a for a, b in itertools.pairwise(times)]) if len(times) > 1 else 1.0

    def inventory(self, source: str) -> Inventory:
        """GPUs as the log names them (name, UUID, bus id, memory total), for the import's session."""
        gpus = tuple(
            GpuInfo(index=index, name=entry.get("name") or f"GPU {index}", uuid=entry.get("uuid") or "",
                    memory_total_bytes=entry.get("memory_total_bytes"), pcie_generation=None, pcie_width=None,
                    pcie_max_bytes_per_s=None, nvlink_links=0, nvlink_max_bytes_per_s=None,
                    pci_bus_id=entry.get("pci_bus_id") or "")
            for index, entry in sorted(self.gpus.items()))
        return Inventory(host=HostInfo(hostname=source, cpu_count=0, memory_total_bytes=0), gpus=gpus,
                         driver_version=self.driver)


@dataclass
class ImportResult:
    """What an import did: readings added and already there, the reader (fields, bad lines) and the tally."""

    added: int
    present: int
    reader: nvsmi_csv.LogReader
    tally: _Tally


def import_batches(path: Path, lines: Iterable[str], source: str, max_errors: int | None = None) -> ImportResult:
    """Add a log's readings to the history at ``path``, reading and inserting :data:`BATCH_ROWS` at a time
    (in one transaction): memory holds one batch, whatever the log's length. Raises ``ValueError`` for a log
    without a header (nothing is written then)."""
    reader = nvsmi_csv.LogReader(max_errors=max_errors)
    tally = _Tally()
    check_file(path)
    lock = lock_for_writing(path)
    try:
        connection = open_database(path)
        register_functions(connection)
        try:
            added = _insert(connection, reader.rows(lines), tally, source)
        finally:
            connection.close()
    finally:
        lock.release()
    return ImportResult(added, tally.rows - added, reader, tally)


def _insert(connection: sqlite3.Connection, rows: Iterator[nvsmi_csv.LogRow], tally: _Tally, source: str) -> int:
    columns = gpu_raw_columns()[1:]
    sql = gpu_insert_sql()
    added = 0
    with transaction(connection):
        for chunk in _batched(rows):
            batch = []
            for row in chunk:
                index = tally.index(row)
                tally.add(row, index)
                batch.append((row.time_s, index, 0, *[row.values.get(name) for name in columns], None))
            before = connection.total_changes
            connection.executemany(sql, batch)
            added += connection.total_changes - before
        if not tally.rows:
            return 0
        inventory = inventory_json.dumps(tally.inventory(source))
        known = connection.execute("SELECT 1 FROM sessions WHERE source = ? AND inventory = ?",
                                   (source, inventory)).fetchone()
        if known is None:
            connection.execute("INSERT INTO sessions (started_s, source, interval_s, inventory) VALUES (?, ?, ?, ?)",
                               (tally.first_s, source, tally.interval_s(), inventory))
        rollup(connection, tally.first_s, tally.last_s)
    return added


def _batched(rows: Iterator[nvsmi_csv.LogRow]) -> Iterator[tuple[nvsmi_csv.LogRow, ...]]:
    while chunk := tuple(itertools.islice(rows, BATCH_ROWS)):
        yield chunk


def import_log(path: Path, lines: Iterable[str], source: str) -> tuple[int, int, nvsmi_csv.ParsedLog]:
    """Add a log's readings to the history at ``path``; returns ``(added, already there, what was read)`` (the
    parsed log without its rows: they were written, not kept)."""
    result = import_batches(path, lines, source)
    reader = result.reader
    return result.added, result.present, nvsmi_csv.ParsedLog(fields=reader.fields, errors=reader.errors,
                                                              ignored_fields=reader.ignored_fields)
