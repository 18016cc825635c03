"""The history's notebook memory table: the writer stores each process reading's kernels per minute and GPU (peak
and mean memory, mean SM %), only kernels holding memory, once per reading; a prune keeps the retention."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nvdash.history.notebook_table import NotebookMinute, notebook_minutes
from nvdash.history.query import SqliteHistory
from nvdash.sampling.notebook_records import NotebookView
from nvdash.sampling.records import Snapshot
from tests.notebook_views import GPU0, GPU1, MIB, use, view
from tests.unit.test_history_store import HOUR, T0, rows, simple, write

A, B, IDLE = "aaaa1111-0000", "bbbb2222-0000", "cccc3333-0000"
TRAIN = "train/a.ipynb"


def snapshot(time_s: float, notebooks: NotebookView | None) -> Snapshot:
    base = simple(time_s, gpus=2)
    return Snapshot(base.time_s, gpus=base.gpus, host=base.host, notebooks=notebooks)


def readings() -> list[Snapshot]:
    """Two readings a minute over three minutes: kernel A (notebook TRAIN) on GPU 0; kernel B (no session) on GPU 0
    and 1 from the second minute, 10 MiB more on GPU 0 and 1 MiB more on GPU 1 at each reading; a third kernel that
    holds nothing."""
    memory_a = [100, 300, 200, 200, 500, 100]
    sm_a = [10.0, 30.0, 0.0, 0.0, 50.0, None]
    snapshots = []
    for step, (memory, sm) in enumerate(zip(memory_a, sm_a, strict=True)):
        kernels = [use(A, TRAIN, (0, memory * MIB, sm)), use(IDLE, "idle.ipynb")]
        if step >= 2:
            kernels.append(use(B, None, (0, (10 * step) * MIB, 20.0), (1, (1000 + step) * MIB, 40.0)))
        snapshots.append(snapshot(T0 + 10 + 30 * step, view(T0 + 5 + 30 * step, *kernels)))
    return snapshots


def test_each_minute_holds_each_kernels_peak_and_mean_memory_and_mean_sm_per_gpu(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    snapshots = readings()
    # The same reading carried by a later snapshot (process readings are slower than the sampler) counts once.
    repeated = snapshot(T0 + 20, snapshots[0].notebooks)
    write(path, [snapshots[0], repeated, *snapshots[1:]], gpus=2)
    history = SqliteHistory(path)
    with history.reading() as connection:
        found = notebook_minutes(connection, T0, T0 + 180)
    # A: minute 0 (100, 300 MiB; 10, 30 %), minute 1 (200, 200; 0, 0 %), minute 2 (500, 100; 50 %, unknown).
    # B (titled by its kernel: no session): GPU 0 20, 30 then 40, 50 MiB; GPU 1 1002, 1003 then 1004, 1005 MiB.
    assert found == [
        NotebookMinute(T0, A, TRAIN, GPU0, 0, 2, 300.0 * MIB, 200.0 * MIB, 20.0),
        NotebookMinute(T0 + 60, A, TRAIN, GPU0, 0, 2, 200.0 * MIB, 200.0 * MIB, 0.0),
        NotebookMinute(T0 + 60, B, "Kernel python3 bbbb2222", GPU0, 0, 2, 30.0 * MIB, 25.0 * MIB, 20.0),
        NotebookMinute(T0 + 60, B, "Kernel python3 bbbb2222", GPU1, 1, 2, 1003.0 * MIB, 1002.5 * MIB, 40.0),
        NotebookMinute(T0 + 120, A, TRAIN, GPU0, 0, 2, 500.0 * MIB, 300.0 * MIB, 50.0),
        NotebookMinute(T0 + 120, B, "Kernel python3 bbbb2222", GPU0, 0, 2, 50.0 * MIB, 45.0 * MIB, 20.0),
        NotebookMinute(T0 + 120, B, "Kernel python3 bbbb2222", GPU1, 1, 2, 1005.0 * MIB, 1004.5 * MIB, 40.0),
    ]
    assert rows(path, "SELECT count(*) FROM notebook_memory WHERE kernel_id = ?", (IDLE,)) == [(0,)]
    with history.reading() as connection:
        assert [m.minute_s for m in notebook_minutes(connection, T0 + 60, T0 + 120)] == [T0 + 60] * 3


def test_a_kernel_whose_memory_nvml_does_not_give_is_written_with_unknown_memory(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    write(path, [snapshot(T0 + 1, view(T0 + 1, use(A, TRAIN, (0, None, 5.0)))),
                 snapshot(T0 + 2, view(T0 + 2, use(A, TRAIN, (0, 64 * MIB, None))))], gpus=2)
    with SqliteHistory(path).reading() as connection:
        assert notebook_minutes(connection, T0, T0 + 60) == [
            NotebookMinute(T0, A, TRAIN, GPU0, 0, 2, 64.0 * MIB, 64.0 * MIB, 5.0)]


def test_a_view_that_is_not_ok_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    degraded = NotebookView("pid_namespace", "nvdash sees another PID namespace.", T0 + 1,
                            (use(A, TRAIN, (0, 64 * MIB, 5.0)),))
    write(path, [snapshot(T0 + 1, degraded), snapshot(T0 + 2, None)], gpus=2)
    assert rows(path, "SELECT count(*) FROM notebook_memory") == [(0,)]


def test_notebook_minutes_older_than_the_retention_are_pruned(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    times = [T0 + minute * 60.0 for minute in range(180)]
    write(path, [snapshot(t, view(t, use(A, TRAIN, (0, 64 * MIB, 5.0)))) for t in times], gpus=2,
          retention_s=HOUR)
    horizon = times[-1] - HOUR
    kept = [t for t in times if t >= horizon]
    assert [r[0] for r in rows(path, "SELECT t FROM notebook_memory ORDER BY t")] == kept


def test_a_history_written_before_the_table_gets_it_and_reads_empty(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    write(path, [simple(T0)])
    connection = sqlite3.connect(path)
    connection.execute("DROP TABLE notebook_memory")
    connection.commit()
    connection.close()
    with SqliteHistory(path).reading() as reader:
        assert notebook_minutes(reader, T0, T0 + 60) == []
    write(path, [snapshot(T0 + 70, view(T0 + 70, use(A, TRAIN, (0, 64 * MIB, 5.0))))], gpus=2)
    assert rows(path, "SELECT t, kernel_id, memory_bytes_max FROM notebook_memory") == [(T0 + 60, A, 64.0 * MIB)]
