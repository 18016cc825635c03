"""``--metrics-accounting`` on a real server: the counters per owner on ``/metrics`` are the accountant's own
running totals, so at a moment when no reading comes between them they equal what ``/api/accounting.json`` says
the owners used since the server started (the in-memory accounting, ``--no-history``), to the JSON's rounding.

On ``a100-pcie-2`` GPU 0 runs a training rank (busy) and GPU 1 nothing; the job-mapping files give GPU 0 to Slurm job
601 and GPU 1 to job 602. Both are charged the same seconds, so with ``--metrics-accounting-owners 1`` the tie goes
to the lower job id: 601 keeps a series of its own and 602 is all of ``_other``.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.metrics.accounting_families import ACCOUNTING_COUNTER_NAMES
from tests.conftest import get_json, nvdash_server, wait_for

ALLOCATED, BUSY, KNOWN, ENERGY, POWER_CAP, THERMAL = ACCOUNTING_COUNTER_NAMES
Counters = dict[str, dict[tuple[str, str, str, str], float]]
"""Family -> (kind, job, user, project) -> value."""


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


def counters(text: str) -> Counters:
    found: Counters = {name: {} for name in ACCOUNTING_COUNTER_NAMES}
    for family in parse_text(text):
        for sample in family.samples:
            if sample.name in found:
                labels = sample.labels
                assert labels["Hostname"] == "node-x"
                owner = (labels["kind"], labels["hpc_job"], labels["user"], labels["project"])
                found[sample.name][owner] = sample.value
    return found


def consistent(url: str) -> tuple[Counters, dict[str, Any]] | None:
    """The counters and the JSON report read with no reading of the sampler between them: two scrapes around the
    report that agree (every reading adds allocated seconds, so equal counters mean no reading came between);
    ``None`` when a reading came between (the caller asks again)."""
    before = counters(metrics_text(url))
    report = get_json(url + "/api/accounting.json?range=1d&by=job")
    after = counters(metrics_text(url))
    return (before, report) if before == after else None


def test_counters_equal_the_servers_own_report_and_the_bound_sums_the_rest_into_other(tmp_path: Path) -> None:
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("601\n")
    (mapping / "1").write_text("602\n")
    args = ["--simulate", "a100-pcie-2", "--interval", "0.5", "--no-history", "--hostname", "node-x",
            "--job-mapping-dir", str(mapping), "--metrics-accounting", "--metrics-accounting-owners", "1"]
    with nvdash_server(args) as server:
        pair = wait_for(lambda: consistent(server.url),
                        lambda pair: pair is not None and sum(pair[0][ALLOCATED].values()) > 6.0, timeout_s=60.0)
        assert pair is not None
        found, report = pair
        rows = {row["key"]: row for row in report["rows"]}
        assert sorted(rows) == ["601", "602"]
        other = ("_other", "_other", "_other", "_other")
        assert set(found[ALLOCATED]) == {("slurm", "601", "unknown", "unknown"), other}
        for key, job in ((("slurm", "601", "unknown", "unknown"), "601"), (other, "602")):
            row = rows[job]
            assert found[ALLOCATED][key] == pytest.approx(row["gpu_seconds"], abs=5e-4)
            assert found[BUSY][key] == pytest.approx(row["busy_hours"] * 3600, abs=2e-3)
            assert found[KNOWN][key] - found[BUSY][key] == pytest.approx(row["wasted_hours"] * 3600, abs=2e-3)
            assert found[ENERGY][key] == pytest.approx(row["energy_j"], abs=5e-4)
            assert found[POWER_CAP][key] == pytest.approx(row["power_cap_s"], abs=5e-4)
            assert found[THERMAL][key] == pytest.approx(row["thermal_s"], abs=5e-4)
        # GPU 0 is busy at every reading, GPU 1 never: the busy time tells which job is which.
        assert found[BUSY][("slurm", "601", "unknown", "unknown")] == found[ALLOCATED][("slurm", "601", "unknown",
                                                                                      "unknown")]
        assert found[BUSY][other] == 0.0
        # The node's totals: the series add up to the report's.
        assert sum(found[ALLOCATED].values()) == pytest.approx(sum(row["gpu_seconds"] for row in rows.values()),
                                                               abs=1e-3)
        assert sum(found[ENERGY].values()) == pytest.approx(sum(row["energy_j"] for row in rows.values()), abs=1e-3)
        # Counters only grow; the owner keeps its slot (the tie never flips).
        later = wait_for(lambda: counters(metrics_text(server.url)),
                         lambda f: f[ALLOCATED].get(other, 0.0) > found[ALLOCATED][other] + 1.0, timeout_s=30.0)
        assert set(later[ALLOCATED]) == set(found[ALLOCATED])
        assert all(later[name][key] >= found[name][key] for name in found for key in found[name])


def test_promtool_finds_nothing_wrong_with_the_accounting_families(tmp_path: Path) -> None:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing (Debian's prometheus package)", pytrace=False)
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("601\n")
    args = ["--simulate", "a100-pcie-2", "--interval", "0.5", "--no-history", "--hostname", "node-x",
            "--job-mapping-dir", str(mapping), "--metrics-accounting"]
    with nvdash_server(args) as server:
        text = wait_for(lambda: metrics_text(server.url),
                        lambda t: f'{ALLOCATED}{{Hostname="node-x",hpc_job="601"' in t, timeout_s=60.0)
    chunk = "".join(f"# HELP {block}" for block in text.split("# HELP ")[1:] if block.startswith("nvdash_accounting_"))
    assert chunk.count("# TYPE") == len(ACCOUNTING_COUNTER_NAMES)

    def lint(text: str) -> tuple[int, str]:
        result = subprocess.run([path, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                                check=False)
        return result.returncode, (result.stdout + result.stderr).strip()

    assert lint(chunk) == (0, "")
    # The same chunk with the counters' suffix taken off is linted (the check above did look at the families).
    code, problems = lint(chunk.replace("_total", ""))
    assert code != 0
    assert 'counter metrics should have "_total" suffix' in problems


def test_without_the_option_there_are_no_accounting_counters(tmp_path: Path) -> None:
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("601\n")
    args = ["--simulate", "a100-pcie-2", "--interval", "0.5", "--no-history", "--job-mapping-dir", str(mapping)]
    with nvdash_server(args) as server:
        text = wait_for(lambda: metrics_text(server.url), lambda t: "nvdash_gpu_allocated_idle_seconds{" in t,
                        timeout_s=60.0)
    assert "nvdash_accounting_" not in text
