"""The history file on disk: private permissions whatever the umask, a lock file never opened through a symlink,
and paths holding ``#``, ``?`` or ``%`` opened as named."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.history.database import HistoryError, lock_for_writing, uri
from nvdash.history.query import SqliteHistory
from tests.unit.test_history_store import T0, count, simple, write, writer_for


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_the_history_its_lock_wal_and_shm_are_created_0600_in_a_0700_directory(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "nvdash"
    path = folder / "history.sqlite"
    writer = writer_for(path)
    writer.open()  # a writer holds the file open: SQLite keeps -wal and -shm while a connection is open
    try:
        writer.submit(simple(T0))
        writer.flush()
        names = sorted(p.name for p in folder.iterdir())
        assert names == ["history.sqlite", "history.sqlite-shm", "history.sqlite-wal", "history.sqlite.lock"]
        assert {name: mode(folder / name) for name in names} == dict.fromkeys(names, 0o600)
    finally:
        writer.stop()
    assert mode(folder) == 0o700
    assert mode(folder.parent) == 0o700  # created by nvdash too


@pytest.mark.usefixtures("umask_022")
def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o755)
    write(folder / "history.sqlite", [simple(T0)])
    assert mode(folder) == 0o755
    assert mode(folder / "history.sqlite") == 0o600


def test_a_permissive_umask_still_gives_private_files(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        write(tmp_path / "new" / "history.sqlite", [simple(T0)])
    finally:
        os.umask(previous)
    assert mode(tmp_path / "new") == 0o700
    assert mode(tmp_path / "new" / "history.sqlite") == 0o600
    assert mode(tmp_path / "new" / "history.sqlite.lock") == 0o600


def test_a_symlink_in_place_of_the_lock_file_is_refused_in_one_line(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    path = tmp_path / "history.sqlite"
    (tmp_path / "history.sqlite.lock").symlink_to(target)

    with pytest.raises(HistoryError) as raised:
        lock_for_writing(path)

    message = str(raised.value)
    assert "\n" not in message
    assert message == (f"{tmp_path / 'history.sqlite.lock'} is a symbolic link; nvdash does not open its lock file "
                       "through one (remove it)")
    assert target.read_text() == "precious\n"  # neither truncated nor written with a pid
    assert not path.exists()


@pytest.mark.parametrize("name", ["run#1.sqlite", "what?.sqlite", "100%25.sqlite", "a b%.sqlite"])
def test_a_path_with_uri_characters_is_the_file_written_and_read(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    write(path, [simple(T0), simple(T0 + 1)])

    assert sorted(p.name for p in tmp_path.iterdir()) == [name, f"{name}.lock"]
    assert count(path, "gpu_raw") == 2
    assert SqliteHistory(path).extent() == (T0, T0 + 1)


def test_a_relative_path_with_a_hash_is_the_file_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(Path("run#1.sqlite"), [simple(T0)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run#1.sqlite", "run#1.sqlite.lock"]


def test_uri_quotes_what_sqlite_would_read_as_uri_syntax() -> None:
    assert uri(Path("/data/run#1?%.sqlite"), "rwc") == "file:/data/run%231%3F%25.sqlite?mode=rwc"
