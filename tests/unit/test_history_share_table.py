"""The history's pod shares table: the writer stores each snapshot's pod shares per minute, a pod's timeline reads
back their sums, and a prune keeps the retention."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np

from nvdash.history.database import open_database
from nvdash.history.query import SqliteHistory
from nvdash.history.share_table import PodKey, pod_timeline, pods_seen
from nvdash.sampling.records import Snapshot
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from tests.unit.test_history_store import HOUR, MIB, T0, rows, simple, write

UUID0 = "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
UUID1 = "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"


def owner(pod: str, sm_pct: float | None, memory: int | None, container: str = "main",
          namespace: str = "team") -> OwnerShare:
    return OwnerShare(ShareOwner("pod", namespace, pod, container), sm_pct, None, memory, None, 0.0, None, 1)


def unit(index: int, uuid: str, sharing: str, *owners: OwnerShare) -> UnitShares:
    return UnitShares(index, uuid, uuid, sharing, 1.0, 100.0, tuple(owners), 0.0, 0, None, 0.0, True)


def shared(time_s: float, sm_a: float, sm_b: float) -> Snapshot:
    """Pod ``a`` on two GPUs (time-sliced GPU 0 and MPS GPU 1, two containers on GPU 0), pod ``b`` on GPU 0 beside
    it, and a bare process that the table leaves out."""
    process = OwnerShare(ShareOwner("process", pid=42), 5.0, None, 1 * MIB, None, 0.0, None, 1)
    base = simple(time_s, gpus=2)
    return Snapshot(base.time_s, gpus=base.gpus, host=base.host, shares=(
        unit(0, UUID0, "shared", owner("a", sm_a, 100 * MIB), owner("a", 10.0, 50 * MIB, container="side"),
             owner("b", sm_b, 300 * MIB, namespace="other"), process),
        unit(1, UUID1, "mps", owner("a", 30.0, 200 * MIB)),
    ))


def test_the_writer_stores_pod_shares_per_minute_and_a_timeline_sums_them(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    # Two minutes, two snapshots each: pod a's main container at 40 then 60 % in the first minute, 20 % twice in
    # the second.
    write(path, [shared(T0 + 5, 40.0, 1.0), shared(T0 + 35, 60.0, 3.0), shared(T0 + 65, 20.0, 5.0),
                 shared(T0 + 95, 20.0, 7.0)], gpus=2)
    stored = rows(path, "SELECT t, unit, gpu, namespace, pod, container, sharing, n, sm_n, sm_pct_sum, memory_n,"
                        " memory_bytes_sum FROM pod_shares WHERE t = ? ORDER BY unit, pod, container", (T0,))
    assert stored == [
        (T0, UUID0, 0, "team", "a", "main", "shared", 2, 2, 100.0, 2, 200.0 * MIB),
        (T0, UUID0, 0, "team", "a", "side", "shared", 2, 2, 20.0, 2, 100.0 * MIB),
        (T0, UUID0, 0, "other", "b", "main", "shared", 2, 2, 4.0, 2, 600.0 * MIB),
        (T0, UUID1, 1, "team", "a", "main", "mps", 2, 2, 60.0, 2, 400.0 * MIB),
    ]
    history = SqliteHistory(path)
    with history.reading() as connection:
        timeline = pod_timeline(connection, "team", "a", T0, T0 + 120, step_s=60.0)
        # One 2-minute bucket: each container's mean over its 4 snapshots, then summed.
        coarse = pod_timeline(connection, "team", "a", T0, T0 + 120, step_s=120.0)
        seen = pods_seen(connection, T0, T0 + 120)
    assert timeline.time_s.tolist() == [T0, T0 + 60]
    # SM in devices-worth: (50 + 10 + 30) % = 0.9 GPU, then (20 + 10 + 30) % = 0.6 GPU.
    assert np.allclose(timeline.sm_gpus, [0.9, 0.6])
    assert timeline.memory_bytes.tolist() == [350.0 * MIB, 350.0 * MIB]
    assert coarse.time_s.tolist() == [T0]
    assert np.allclose(coarse.sm_gpus, [(35.0 + 10.0 + 30.0) / 100.0])
    assert seen == [PodKey("other", "b", ("shared",)), PodKey("team", "a", ("mps", "shared"))]


def test_an_owner_without_sm_samples_counts_as_unknown_not_zero(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    first, second = simple(T0 + 1), simple(T0 + 61)
    memory_only = Snapshot(first.time_s, first.gpus, first.host,
                           shares=(unit(0, UUID0, "whole", owner("a", None, 64 * MIB)),))
    write(path, [memory_only, Snapshot(second.time_s, second.gpus, second.host,
                                       shares=(unit(0, UUID0, "whole", owner("a", 25.0, None)),))])
    connection = open_database(path, read_only=True)
    try:
        timeline = pod_timeline(connection, "team", "a", T0, T0 + 120, step_s=60.0)
    finally:
        connection.close()
    assert math.isnan(timeline.sm_gpus[0])
    assert timeline.sm_gpus[1] == 0.25
    assert timeline.memory_bytes[0] == 64 * MIB
    assert math.isnan(timeline.memory_bytes[1])


def test_pod_shares_older_than_the_retention_are_pruned(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    times = [T0 + minute * 60.0 for minute in range(180)]
    write(path, [shared(t, 40.0, 1.0) for t in times], gpus=2, retention_s=HOUR)
    horizon = times[-1] - HOUR
    kept = [t for t in times if t >= horizon]
    assert [r[0] for r in rows(path, "SELECT DISTINCT t FROM pod_shares ORDER BY t")] == kept
    assert rows(path, "SELECT count(*) FROM pod_shares")[0][0] == 4 * len(kept)


def test_a_history_written_before_the_table_gets_it_and_reads_empty(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    write(path, [simple(T0)])
    connection = sqlite3.connect(path)
    connection.execute("DROP TABLE pod_shares")
    connection.commit()
    connection.close()
    reader = open_database(path, read_only=True)
    try:
        assert pod_timeline(reader, "team", "a", T0, T0 + 60, step_s=60.0).time_s.tolist() == []
    finally:
        reader.close()
    write(path, [shared(T0 + 70, 40.0, 1.0)], gpus=2)
    assert rows(path, "SELECT count(*) FROM pod_shares")[0][0] == 4
