"""The history file of a real server: its clock jumps a week ahead and back while it runs (libfaketime, the wall
clock only, as an NTP step moves it) and nothing written before a jump is deleted; its files are private under a
umask of 022; a path with ``#`` and ``?`` is the file written."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from nvdash.history.database import uri
from tests.conftest import nvdash_server, wait_for
from tests.unit.test_history_file_safety import mode, umask_022  # noqa: F401 - umask_022 is a fixture

WEEK_AND_A_DAY_S = 8 * 86_400.0
PRUNE_WAIT_S = 60.0
"""Room for a loaded machine to reach the next prune (NVDASH_PRUNE_EVERY makes it every 2 s)."""


def libfaketime() -> str:
    """The preload library of Debian's ``faketime`` package (scripts/test.sh installs it)."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")) + sorted(
        Path("/usr/lib/faketime").glob("libfaketime.so.1"))
    assert found, "libfaketime is not installed: apt-get install faketime (scripts/test.sh does)"
    return str(found[0])


def stamps(path: Path, table: str) -> set[float]:
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        return {row[0] for row in connection.execute(f"SELECT t FROM {table}")}
    finally:
        connection.close()


def history(server: Any) -> dict[str, Any]:
    result: dict[str, Any] = server.health()["history"]
    return result


def prune_after_now(server: Any) -> dict[str, Any]:
    """Wait for a prune that starts after this call (the writer prunes after writing, here every 2 s)."""
    before = history(server)["prunes"]
    return wait_for(lambda: history(server), lambda seen: seen["prunes"] > before, timeout_s=PRUNE_WAIT_S)


def test_a_running_servers_clock_jumping_a_week_ahead_and_back_deletes_no_history(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    clock = tmp_path / "faketime"
    clock.write_text("+0\n")
    env = {"LD_PRELOAD": libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(clock), "FAKETIME_NO_CACHE": "1",
           # An NTP step moves the wall clock, never the monotonic one.
           "FAKETIME_DONT_FAKE_MONOTONIC": "1",
           "NVDASH_PRUNE_EVERY": "2"}
    # No --simulate: the simulated NVML sleeps through time.sleep, which libfaketime breaks when it leaves the
    # monotonic clock alone; the machine's own readings are what this is about.
    with nvdash_server(["--interval", "0.25", "--history", str(path)], env=env) as server:
        wait_for(lambda: history(server), lambda seen: seen["snapshots"] >= 8 and seen["prunes"] >= 1,
                 timeout_s=60)
        before_raw, before_10s = stamps(path, "host_raw"), stamps(path, "host_10s")
        written_before = max(before_raw)

        clock.write_text("+8d\n")
        ahead = wait_for(lambda: history(server), lambda seen: seen["ahead_readings"] > 0, timeout_s=60)
        assert ahead["wall_clock_offset_s"] == pytest.approx(WEEK_AND_A_DAY_S, abs=60)
        prune_after_now(server)

        after_raw = stamps(path, "host_raw")
        assert before_raw <= after_raw  # every reading from before the jump is still in the file
        assert before_10s <= stamps(path, "host_10s")
        jumped = {t for t in after_raw if t > written_before + WEEK_AND_A_DAY_S - 3600}
        assert jumped  # and the readings after it are written, a week and a day ahead

        clock.write_text("+0\n")  # back: an NTP step of eight days the other way
        wait_for(lambda: max(t for t in stamps(path, "host_raw") if t < written_before + 3600),
                 lambda newest: newest > written_before, timeout_s=60)
        final = prune_after_now(server)

        end_raw = stamps(path, "host_raw")
        assert before_raw | jumped <= end_raw
        assert before_10s <= stamps(path, "host_10s")
        assert final["errors"] == 0
        assert abs(final["wall_clock_offset_s"]) < 60
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        connection.close()


@pytest.mark.usefixtures("umask_022")
def test_a_servers_history_files_are_private_and_a_path_with_uri_characters_is_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "made by nvdash" / "runs"
    path = folder / "run#1?.sqlite"
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25", "--history", str(path)]) as server:
        wait_for(lambda: history(server), lambda seen: seen["batches"] >= 2, timeout_s=60)
        # A batch is written on a timer: on a loaded machine it may hold fewer sweeps, so wait for the rows too.
        wait_for(lambda: len(stamps(path, "gpu_raw")), lambda rows: rows >= 8, timeout_s=60)
        names = sorted(p.name for p in folder.iterdir())
        assert names == ["run#1?.sqlite", "run#1?.sqlite-shm", "run#1?.sqlite-wal", "run#1?.sqlite.lock"]
        assert {name: mode(folder / name) for name in names} == dict.fromkeys(names, 0o600)
        assert (mode(folder), mode(folder.parent)) == (0o700, 0o700)
        assert len(stamps(path, "gpu_raw")) >= 8


@pytest.mark.usefixtures("umask_022")
def test_the_default_history_directory_is_created_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25"], env={"XDG_DATA_HOME": str(data)}) as server:
        wait_for(lambda: history(server), lambda seen: seen["batches"] >= 2, timeout_s=60)
        assert mode(data) == 0o755  # the user's directory keeps its mode
        assert mode(data / "nvdash") == 0o700
        assert mode(data / "nvdash" / "history.sqlite") == 0o600
        assert mode(data / "nvdash" / "history.sqlite.lock") == 0o600
