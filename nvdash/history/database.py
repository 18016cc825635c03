"""The history file: creating, checking and locking an SQLite database in WAL mode.

One process writes a file (an exclusive ``flock`` on ``<file>.lock``, released by the kernel even after
``kill -9``); any number read it. A file that is not SQLite, or SQLite written by something else, is refused
with a one-line :class:`HistoryError` and never modified.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

from nvdash.history import accounting_table, notebook_table, share_table
from nvdash.history.catalog import Kind, Scope, gpu_raw_columns, host_raw_columns, metrics_of
from nvdash.history.tiers import TIERS

APPLICATION_ID = 0x6E766461
"""``PRAGMA application_id`` of an nvdash history file ("nvda")."""
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"


PROCESS_1M = ("n INTEGER NOT NULL, started_s REAL, mig_uuid TEXT, kinds TEXT, gpu_memory_bytes_max REAL,"
              " sm_pct_mean REAL, memory_pct_mean REAL, user TEXT, command TEXT, container_id TEXT,"
              " pod_namespace TEXT, pod_name TEXT, container_name TEXT, slurm_job TEXT")
"""Per minute and process: readings seen, peak memory, mean utilization, and who the process was."""


class HistoryError(Exception):
    """The history file cannot be used; the message is one line for the user."""


class HistoryLocked(HistoryError):
    """Another process writes this history file."""


def default_path(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """``$XDG_DATA_HOME/nvdash/history.sqlite`` (``~/.local/share`` when unset), the per-user data location."""
    base = environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "share"
    return root / "nvdash" / "history.sqlite"


def _gauge_columns(scope: Scope) -> list[str]:
    columns: list[str] = []
    for metric in metrics_of(scope):
        kind_type = "INTEGER" if metric.kind is Kind.BITS else "REAL"
        columns += [f"{column} {kind_type}" for column in metric.tier_columns()]
    return columns


def schema() -> list[str]:
    """The statements that create an empty history (tables only; pragmas are set by :func:`open_database`)."""
    gpu_raw = ", ".join(f"{name} REAL" for name in gpu_raw_columns())
    host_raw = ", ".join(f"{name} REAL" for name in host_raw_columns())
    statements = [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE sessions (id INTEGER PRIMARY KEY, started_s REAL NOT NULL, source TEXT NOT NULL,"
        " interval_s REAL, inventory TEXT NOT NULL)",
        f"CREATE TABLE gpu_raw (t REAL NOT NULL, gpu INTEGER NOT NULL, {gpu_raw}, error TEXT,"
        " PRIMARY KEY (t, gpu)) WITHOUT ROWID",
        f"CREATE TABLE host_raw (t REAL NOT NULL PRIMARY KEY, {host_raw}) WITHOUT ROWID",
        "CREATE TABLE nvlink_state (t REAL NOT NULL, gpu INTEGER NOT NULL, links TEXT NOT NULL,"
        " PRIMARY KEY (t, gpu)) WITHOUT ROWID",
        "CREATE TABLE events (id INTEGER PRIMARY KEY, t REAL NOT NULL, gpu INTEGER, kind TEXT NOT NULL,"
        " severity TEXT NOT NULL, code INTEGER, counter TEXT, message TEXT NOT NULL)",
        "CREATE INDEX events_t ON events (t)",
        "CREATE TABLE processes (t REAL NOT NULL, gpu INTEGER NOT NULL, pid INTEGER NOT NULL,"
        " started_s REAL, mig_uuid TEXT, kinds TEXT, gpu_memory_bytes REAL, sm_pct REAL, memory_pct REAL,"
        " user TEXT, command TEXT, container_id TEXT, pod_namespace TEXT, pod_name TEXT, container_name TEXT,"
        " slurm_job TEXT, PRIMARY KEY (t, gpu, pid)) WITHOUT ROWID",
        f"CREATE TABLE processes_1m (t REAL NOT NULL, gpu INTEGER NOT NULL, pid INTEGER NOT NULL, {PROCESS_1M},"
        " PRIMARY KEY (t, gpu, pid)) WITHOUT ROWID",
        accounting_table.TABLE,
        share_table.TABLE,
        notebook_table.TABLE,
    ]
    for tier in (tier.name for tier in TIERS):
        gpu_tier = ", ".join(_gauge_columns(Scope.GPU))
        host_tier = ", ".join(_gauge_columns(Scope.HOST))
        statements += [
            f"CREATE TABLE gpu_{tier} (t REAL NOT NULL, gpu INTEGER NOT NULL, n INTEGER NOT NULL, {gpu_tier},"
            " PRIMARY KEY (t, gpu)) WITHOUT ROWID",
            f"CREATE TABLE host_{tier} (t REAL NOT NULL PRIMARY KEY, n INTEGER NOT NULL, {host_tier})"
            " WITHOUT ROWID",
        ]
    return statements


PRIVATE_FILE_MODE = 0o600
"""The history file, its lock, -wal and -shm: they hold command lines and user names."""
PRIVATE_DIRECTORY_MODE = 0o700


def make_private_directory(directory: Path) -> None:
    """Create ``directory`` and any missing parents, each ``0700`` whatever the umask; one that exists is left
    as it is (a user's own directory keeps the permissions its owner gave it)."""
    missing: list[Path] = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIRECTORY_MODE)
        except FileExistsError:
            continue
        except OSError as error:
            raise HistoryError(f"cannot create the directory {folder}: {error.strerror}") from None
        os.chmod(folder, PRIVATE_DIRECTORY_MODE)


def _create_private(path: Path) -> None:
    """Create the history file empty with mode ``0600`` whatever the umask (SQLite gives its -wal and -shm the
    main file's mode); an existing file is left as it is."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    except OSError as error:
        raise HistoryError(f"cannot create history file {path}: {error.strerror}") from None
    try:
        os.fchmod(descriptor, PRIVATE_FILE_MODE)
    finally:
        os.close(descriptor)


def _check_header(path: Path) -> None:
    """Refuse a non-empty file that is not SQLite before SQLite touches it."""
    try:
        with path.open("rb") as file:
            head = file.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as error:
        raise HistoryError(f"cannot read history file {path}: {error.strerror}") from None
    if head and head != SQLITE_MAGIC:
        raise HistoryError(f"{path} is not an nvdash history file (not an SQLite database); it was left untouched")


def uri(path: Path | str, mode: str = "ro") -> str:
    """SQLite's ``file:`` URI of ``path`` opened in ``mode`` (``ro``, ``rw``, ``rwc``).

    The path is percent-quoted: unquoted, a ``#`` or ``?`` in it would end the path there (``run#1.sqlite``
    opened ``run``) and a ``%`` would be decoded.
    """
    return f"file:{urllib.parse.quote(str(path))}?mode={mode}"


def _connect(path: Path, read_only: bool) -> sqlite3.Connection:
    try:
        connection = sqlite3.connect(uri(path, "ro" if read_only else "rwc"), uri=True, timeout=10.0,
                                     check_same_thread=False, isolation_level=None)
    except sqlite3.Error as error:
        raise HistoryError(f"cannot open history file {path}: {error}") from None
    return connection


def _validate(connection: sqlite3.Connection, path: Path) -> bool:
    """True when the file holds an nvdash history, False when it is empty; raises for anything else."""
    try:
        app_id = connection.execute("PRAGMA application_id").fetchone()[0]
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as error:
        raise HistoryError(f"{path} is not a usable nvdash history file ({error}); it was left untouched") from None
    if app_id == 0 and tables == 0:
        return False
    if app_id != APPLICATION_ID:
        raise HistoryError(f"{path} is an SQLite database of another program, not an nvdash history; "
                           "it was left untouched")
    if version > SCHEMA_VERSION:
        raise HistoryError(f"{path} was written by a newer nvdash (history format {version}); upgrade nvdash")
    return True


def _name_and_type(column: str) -> tuple[str, str]:
    name, kind = column.split(" ", 1)
    return name, kind


class Added(NamedTuple):
    """A column added to a table after the table's first version: what a writer's upgrade adds to an older file
    and what a read-only connection shows in its place."""

    name: str
    definition: str
    """Its type and constraints, as ``ALTER TABLE ... ADD COLUMN`` gives them."""
    past: str
    """The SQL value a read-only connection reads for it in an older file."""


def added_columns() -> dict[str, list[Added]]:
    """Per table, the columns an older file may lack (the one list of the history's schema upgrades): every
    reading column (a record gains fields; NULL for the past: not read then), and accounting's throttle seconds
    (0 for the past, which their ``*_known_s`` columns, 0 too, say is unknown)."""
    readings = {"gpu_raw": [(name, "REAL") for name in gpu_raw_columns()],
                "host_raw": [(name, "REAL") for name in host_raw_columns()]}
    for tier in (tier.name for tier in TIERS):
        for scope in (Scope.GPU, Scope.HOST):
            readings[f"{scope.value}_{tier}"] = [_name_and_type(column) for column in _gauge_columns(scope)]
    tables = {table: [Added(name, kind, "NULL") for name, kind in columns] for table, columns in readings.items()}
    tables["accounting"] = [Added(name, kind, "0.0") for name, kind in accounting_table.ADDED_COLUMNS]
    return tables


def _missing_columns(connection: sqlite3.Connection) -> dict[str, list[Added]]:
    """The columns a history written by an older nvdash lacks, by table (a table it lacks altogether is not
    listed: it is created whole)."""
    missing: dict[str, list[Added]] = {}
    for table, columns in added_columns().items():
        present = {row[1] for row in connection.execute(f"PRAGMA main.table_info({table})")}
        if present:
            lacking = [column for column in columns if column.name not in present]
            if lacking:
                missing[table] = lacking
    return missing


def _upgrade(connection: sqlite3.Connection) -> None:
    """Add the columns newer than the file (see :func:`added_columns`), and the accounting table to a file written
    before it existed."""
    missing = _missing_columns(connection)
    if (not missing and accounting_table.has_table(connection) and share_table.has_table(connection)
            and notebook_table.has_table(connection)):
        return
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.execute(accounting_table.TABLE)
        connection.execute(share_table.TABLE)
        connection.execute(notebook_table.TABLE)
        for table, columns in missing.items():
            for column in columns:
                connection.execute(f"ALTER TABLE {table} ADD COLUMN {column.name} {column.definition}")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _shadow_missing(connection: sqlite3.Connection) -> None:
    """For a read-only connection to an older file: temporary views, named like its tables, that add the newer
    columns with their values for the past, so that every query reads the file as if it had them (SQLite looks in
    ``temp`` first); an empty temporary accounting table when the file has none."""
    for table, columns in _missing_columns(connection).items():
        extra = ", ".join(f"{column.past} AS {column.name}" for column in columns)
        connection.execute(f"CREATE TEMP VIEW {table} AS SELECT *, {extra} FROM main.{table}")
    if not accounting_table.has_table(connection):
        connection.execute(accounting_table.TABLE.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
    if not share_table.has_table(connection):
        connection.execute(share_table.TABLE.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
    if not notebook_table.has_table(connection):
        connection.execute(notebook_table.TABLE.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))


def _create(connection: sqlite3.Connection) -> None:
    connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
    connection.execute("BEGIN IMMEDIATE")
    for statement in schema():
        connection.execute(statement)
    connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    connection.execute("COMMIT")


@dataclass
class WriteLock:
    """An exclusive lock on a history file, held while the file handle is open."""

    path: Path
    handle: IO[str]

    def release(self) -> None:
        """Give the lock up (closing the handle releases it)."""
        if not self.handle.closed:
            self.handle.close()


def lock_for_writing(path: Path) -> WriteLock:
    """Take the history's write lock, or raise :class:`HistoryLocked` naming the process that holds it."""
    lock_path = path.with_name(path.name + ".lock")
    make_private_directory(path.parent)
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise HistoryError(f"{lock_path} is a symbolic link; nvdash does not open its lock file through one "
                               "(remove it)") from None
        raise HistoryError(f"cannot create {lock_path}: {error.strerror}") from None
    handle = os.fdopen(descriptor, "r+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise HistoryLocked(f"history file {path} is being written by another nvdash{who}") from None
        raise HistoryError(f"cannot lock {lock_path}: {error.strerror}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return WriteLock(path, handle)


def open_database(path: Path, read_only: bool = False) -> sqlite3.Connection:
    """A connection to the history at ``path``: created when absent (unless ``read_only``), checked otherwise.

    Writers get WAL mode with ``synchronous=NORMAL``: a killed process loses no committed transaction and never
    leaves a corrupt file. The caller holds :func:`lock_for_writing` before opening for writing.
    """
    path = path.expanduser()
    if read_only and not path.exists():
        raise HistoryError(f"history file {path} does not exist")
    _check_header(path)
    if not read_only:
        make_private_directory(path.parent)
        _create_private(path)
    connection = _connect(path, read_only)
    try:
        exists = _validate(connection, path)
        if not exists:
            if read_only:
                raise HistoryError(f"{path} holds no nvdash history")
            _create(connection)
        if not read_only:
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA synchronous = NORMAL")
            if exists:
                _upgrade(connection)
        else:
            _shadow_missing(connection)
    except sqlite3.DatabaseError as error:
        connection.close()
        raise HistoryError(f"{path} is not a usable nvdash history file ({error}); it was left untouched") from None
    except HistoryError:
        connection.close()
        raise
    return connection


@contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on error."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
