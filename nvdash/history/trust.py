"""Reading a history file that may be hostile: its schema checked, its values bounded, its queries timed.

A history file is handed to ``nvdash replay``, ``import``, ``export`` and ``report`` by whoever made it. SQLite
runs whatever the file's schema says: a view named like one of nvdash's tables can recurse forever, a trigger
can run on each insert, a row can hold a gigabyte. So every connection nvdash reads a file through is
*guarded*: the file's own schema may hold only nvdash's tables (no views, no triggers, each expected table a
real table with its key columns), no value may exceed :data:`MAX_VALUE_BYTES`, schema functions are untrusted
(``PRAGMA trusted_schema=OFF``), and a :class:`Deadline` aborts a statement that runs past its budget.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from nvdash.history.database import APPLICATION_ID, HistoryError, added_columns, schema, uri

MAX_VALUE_BYTES = 16 << 20
"""The longest string or blob a read may return (an inventory or a command line is a few KiB)."""
QUERY_BUDGET_S = 60.0
"""How long one query of a command or a page may run before it is aborted as a hang."""
PROGRESS_EVERY = 20_000
"""SQLite virtual-machine steps between two looks at the deadline (well under a millisecond)."""
SQLITE_LIMIT_LENGTH = 0
"""``sqlite3_limit``'s id of the longest string or blob (``sqlite3.SQLITE_LIMIT_LENGTH`` from Python 3.11)."""
OPTIONAL_TABLES = frozenset({"accounting", "pod_shares", "notebook_memory"})
"""Tables a file written by an older nvdash may lack (a read connection adds them empty)."""


class Deadline:
    """When the statement running on one connection must be done.

    Each statement gets ``statement_s`` from its first step (SQLite's trace callback says when one starts), so
    every read is bounded without its caller doing anything. A caller that reads a cursor bit by bit (an
    export) arms an explicit :meth:`budget` around each bit instead: the time between bits is not counted.
    """

    def __init__(self, statement_s: float = QUERY_BUDGET_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.statement_s = statement_s
        self._statement_until = math.inf
        self._until = math.inf
        self.budget_s = math.inf

    def started(self, sql: str) -> None:
        """SQLite's trace callback: a statement begins (``-- TRIGGER`` lines are parts of one, not new ones)."""
        if not sql.startswith("--"):
            self._statement_until = self._clock() + self.statement_s

    def expired(self) -> bool:
        """Whether the budget is spent (SQLite's progress handler: true aborts the statement)."""
        until = self._until if self._until < math.inf else self._statement_until
        return self._clock() > until

    def spent_s(self) -> float:
        """The budget that was exceeded, for the message."""
        return self.budget_s if self._until < math.inf else self.statement_s

    @contextmanager
    def budget(self, seconds: float) -> Iterator[None]:
        """Statements run inside must end within ``seconds`` (a nested budget never extends an outer one)."""
        before, before_s = self._until, self.budget_s
        until = self._clock() + seconds
        if until < self._until:
            self._until, self.budget_s = until, seconds
        try:
            yield
        finally:
            self._until, self.budget_s = before, before_s


def _expected_tables() -> dict[str, frozenset[str]]:
    """Per table of nvdash's schema, the columns every file has (built from the schema itself, less the columns
    the schema's upgrade adds to an older file: a read reads those as their values for the past)."""
    reference = sqlite3.connect(":memory:")
    try:
        for statement in schema():
            reference.execute(statement)
        names = [row[0] for row in reference.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        optional = {table: {column.name for column in columns} for table, columns in added_columns().items()}
        return {name: frozenset(row[1] for row in reference.execute(f"PRAGMA table_info({name})"))
                - optional.get(name, set()) for name in names}
    finally:
        reference.close()


def check_schema(connection: sqlite3.Connection, path: Path) -> None:
    """Raise a one-line :class:`HistoryError` unless the file's schema holds nvdash's tables and nothing that runs
    code: no view, no trigger, every expected table a table with its key columns."""
    try:
        entries = connection.execute("SELECT type, name FROM main.sqlite_master").fetchall()
    except sqlite3.DatabaseError as error:
        raise HistoryError(f"{path} is not a usable nvdash history file ({error})") from None
    for kind, name in entries:
        if kind in ("view", "trigger"):
            raise HistoryError(f"{path} is not an nvdash history file: it holds a {kind} ({name!r}), "
                               "which nvdash never writes; refused")
    kinds = {name: kind for kind, name in entries}
    for table, columns in _expected_tables().items():
        if table not in kinds and table in OPTIONAL_TABLES:
            continue
        if kinds.get(table) != "table":
            raise HistoryError(f"{path} is not an nvdash history file: table {table!r} is missing; refused")
        present = {row[1] for row in connection.execute(f"PRAGMA main.table_info({table})")}
        lacking = sorted(columns - present)
        if lacking:
            raise HistoryError(f"{path} is not an nvdash history file: table {table!r} lacks column "
                               f"{lacking[0]!r}; refused")


def guard(connection: sqlite3.Connection, path: Path, deadline: Deadline) -> None:
    """Check the schema, then bound what the connection may do: value sizes, schema functions, statement time."""
    connection.execute("PRAGMA trusted_schema = OFF")
    setlimit = getattr(connection, "setlimit", None)  # Python 3.11 and later
    if setlimit is not None:
        setlimit(SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    connection.set_progress_handler(deadline.expired, PROGRESS_EVERY)
    connection.set_trace_callback(deadline.started)
    check_schema(connection, path)


def readable_error(path: Path | str, error: Exception, deadline: Deadline | None = None) -> HistoryError:
    """A one-line error for a failed read: a spent budget, an oversized value, a damaged or crafted file."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if isinstance(error, sqlite3.OperationalError) and "interrupted" in text:
        budget = f" than {deadline.spent_s():g} s" if deadline is not None else " than its time budget"
        return HistoryError(f"reading history file {path} took longer{budget} and was stopped (a damaged or "
                            "crafted file?)")
    if "too big" in text:
        return HistoryError(f"history file {path} holds a value over {MAX_VALUE_BYTES >> 20} MiB; refused")
    return HistoryError(f"reading history file {path} failed: {text[:200]}")


def file_of(connection: sqlite3.Connection) -> str:
    """The file a connection reads (for messages), ``the history file`` when SQLite cannot say."""
    try:
        for _, name, file in connection.execute("PRAGMA database_list"):
            if name == "main" and file:
                return str(file)
    except sqlite3.Error:
        pass
    return "the history file"


def check_file(path: Path) -> None:
    """Check an existing file's schema before a writer opens it (``nvdash import``): a trigger would otherwise
    run on the first insert. A missing or empty file passes (the writer creates it)."""
    path = path.expanduser()
    try:
        if path.stat().st_size == 0:
            return
    except OSError:
        return
    try:
        connection = sqlite3.connect(uri(path), uri=True, isolation_level=None)
    except sqlite3.Error:
        return  # the writer's own open reports why the file cannot be used
    try:
        try:
            app_id = connection.execute("PRAGMA application_id").fetchone()[0]
        except sqlite3.DatabaseError:
            return  # not SQLite: the writer's open refuses it with its own message
        if app_id == APPLICATION_ID:  # another program's database: the writer's open refuses it
            deadline = Deadline()
            guard(connection, path, deadline)
    finally:
        connection.close()
