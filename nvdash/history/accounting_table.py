"""The history's accounting table: each owner's hourly tallies per GPU, kept far longer than the readings.

Rows are keyed by hour, GPU and owner; storing a tally adds it to the row already there (a server restarted within
the hour adds to what the previous one stored). Peak memory takes the larger, start and end the outer times.

Columns a later nvdash added (:data:`ADDED`: the seconds lost to throttling) are in :data:`TABLE` but may be
missing from an older file: the history's schema upgrade adds them when a writer opens it (:data:`ADDED_COLUMNS`:
its rows kept, 0 in them, which the tallies' ``*_known_s`` columns say means unknown: nothing was measured then),
and a read-only connection reads them as 0 (see :mod:`nvdash.history.database`).

The history knows the accounting's tallies by their shape only (:class:`StoredOwner`, :class:`StoredTally`): the
accounting package counts them and reads them back (:mod:`nvdash.accounting.stored`), and neither package's
storage imports the other's types.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Mapping
from typing import Any, Protocol

HOUR_S = 3600.0
"""The table's rows are hours (as the accounting's ledger counts them)."""

ADDED = ("power_cap_s", "power_cap_known_s", "thermal_s", "thermal_known_s")
"""Tally fields stored in columns added to the table after its first version (see the module's note)."""
ADDED_COLUMNS = tuple((name, "REAL NOT NULL DEFAULT 0") for name in ADDED)
"""Each :data:`ADDED` column and its type, as the schema upgrade adds it to an older file."""
SUMMED = ("allocated_s", "busy_s", "activity_known_s", "utilization_s", "sm_active_s", "sm_known_s", "energy_j",
          "energy_known_s", "memory_byte_s", "memory_known_s", *ADDED)
"""The tally's fields that add up, one column each (the :data:`ADDED` ones last): every field of the accounting's
``Tally`` but its start, end and peak memory."""
KEY_COLUMNS = ("hour", "gpu", "kind", "job", "user", "project")
TABLE = (
    "CREATE TABLE IF NOT EXISTS accounting (hour REAL NOT NULL, gpu INTEGER NOT NULL, kind TEXT NOT NULL,"
    " job TEXT NOT NULL, user TEXT NOT NULL, project TEXT NOT NULL, start_s REAL NOT NULL, end_s REAL NOT NULL, "
    + ", ".join(f"{name} REAL NOT NULL" for name in SUMMED)
    + ", peak_memory_bytes INTEGER, PRIMARY KEY (hour, gpu, kind, job, user, project)) WITHOUT ROWID"
)
"""The table (created in every history; ``IF NOT EXISTS`` adds it to a file written before it existed)."""

_COLUMNS = (*KEY_COLUMNS, "start_s", "end_s", *SUMMED, "peak_memory_bytes")
UPSERT = (
    f"INSERT INTO accounting ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
    " ON CONFLICT (hour, gpu, kind, job, user, project) DO UPDATE SET"
    " start_s = min(start_s, excluded.start_s), end_s = max(end_s, excluded.end_s), "
    + ", ".join(f"{name} = {name} + excluded.{name}" for name in SUMMED)
    + ", peak_memory_bytes = CASE WHEN peak_memory_bytes IS NULL THEN excluded.peak_memory_bytes"
    " WHEN excluded.peak_memory_bytes IS NULL THEN peak_memory_bytes"
    " ELSE max(peak_memory_bytes, excluded.peak_memory_bytes) END"
)
_TOTALS = (
    "SELECT kind, job, user, project, gpu, min(start_s), max(end_s), "
    + ", ".join(f"sum({name})" for name in SUMMED)
    + ", max(peak_memory_bytes) FROM accounting WHERE hour >= ? AND hour < ? GROUP BY kind, job, user, project, gpu"
)


class StoredOwner(Protocol):
    """Who a row's tally belongs to (the accounting's ``Owner``)."""

    @property
    def kind(self) -> str: ...

    @property
    def job(self) -> str: ...

    @property
    def user(self) -> str: ...

    @property
    def project(self) -> str: ...


class StoredTally(Protocol):
    """One owner's use of one GPU in one hour (the accounting's ``Tally``; the :data:`SUMMED` fields are read by
    name)."""

    @property
    def start_s(self) -> float: ...

    @property
    def end_s(self) -> float: ...

    @property
    def peak_memory_bytes(self) -> int | None: ...


def hour_of(time_s: float) -> float:
    """The start of the (UTC) hour holding ``time_s``."""
    return math.floor(time_s / HOUR_S) * HOUR_S


def store(connection: sqlite3.Connection, tallies: Mapping[Any, StoredTally]) -> None:
    """Add ``tallies``, keyed by ``(owner, GPU index, hour)``, to the table (inside the caller's transaction)."""
    rows = []
    for key, tally in tallies.items():
        owner, index, hour = _key(key)
        rows.append((hour, index, owner.kind, owner.job, owner.user, owner.project, tally.start_s, tally.end_s,
                     *(getattr(tally, name) for name in SUMMED), tally.peak_memory_bytes))
    connection.executemany(UPSERT, rows)


def _key(key: tuple[StoredOwner, int, float]) -> tuple[StoredOwner, int, float]:
    return key


def prune(connection: sqlite3.Connection, before_s: float) -> int:
    """Delete the hours that ended before ``before_s``; returns the rows deleted."""
    return connection.execute("DELETE FROM accounting WHERE hour < ?", (hour_of(before_s),)).rowcount


def total_rows(connection: sqlite3.Connection, start_s: float, end_s: float) -> list[tuple[Any, ...]]:
    """Per (owner, GPU), the hours overlapping ``[start_s, end_s)`` added up: rows of ``kind, job, user, project,
    gpu, start_s, end_s``, the :data:`SUMMED` columns, and the peak memory."""
    return connection.execute(_TOTALS, (hour_of(start_s), end_s)).fetchall()


def has_table(connection: sqlite3.Connection) -> bool:
    """Whether the file has the table (a history written before it did not)."""
    count: int = connection.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'accounting'").fetchone()[0]
    return count > 0
