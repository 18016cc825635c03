"""What the cluster accounting counts over a range, on a real Prometheus backfilled (``promtool tsdb
create-blocks-from openmetrics``) with accounting counters sampled every minute over the past hour.

- node-a, job 1: 10 GPU-seconds a minute until minute 20, then nothing (the job ended; its counter stays);
- node-b, job 1: 5 a minute, its nvdash restarted after minute 25 (the counter starts again from 0 at minute 26);
- node-c, job 2: appears at minute 30 (0), 3 a minute.

The range is minute 10.5 to 40.5. Counted at two instants (the command's way where no counter reset), node-a's job
1 used exactly 200 - 100 = 100 and job 2 exactly 30; ``increase()`` would extrapolate node-a's to 93.1. node-b's
counter reset, so it is counted with ``increase()``: 70 before the restart and 70 after, extrapolated by half a
minute at each end, 144.8 (the value at the two instants would say 70 - 50 = 20).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nvdash.cluster.accounting import ClusterAccounting
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.selectors import SeriesScope
from tests.prometheus_cluster import run_prometheus

FAMILY = "nvdash_accounting_gpu_allocated_seconds"


def node_a(minute: int) -> float:
    return 10.0 * min(minute, 20)


def node_b(minute: int) -> float:
    return 5.0 * minute if minute <= 25 else 5.0 * (minute - 26)


def openmetrics(start_s: float) -> str:
    lines = [f"# TYPE {FAMILY} counter"]
    series = (('Hostname="node-a",hpc_job="1",kind="slurm",user="alice",project="lab"', range(61), node_a),
              ('Hostname="node-b",hpc_job="1",kind="slurm",user="alice",project="lab"', range(61), node_b),
              ('Hostname="node-c",hpc_job="2",kind="slurm",user="bob",project="lab"', range(30, 61),
               lambda minute: 3.0 * (minute - 30)))
    for labels, minutes, value in series:
        lines += [f"{FAMILY}_total{{{labels}}} {value(minute)} {start_s + 60 * minute:.0f}" for minute in minutes]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def test_two_instants_where_no_counter_reset_and_increase_where_one_did(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing (Debian's prometheus package)", pytrace=False)
    start_s = math.floor(time.time() / 60) * 60 - 2 * 3600.0  # minute 0, two hours ago
    source = tmp_path / "accounting.om.txt"
    source.write_text(openmetrics(start_s))
    (tmp_path / "data").mkdir()
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with run_prometheus(tmp_path, [], rules=False) as url:
        accounting = ClusterAccounting(PrometheusClient(url), SeriesScope())
        rows, truncated = accounting.rows(start_s + 630, start_s + 2430, "job")
        assert not truncated
        found = {row.key: row.total.allocated_s for row in rows}
        assert found["2"] == pytest.approx(30.0, abs=1e-9)
        node_b_part = found["1"] - 100.0  # node-a's part is exact; what is left is node-b's, by increase()
        assert node_b_part == pytest.approx(140.0 * 30.0 / 29.0, abs=1e-6)
        by_user = {row.key: row.total.allocated_s for row in accounting.rows(start_s + 630, start_s + 2430, "user")[0]}
        assert by_user == pytest.approx({"alice": found["1"], "bob": 30.0})
        # --prometheus-selector reaches the query: node-a alone is exactly its two instants.
        scoped = ClusterAccounting(PrometheusClient(url), SeriesScope(matchers=('Hostname="node-a"',)))
        assert {row.key: row.total.allocated_s for row in scoped.rows(start_s + 630, start_s + 2430, "job")[0]} == {
            "1": pytest.approx(100.0, abs=1e-9)}
