"""``nvdash export`` / ``/export.csv`` and ``nvdash import``: the history as nvidia-smi CSV logs, both ways.

Export writes one line per GPU and reading, as ``nvidia-smi --query-gpu=... --format=csv -l`` would have: the
raw readings where they are still kept, the finest tier's bucket means (one line per bucket) before that.
Import reads such a log into the history; a reading already there (same time, same GPU) is not added twice.
"""

from __future__ import annotations

import argparse
import itertools
import sqlite3
import statistics
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from nvdash.history import inventory_json, nvsmi_csv
from nvdash.history.catalog import METRICS, Kind, gpu_raw_columns
from nvdash.history.database import (
    HistoryError,
    HistoryLocked,
    default_path,
    lock_for_writing,
    open_database,
    transaction,
)
from nvdash.history.query import SqliteHistory
from nvdash.history.ranges import RangeError, TimeRange, resolve
from nvdash.history.tiers import TIERS, register_functions, rollup
from nvdash.history.writer import gpu_insert_sql
from nvdash.sampling.records import GpuInfo, HostInfo, Inventory

DEFAULT_FIELDS = "timestamp,index,name,utilization.gpu,memory.used,temperature.gpu,power.draw"
"""The fields exported when none are named (a common nvidia-smi logging command's)."""
SHOWN_ERRORS = 20
"""Bad lines listed one by one on import; the rest are counted."""


def _layout(text: str) -> tuple[bool, bool]:
    """``(header, units)`` from nvidia-smi's ``--format`` value (``csv[,noheader][,nounits]``)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or parts[0] != "csv" or any(part not in ("noheader", "nounits") for part in parts[1:]):
        raise ValueError(f"format {text!r} is not csv, csv,noheader, csv,nounits or csv,noheader,nounits")
    return "noheader" not in parts, "nounits" not in parts


def _fields(text: str) -> list[str]:
    fields = [part.strip() for part in (text or DEFAULT_FIELDS).split(",") if part.strip()]
    for name in fields:
        nvsmi_csv.resolve_field(name)
    return fields


def _tier_value(name: str) -> str:
    kind = METRICS[name].kind
    return f"{name}_mean" if kind is Kind.GAUGE else f"{name}_max" if kind is Kind.COUNTER else f"{name}_or"


def _rows(connection: sqlite3.Connection, start_s: float, end_s: float,
          gpus: Sequence[int] | None) -> Iterator[tuple[float, int, dict[str, Any]]]:
    """``(time, gpu, values)`` in time order: bucket means before the oldest raw reading, raw readings after."""
    columns = gpu_raw_columns()
    where = "" if gpus is None else f" AND gpu IN ({', '.join(str(int(gpu)) for gpu in gpus)})"
    raw_first = connection.execute("SELECT min(t) FROM gpu_raw").fetchone()[0]
    covered = end_s if raw_first is None else min(end_s, raw_first)
    if covered > start_s:
        yield from _tier_rows(connection, start_s, covered, where)
    query = f"SELECT t, gpu, {', '.join(columns)} FROM gpu_raw WHERE t >= ? AND t <= ?{where} ORDER BY t, gpu"
    for row in connection.execute(query, (start_s, end_s)):
        yield row[0], row[1], dict(zip(columns, row[2:], strict=True))


def _tier_rows(connection: sqlite3.Connection, start_s: float, end_s: float,
               where: str) -> Iterator[tuple[float, int, dict[str, Any]]]:
    """The finest tier's bucket means over ``[start_s, end_s)``, each tier filling what the finer one lacks."""
    columns = gpu_raw_columns()
    select = ", ".join(_tier_value(name) for name in columns)
    pieces: list[tuple[str, float, float, float]] = []
    stop = end_s
    for tier in TIERS:
        if stop <= start_s:
            break
        first = connection.execute(f"SELECT min(t) FROM gpu_{tier.name} WHERE t >= ?", (start_s,)).fetchone()[0]
        if first is None or first + tier.step_s > stop:
            continue
        pieces.append((tier.name, tier.step_s, first, stop))
        stop = first
    # Only whole buckets before the finer data: a bucket overlapping raw readings is not written twice.
    for name, step, first, last in reversed(pieces):
        query = f"SELECT t, gpu, {select} FROM gpu_{name} WHERE t >= ? AND t <= ?{where} ORDER BY t, gpu"
        for row in connection.execute(query, (first, last - step)):
            yield row[0], row[1], dict(zip(columns, row[2:], strict=True))


def export_lines(connection: sqlite3.Connection, inventory: Inventory | None, chosen: TimeRange, *,
                 fields_text: str, layout: str, gpus: Sequence[int] | None) -> Iterator[str]:
    """The CSV lines (without line ends) of the history over ``chosen``; raises ``ValueError`` for bad options."""
    fields = _fields(fields_text)
    header, units = _layout(layout)
    infos = {gpu.index: gpu for gpu in inventory.gpus} if inventory is not None else {}
    driver = inventory.driver_version if inventory is not None else None
    if header:
        yield nvsmi_csv.format_header(fields, units=True)
    for time_s, gpu, values in _rows(connection, chosen.start_s, chosen.end_s, gpus):
        info = infos.get(gpu) or _unknown_gpu(gpu)
        yield nvsmi_csv.format_row(fields, time_s, info, values, driver, units=units)


def _unknown_gpu(index: int) -> GpuInfo:
    return GpuInfo(index=index, name="", uuid="", memory_total_bytes=None, pcie_generation=None, pcie_width=None,
                   pcie_max_bytes_per_s=None, nvlink_links=0, nvlink_max_bytes_per_s=None)


def export_text(history: Any, chosen: TimeRange, fields: str, layout: str, gpus: list[int] | None) -> str:
    """The whole export as one string (for ``/export.csv``); ``history`` is the server's history runtime."""
    backend = SqliteHistory(history.path)
    connection = backend.connection()
    try:
        lines = list(export_lines(connection, backend.inventory(), chosen, fields_text=fields, layout=layout,
                                  gpus=gpus))
    finally:
        connection.close()
    return "".join(line + "\n" for line in lines)


def _history_path(value: str | None, environ: Mapping[str, str]) -> Path:
    from nvdash.cli import history_file  # noqa: PLC0415 - the command line's rule for --history / $NVDASH_HISTORY

    path = history_file(value, environ)
    return Path(path).expanduser() if path else default_path()


def run_export(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``nvdash export``: write the CSV to ``--output`` (standard output by default)."""
    from nvdash.cli import UsageError  # noqa: PLC0415

    history = SqliteHistory(_history_path(args.history, environ))
    extent = history.extent()
    if extent is None:
        raise HistoryError(f"{history.path} holds no readings to export")
    arguments = {key: value for key, value in (("range", args.range), ("from", args.start), ("to", args.end))
                 if value}
    try:
        chosen = resolve(arguments, extent[1]) or TimeRange(extent[0], extent[1], "all")
    except RangeError as error:
        raise UsageError(str(error)) from None
    gpus = None
    if args.gpus:
        try:
            gpus = [int(part) for part in args.gpus.split(",") if part.strip()]
        except ValueError:
            raise UsageError(f"--id must be GPU indices separated by commas, not {args.gpus!r}") from None
    try:
        lines = export_lines(history.connection(), history.inventory(), chosen, fields_text=args.query_gpu or "",
                             layout=args.format, gpus=gpus)
        first = next(lines, None)
    except ValueError as error:
        raise UsageError(str(error)) from None
    output: IO[str] = sys.stdout if args.output == "-" else _open_output(args.output)
    try:
        if first is not None:
            output.write(first + "\n")
        for line in lines:
            output.write(line + "\n")
    finally:
        if output is not sys.stdout:
            output.close()
    return 0


def _open_output(path: str) -> IO[str]:
    try:
        return open(path, "w", encoding="utf-8", newline="")
    except OSError as error:
        raise HistoryError(f"cannot write {path}: {error.strerror}") from None


def _read_lines(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.read().splitlines()
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as file:
            return file.read().splitlines()
    except OSError as error:
        raise HistoryError(f"cannot read {path}: {error.strerror}") from None


def _inventory(parsed: nvsmi_csv.ParsedLog, indices: Mapping[str, int], source: str) -> Inventory:
    """GPUs as the log names them (name, UUID, bus id, memory total), for the import's session."""
    seen: dict[int, dict[str, Any]] = {}
    driver = None
    for row in parsed.rows:
        index = _index(row, indices)
        entry = seen.setdefault(index, {})
        entry.setdefault("name", row.name)
        entry.setdefault("uuid", row.uuid)
        entry.setdefault("pci_bus_id", row.pci_bus_id)
        if row.values.get("memory_total_bytes") is not None:
            entry["memory_total_bytes"] = row.values["memory_total_bytes"]
        driver = driver or row.driver_version
    gpus = tuple(
        GpuInfo(index=index, name=entry.get("name") or f"GPU {index}", uuid=entry.get("uuid") or "",
                memory_total_bytes=entry.get("memory_total_bytes"), pcie_generation=None, pcie_width=None,
                pcie_max_bytes_per_s=None, nvlink_links=0, nvlink_max_bytes_per_s=None,
                pci_bus_id=entry.get("pci_bus_id") or "")
        for index, entry in sorted(seen.items()))
    return Inventory(host=HostInfo(hostname=source, cpu_count=0, memory_total_bytes=0), gpus=gpus,
                     driver_version=driver)


def _index_map(rows: Iterable[nvsmi_csv.LogRow]) -> dict[str, int]:
    """For logs without ``index``: each UUID (or bus id) numbered in order of first appearance."""
    keys: dict[str, int] = {}
    for row in rows:
        key = row.uuid or row.pci_bus_id
        if row.index is None and key and key not in keys:
            keys[key] = len(keys)
    return keys


def _index(row: nvsmi_csv.LogRow, indices: Mapping[str, int]) -> int:
    if row.index is not None:
        return row.index
    return indices[row.uuid or row.pci_bus_id or ""]


def _when(time_s: float) -> str:
    return datetime.fromtimestamp(time_s).strftime("%Y-%m-%d %H:%M:%S")


def import_log(path: Path, lines: Sequence[str], source: str) -> tuple[int, int, nvsmi_csv.ParsedLog]:
    """Add a log's readings to the history at ``path``; returns ``(added, already there, parsed log)``."""
    parsed = nvsmi_csv.parse_csv(lines)
    if not parsed.rows:
        return 0, 0, parsed
    indices = _index_map(parsed.rows)
    columns = gpu_raw_columns()
    rows = [(row.time_s, _index(row, indices), *[row.values.get(name) for name in columns[1:]], None)
            for row in parsed.rows]
    rows = [(row[0], row[1], 0, *row[2:]) for row in rows]
    times = sorted({row.time_s for row in parsed.rows})
    interval = statistics.median([b - a for a, b in itertools.pairwise(times)]) if len(times) > 1 else 1.0
    lock = lock_for_writing(path)
    try:
        connection = open_database(path)
        register_functions(connection)
        try:
            with transaction(connection):
                before = connection.total_changes
                connection.executemany(gpu_insert_sql(), rows)
                added = connection.total_changes - before
                inventory = inventory_json.dumps(_inventory(parsed, indices, source))
                known = connection.execute("SELECT 1 FROM sessions WHERE source = ? AND inventory = ?",
                                           (source, inventory)).fetchone()
                if known is None:
                    connection.execute(
                        "INSERT INTO sessions (started_s, source, interval_s, inventory) VALUES (?, ?, ?, ?)",
                        (times[0], source, interval, inventory))
                rollup(connection, times[0], times[-1])
        finally:
            connection.close()
    finally:
        lock.release()
    return added, len(rows) - added, parsed


def run_import(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``nvdash import FILE``: report what was added and which lines were skipped; 1 when nothing was read."""
    from nvdash.cli import UsageError  # noqa: PLC0415

    path = _history_path(args.history, environ)
    lines = _read_lines(args.file)
    name = "standard input" if args.file == "-" else Path(args.file).name
    try:
        added, present, parsed = import_log(path, lines, f"import:{name}")
    except ValueError as error:
        raise UsageError(f"{args.file}: {error}") from None
    except HistoryLocked as error:
        raise HistoryError(f"{error}: stop it first, or import into another file with --history and replay "
                           "that") from None
    for number, reason in parsed.errors[:SHOWN_ERRORS]:
        print(f"nvdash: {args.file}:{number}: skipped: {reason}", file=sys.stderr)
    if len(parsed.errors) > SHOWN_ERRORS:
        print(f"nvdash: ... and {len(parsed.errors) - SHOWN_ERRORS} more lines skipped", file=sys.stderr)
    if parsed.ignored_fields:
        print(f"nvdash: fields nvdash does not keep were ignored: {', '.join(parsed.ignored_fields)}",
              file=sys.stderr)
    if not parsed.rows:
        print(f"nvdash: error: {args.file}: no readable reading ({len(parsed.errors)} lines skipped)",
              file=sys.stderr)
        return 1
    first = min(row.time_s for row in parsed.rows)
    last = max(row.time_s for row in parsed.rows)
    gpus = len({(row.index, row.uuid, row.pci_bus_id) for row in parsed.rows})
    print(f"nvdash: imported {added} readings of {gpus} GPU{'s' if gpus != 1 else ''} "
          f"({_when(first)} to {_when(last)}) into {path}; {present} already there; "
          f"{len(parsed.errors)} lines skipped")
    return 0
