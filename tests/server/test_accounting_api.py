"""``/api/accounting.json`` and ``.csv`` on a real server: a job-mapping directory's job is charged its GPU's time,
in the history file and, with ``--no-history``, from memory; bad requests are one-line 400s."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port, get_json, http_get, nvdash_env, nvdash_server, wait_for


@pytest.mark.parametrize("history", [True, False], ids=["history", "no-history"])
def test_the_mapped_job_is_charged_and_served_as_json_and_csv(tmp_path: Path, history: bool) -> None:
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "3").write_text("31337\n")
    store = ["--history", str(tmp_path / "h.sqlite")] if history else ["--no-history"]
    args = ["--simulate", "dgx-h100", "--interval", "0.25", "--job-mapping-dir", str(mapping), *store]
    with nvdash_server(args) as server:
        def job() -> dict[str, object] | None:
            rows = get_json(server.url + "/api/accounting.json?range=today&by=job")["rows"]
            return next((row for row in rows if row["key"] == "31337"), None)

        row = wait_for(job, lambda r: r is not None and r["gpu_seconds"] >= 2.0, timeout_s=60.0)
        assert row["gpus"] == [3]
        assert row["kinds"] == ["slurm"]
        assert row["energy_j"] > 0
        for policy in ("power_cap", "thermal"):  # the time lost to throttling: null when no counter was read
            known, lost, share = row[f"{policy}_known_s"], row[f"{policy}_s"], row[f"{policy}_pct"]
            if known == 0:
                assert (lost, share) == (None, None), "a counter never read is unknown, not 0"
            else:
                assert 0 <= lost <= known
                assert share == pytest.approx(100 * lost / known, abs=0.01)
        report = get_json(server.url + "/api/accounting.json?range=7d&by=job")
        assert report["source"] == ("history" if history else "memory")
        assert report["range"]["label"] == "7d"
        status, body, headers = http_get(server.url + "/api/accounting.csv?range=today&by=job")
        assert status == 200
        assert headers["Content-Type"].startswith("text/csv")
        assert "attachment" in headers["Content-Disposition"]
        rows = {r["job"]: r for r in csv.DictReader(io.StringIO(body))}
        assert rows["31337"]["gpus"] == "3"
        for query, message in (("range=soon", "'soon' is not a duration"), ("by=team", "by must be one of"),
                               ("from=2026-11-23&to=2026-11-22", "from is after to")):
            status, body, _ = http_get(server.url + "/api/accounting.json?" + query)
            assert status == 400
            assert message in json.loads(body)["error"]
        status = server.health()["accounting"]
        assert status["source"] == ("history" if history else "memory")
        assert (status["job_mapping_dir"], status["job_mapping_readable"]) == (str(mapping), True)
        assert status["mapped_jobs"] == ["31337"]
        assert status["failed_readings"] == 0
        (mapping / "3").unlink()  # the epilog, then the directory itself goes (an unmounted share)
        mapping.rmdir()
        gone = wait_for(lambda: server.health()["accounting"], lambda s: s["job_mapping_readable"] is False,
                        timeout_s=60.0)
        assert gone["mapped_jobs"] == []


def test_the_accounting_outlives_the_server_adds_up_across_restarts_and_is_replayed(tmp_path: Path) -> None:
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "5").write_text("4711\n")
    path = tmp_path / "h.sqlite"
    args = ["--simulate", "dgx-h100", "--interval", "0.25", "--job-mapping-dir", str(mapping), "--history", str(path)]

    def charged(url: str) -> float:
        rows = get_json(url + "/api/accounting.json?range=today")["rows"]
        return next((row["gpu_seconds"] for row in rows if row["key"] == "4711"), 0.0)

    with nvdash_server(args) as server:
        wait_for(lambda: charged(server.url), lambda seconds: seconds >= 2.0, timeout_s=60.0)
    first = accounting_seconds(path)
    assert first >= 2.0, "the server's last tallies are written when it stops"
    with nvdash_server(args) as server:
        wait_for(lambda: charged(server.url), lambda seconds: seconds >= first + 2.0, timeout_s=60.0)
    second = accounting_seconds(path)
    assert second >= first + 2.0, "a restarted server adds to the hours already stored"
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "nvdash", "replay", str(path), "--port", str(port)],
                               env=nvdash_env(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        report = wait_for(lambda: try_json(url + "/api/accounting.json?range=today"), lambda r: r is not None,
                          timeout_s=60.0)
        assert report["source"] == "history"
        assert report["idle_allocations"] == []
        [row] = [row for row in report["rows"] if row["key"] == "4711"]
        assert row["gpu_seconds"] == pytest.approx(second, abs=1e-3)
        assert row["gpus"] == [5]
    finally:
        process.terminate()
        process.wait(30)


def accounting_seconds(path: Path) -> float:
    """GPU-seconds stored for job 4711, read with plain SQLite."""
    with sqlite3.connect(path) as connection:
        value = connection.execute("SELECT sum(allocated_s) FROM accounting WHERE job = '4711'").fetchone()[0]
    return float(value or 0.0)


def try_json(url: str) -> dict[str, object] | None:
    try:
        status, body, _ = http_get(url, timeout=5.0)
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


def test_a_job_on_a_power_capped_gpu_is_charged_the_time_the_cap_held_its_clocks(tmp_path: Path) -> None:
    """dgx-a100's GPU 2 is capped at 300 W below its 400 W management limit: its draw is held at the enforced limit
    with the power-cap reason set, so NVML's power violation counter rises, and the job holding it is charged it."""
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "2").write_text("777\n")
    args = ["--simulate", "dgx-a100", "--interval", "0.25", "--job-mapping-dir", str(mapping), "--no-history"]
    with nvdash_server(args) as server:
        def counter() -> int | None:
            value = get_json(server.url + "/api/snapshot.json")["gpus"][2]["violation_power_ns"]
            return int(value) if value is not None else None

        first = wait_for(counter, lambda c: c is not None, timeout_s=60.0)

        def job() -> dict[str, object] | None:
            rows = get_json(server.url + "/api/accounting.json?range=today&by=job")["rows"]
            return next((row for row in rows if row["key"] == "777"), None)

        row = wait_for(job, lambda r: r is not None and (r["power_cap_s"] or 0) >= 1.0, timeout_s=90.0)
        last = counter()
        assert last is not None
        assert last > first, "the counter rises while the cap holds the clocks"
        gpu = get_json(server.url + "/api/snapshot.json")["gpus"][2]
        assert (gpu["power_enforced_limit_w"], gpu["power_management_limit_w"]) == (300.0, 400.0)
        assert row["gpus"] == [2]
        assert 0 < row["power_cap_s"] <= row["power_cap_known_s"] <= row["gpu_seconds"] + 1e-6
        assert row["power_cap_s"] <= last / 1e9, "no more than the counter ever counted"
        # The JSON's seconds are rounded to 1 ms and its share to 0.01 %: the share recomputed from them can be off
        # by that much.
        rounding = 0.005 + 100 * 1e-3 / row["power_cap_known_s"]
        assert row["power_cap_pct"] == pytest.approx(100 * row["power_cap_s"] / row["power_cap_known_s"], abs=rounding)
        # The simulated GPU 2 sits at its cap in every compute step, about 90 % of any minute (its power violation
        # counter rises by 0.90-1.00 s per second): the job holding it lost that share, not a sliver of it.
        assert row["power_cap_pct"] >= 75.0
        # The range's totals: the rows' lost seconds summed over the rows' known seconds summed.
        report = get_json(server.url + "/api/accounting.json?range=today&by=job")
        lost = sum(r["power_cap_s"] or 0.0 for r in report["rows"])
        known = sum(r["power_cap_known_s"] for r in report["rows"])
        totals = report["totals"]
        assert totals["power_cap_s"] == pytest.approx(lost, abs=1e-3 * len(report["rows"]))
        assert totals["power_cap_known_s"] == pytest.approx(known, abs=1e-3 * len(report["rows"]))
        total_rounding = 0.005 + 100 * 1e-3 * len(report["rows"]) / known
        assert totals["power_cap_pct"] == pytest.approx(100 * lost / known, abs=total_rounding)
        assert totals["power_cap_s"] >= next(r for r in report["rows"] if r["key"] == "777")["power_cap_s"]
