"""The accounting across nodes: three real nvdash nodes (simulated ``a100-pcie-2``) exporting their accounting
counters (``--metrics-accounting``), a real Prometheus scraping them, and ``nvdash report --prometheus`` run as a
command.

Slurm job 7001 runs on node-a's GPU 0 and node-b's GPU 0 (the same job id in both nodes' job-mapping files), job 7002
on node-b's GPU 1 and job 7003 on node-c's GPU 1. Then the jobs end (their files are removed): their counters stop
growing, so each node's own report of them (``/api/accounting.json``) stops changing, and once Prometheus has
scraped those final values the cluster report over a range that began before the nodes started must equal the sum of
the nodes' reports: exactly, since the command counts a counter's value at the range's end less its value at the
start (none here), with no ``increase()`` extrapolation. The tolerance is the JSON's rounding (3 decimals of a
second or joule per node row).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from bokeh.client import ClientSession, pull_session
from bokeh.models import ColumnDataSource

from tests.conftest import NvdashServer, get_json, http_get, nvdash_env, nvdash_server, wait_for
from tests.prometheus_cluster import query, run_prometheus
from tests.server.bokeh_viewer import receive_for

NODES = ("node-a", "node-b", "node-c")
MAPPING = {"node-a": {"0": "7001"}, "node-b": {"0": "7001", "1": "7002"}, "node-c": {"1": "7003"}}
JOBS = ("7001", "7002", "7003")
ALLOCATED = "nvdash_accounting_gpu_allocated_seconds_total"


TOKEN = "cluster-accounting-secret"


def http_status(url: str) -> int:
    return http_get(url)[0]


def page_rows(session: ClientSession) -> dict[str, float]:
    """The page's table: owner -> GPU-hours."""
    receive_for(session, 0.2)
    for model in session.document.select({"type": ColumnDataSource, "name": "cluster-accounting"}):
        return dict(zip(model.data["key"], model.data["gpu_hours"], strict=True))
    return {}


def node_rows(server: NvdashServer) -> dict[str, dict[str, Any]]:
    report = get_json(server.url + "/api/accounting.json?range=1d&by=job")
    return {row["key"]: row for row in report["rows"]}


def cluster_report(url: str, start_s: float, end_s: float, *extra: str, by: str = "job",
                   output: str = "json") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdash", "report", "--prometheus", url, "--from", f"{start_s:.3f}",
         "--to", f"{end_s:.3f}", "--by", by, "--format", output, *extra],
        capture_output=True, text=True, timeout=120, env=nvdash_env(), check=False)


def cluster_rows(url: str, start_s: float, end_s: float, *extra: str) -> dict[str, dict[str, Any]]:
    result = cluster_report(url, start_s, end_s, *extra)
    assert result.returncode == 0, result.stderr
    return {row["key"]: row for row in json.loads(result.stdout)["rows"]}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, dict[str, NvdashServer], dict[str, Path]]]:
    with ExitStack() as stack:
        servers: dict[str, NvdashServer] = {}
        mappings: dict[str, Path] = {}
        for name in NODES:
            mapping = mappings[name] = tmp_path / f"{name}-jobs"
            mapping.mkdir()
            for gpu, job in MAPPING[name].items():
                (mapping / gpu).write_text(f"{job}\n")
            servers[name] = stack.enter_context(nvdash_server(
                ["--simulate", "a100-pcie-2", "--interval", "0.5", "--no-history", "--hostname", name,
                 "--job-mapping-dir", str(mapping), "--metrics-accounting"]))
        url = stack.enter_context(run_prometheus(tmp_path, [f"127.0.0.1:{s.port}" for s in servers.values()],
                                                 rules=False))
        yield url, servers, mappings


def test_the_cluster_report_is_the_sum_of_the_nodes_reports(
    cluster: tuple[str, dict[str, NvdashServer], dict[str, Path]],
) -> None:
    url, servers, mappings = cluster
    start_s = time.time() - 120.0  # before the nodes started: no counter has a value there
    for name, server in servers.items():
        wait_for(lambda s=server: node_rows(s),
                 lambda rows, n=name: all(rows.get(job, {}).get("gpu_seconds", 0) > 2.0
                                          for job in set(MAPPING[n].values())), timeout_s=60.0)
    # The jobs end: once a node has read its emptied directory, its readings charge them nothing more.
    for mapping in mappings.values():
        for path in mapping.iterdir():
            os.unlink(path)
    for server in servers.values():
        wait_for(lambda s=server: s.health()["accounting"], lambda status: status["mapped_jobs"] == [],
                 timeout_s=60.0)
    final = {name: node_rows(server) for name, server in servers.items()}

    def scraped(name: str, job: str) -> float | None:
        found = query(url, f'{ALLOCATED}{{Hostname="{name}",hpc_job="{job}"}}')
        return float(found[0]["value"][1]) if found else None

    for name in NODES:
        for job in set(MAPPING[name].values()):
            wait_for(lambda n=name, j=job: scraped(n, j),
                     lambda value, n=name, j=job: value is not None
                     and abs(value - final[n][j]["gpu_seconds"]) <= 5e-4, timeout_s=60.0)
    end_s = time.time()
    rows = cluster_rows(url, start_s, end_s)
    expected = {job: [final[name][job] for name in NODES if job in final[name]] for job in JOBS}
    assert len(expected["7001"]) == 2, "job 7001 ran on two nodes"
    for job, parts in expected.items():
        row = rows[job]
        # Every seconds value in the JSON is rounded to 1 ms, each node's and the cluster's row alike: they may differ
        # by half a millisecond for each rounding (a job on two nodes: 1.5 ms).
        seconds = 5e-4 * (len(parts) + 1) + 1e-9
        assert row["kinds"] == ["slurm"]
        assert row["gpu_seconds"] == pytest.approx(sum(part["gpu_seconds"] for part in parts), abs=seconds)
        for name in ("busy_hours", "wasted_hours", "gpu_hours"):
            assert row[name] == pytest.approx(sum(part[name] for part in parts), abs=2e-6)
        assert row["energy_kwh"] == pytest.approx(sum(part["energy_j"] for part in parts) / 3.6e6, abs=1e-6)
        assert row["power_cap_s"] == pytest.approx(sum(part["power_cap_s"] for part in parts), abs=seconds)
        assert row["thermal_s"] == pytest.approx(sum(part["thermal_s"] for part in parts), abs=seconds)
    # GPU 0 of node-a and node-b runs a training rank, GPU 1 nothing: 7001 was busy throughout, 7002 never.
    assert rows["7001"]["efficiency_pct"] == 100.0
    assert rows["7002"]["efficiency_pct"] == 0.0
    # --prometheus-selector reaches every series the command selects: without node-a, 7001 is node-b's alone.
    without_a = cluster_rows(url, start_s, end_s, "--prometheus-selector", 'Hostname!="node-a"')
    assert without_a["7001"]["gpu_seconds"] == pytest.approx(final["node-b"]["7001"]["gpu_seconds"], abs=1e-3)
    assert "7003" in without_a
    # The table names the job once, with its two nodes' GPU-hours together.
    table = cluster_report(url, start_s, end_s, output="table")
    assert table.returncode == 0, table.stderr
    lines = [line for line in table.stdout.splitlines() if line.startswith("7001 ")]
    assert len(lines) == 1
    assert f"{rows['7001']['gpu_hours']:.2f}" in lines[0].split()
    with nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url, "--token", TOKEN]) as central:
        window = f"from={start_s:.3f}&to={end_s:.3f}&by=job"
        # The same guard as /api/accounting.csv: the dashboards' token.
        assert http_status(f"{central.url}/api/cluster-accounting.csv?{window}") in (401, 403)
        answer = get_json(f"{central.url}/api/cluster-accounting.json?{window}&token={TOKEN}")
        assert answer["source"] == "prometheus"
        assert {row["key"]: row["gpu_seconds"] for row in answer["rows"]} == {
            key: row["gpu_seconds"] for key, row in rows.items()}
        status, csv_text, _headers = http_get(f"{central.url}/api/cluster-accounting.csv?{window}&token={TOKEN}")
        assert status == 200
        header, *lines = csv_text.splitlines()
        assert header.startswith("job,kinds,gpus,gpu_hours,busy_hours,wasted_hours")
        job_line = next(line for line in lines if line.startswith("7001,"))
        assert job_line.split(",")[3] == str(rows["7001"]["gpu_hours"])
        assert http_status(f"{central.url}/api/cluster-accounting.json?range=7d&by=gpu&token={TOKEN}") == 400
        # The page: the same rows, a row per job, and the CSV link for its choices.
        session = pull_session(url=central.url + "/Cluster-Accounting",
                               arguments={"from": f"{start_s:.3f}", "to": f"{end_s:.3f}", "by": "job",
                                          "token": TOKEN})
        try:
            table = wait_for(lambda: page_rows(session), lambda found: "7001" in found, timeout_s=60.0)
            assert table == {key: pytest.approx(row["gpu_hours"], abs=1e-6) for key, row in rows.items()}
            link = next(model.text for model in session.document.select({"name": "csv"}))
            assert f"api/cluster-accounting.csv?from={start_s:.3f}" in link
        finally:
            session.close()


def test_an_unreachable_prometheus_is_one_line_and_status_1() -> None:
    result = cluster_report("http://127.0.0.1:9", time.time() - 3600, time.time())
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("nvdash: error:")
    assert "Traceback" not in result.stderr


def test_history_and_prometheus_together_are_a_usage_error(tmp_path: Path) -> None:
    result = cluster_report("http://127.0.0.1:9", time.time() - 3600, time.time(), "--history",
                            str(tmp_path / "h.sqlite"))
    assert result.returncode == 2
    assert "give --history or --prometheus, not both" in result.stderr
