"""Crafted history files handed to ``nvdash replay``, ``import``, ``export`` and ``report``: each command, run as a
real process, ends with one line and a non-zero status (never a hang at 100 % CPU, never a traceback), and the
guarded connection's own bounds (a statement's time budget, the largest value) hold."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nvdash.history.accounting_table import SUMMED
from nvdash.history.database import APPLICATION_ID, HistoryError
from nvdash.history.query import SqliteHistory
from nvdash.history.replay import recent_snapshots
from tests.conftest import free_port, nvdash_env
from tests.unit.test_history_commands import T0, recorded

COMMAND_DEADLINE_S = 120.0
"""Long past any answer: a command still running then is hung (it is killed and the test fails)."""
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
"""A query that never ends."""
MIB = 1 << 20


def _edit(path: Path, *statements: str) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            connection.execute(statement)
    finally:
        connection.close()


def recursive_views(path: Path) -> None:
    """nvdash's tables replaced by views that never end, under the tables' names."""
    recorded(path)
    _edit(path,
          "DROP TABLE gpu_raw",
          f"CREATE VIEW gpu_raw AS SELECT x AS t, 0 AS gpu, NULL AS error FROM ({ENDLESS})",
          "DROP TABLE accounting",
          f"CREATE VIEW accounting AS SELECT x AS hour, 0 AS gpu, 'job' AS kind, 'j' AS job, 'u' AS user,"
          f" 'p' AS project, x AS start_s, x AS end_s, {', '.join(f'0 AS {name}' for name in SUMMED)},"
          f" 0 AS peak_memory_bytes FROM ({ENDLESS})")


def endless_trigger(path: Path) -> None:
    """A trigger that runs an endless query on every insert of a reading (an import's)."""
    recorded(path)
    _edit(path, f"CREATE TRIGGER spin AFTER INSERT ON gpu_raw BEGIN SELECT count(*) FROM ({ENDLESS}); END")


def huge_values(path: Path) -> None:
    """A 100 MB reading and a 20 MB job name."""
    recorded(path)
    _edit(path,
          f"UPDATE gpu_raw SET utilization_pct = zeroblob({100 * MIB}) WHERE t = {T0} AND gpu = 0",
          f"INSERT INTO accounting VALUES ({T0 - T0 % 3600}, 0, 'job', hex(zeroblob({10 * MIB})), 'u', 'p', {T0},"
          f" {T0 + 1}, {', '.join('1' for _ in SUMMED)}, 1)")


def ours_in_name_only(path: Path) -> None:
    """nvdash's application id and version on tables that are not nvdash's."""
    _edit(path, "CREATE TABLE gpu_raw (x)", "CREATE TABLE notes (text)", f"PRAGMA application_id = {APPLICATION_ID}",
          "PRAGMA user_version = 1")


def accounting_without_energy(path: Path) -> None:
    """An accounting table lacking a column every history's table has (unlike the throttle columns, which an older
    file may lack)."""
    recorded(path)
    _edit(path, "ALTER TABLE accounting DROP COLUMN energy_j")


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m nvdash ARGS`` to its end; a command still running at the deadline is a hang."""
    try:
        return subprocess.run([sys.executable, "-m", "nvdash", *args], env=nvdash_env(), capture_output=True,
                              text=True, timeout=COMMAND_DEADLINE_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"nvdash {' '.join(args[:2])} still running after {COMMAND_DEADLINE_S:g} s (hung)")


def commands(history: Path, tmp_path: Path) -> dict[str, list[str]]:
    log = tmp_path / "log.csv"
    log.write_text("timestamp, index, utilization.gpu [%]\n2024/01/15 10:00:00.000, 0, 10 %\n", encoding="utf-8")
    return {
        "export": ["export", "--history", str(history), "-o", str(tmp_path / "out.csv")],
        "import": ["import", str(log), "--history", str(history)],
        "report": ["report", "--history", str(history), "--from", "1"],
        "replay": ["replay", str(history), "--port", str(free_port())],
    }


def assert_one_line_error(done: subprocess.CompletedProcess[str], name: str, *expected: str) -> None:
    assert done.returncode != 0, (name, done.stdout[-500:], done.stderr[-2000:])
    output = (done.stderr + done.stdout).strip()
    assert "Traceback" not in output, (name, output[-2000:])
    lines = output.splitlines()
    assert len(lines) == 1, (name, output[-2000:])
    assert lines[0].startswith("nvdash: error: "), (name, lines[0][:300])
    assert len(lines[0]) < 400, (name, lines[0][:400])
    assert any(text in lines[0] for text in expected), (name, lines[0])


CRAFTED: dict[str, tuple[Callable[[Path], None], tuple[str, ...], tuple[str, ...]]] = {
    # name: (builder, commands refused, what the message says)
    "recursive views": (recursive_views, ("export", "import", "report", "replay"), ("holds a view",)),
    "a trigger": (endless_trigger, ("export", "import", "report", "replay"), ("holds a trigger",)),
    "huge values": (huge_values, ("export", "report", "replay"), ("over 16 MiB", "string or blob too big")),
    "ours in name only": (ours_in_name_only, ("export", "import", "report", "replay"), ("is missing",)),
    "accounting lacks a required column": (accounting_without_energy, ("export", "import", "report", "replay"),
                                           ("table 'accounting' lacks column 'energy_j'",)),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_file_is_refused_in_one_line_by_every_command(case: str, tmp_path: Path) -> None:
    build, refused, expected = CRAFTED[case]
    history = tmp_path / "crafted.sqlite"
    build(history)
    pristine = tmp_path / "pristine.sqlite"
    shutil.copyfile(history, pristine)
    for name, args in commands(history, tmp_path).items():
        done = run(args)
        if name in refused:
            assert_one_line_error(done, name, *expected)
        else:
            assert done.returncode == 0, (name, done.stderr[-2000:])
        if name == "import" and name in refused:
            assert history.read_bytes() == pristine.read_bytes(), "a refused import changed the file"


def test_the_huge_values_file_still_imports(tmp_path: Path) -> None:
    """An import does not read the readings already there: a huge one does not stop it."""
    history = tmp_path / "crafted.sqlite"
    huge_values(history)
    done = run(commands(history, tmp_path)["import"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "imported 1 readings of 1 GPU" in done.stdout


def test_a_statement_past_its_budget_is_stopped(tmp_path: Path) -> None:
    history_path = tmp_path / "h.sqlite"
    recorded(history_path)
    history = SqliteHistory(history_path, query_budget_s=0.2)
    # Through the history's own reads: a one-line HistoryError naming the budget.
    with pytest.raises(HistoryError, match=r"took longer than 0\.2 s and was stopped"), history.reading() as reader:
        reader.execute(f"SELECT count(*) FROM ({ENDLESS})").fetchone()
    # Any statement on the connection has the budget, whoever runs it (replay's readers take a connection).
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        history.connection().execute(f"SELECT count(*) FROM ({ENDLESS})").fetchone()
    # The connection is still good afterwards, and a normal query is not cut short.
    assert len(recent_snapshots(history.connection(), 5)) == 5
    history.close()


def test_an_endless_line_in_a_log_is_skipped_without_being_held(tmp_path: Path) -> None:
    """A 50 MB line (no newline for 50 MB) is read in 64 KiB pieces and skipped as one bad line."""
    log = tmp_path / "log.csv"
    with log.open("w", encoding="utf-8") as file:
        file.write("timestamp, index, utilization.gpu [%]\n2024/01/15 10:00:00.000, 0, 10 %\n")
        piece = "9," * (1 << 20)
        for _ in range(25):
            file.write(piece)
        file.write("\n2024/01/15 10:00:01.000, 0, 20 %\n")
    done = run(["import", str(log), "--history", str(tmp_path / "h.sqlite")])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip() == f"nvdash: {log}:3: skipped: line longer than 64 KiB"
    assert "imported 2 readings of 1 GPU" in done.stdout
