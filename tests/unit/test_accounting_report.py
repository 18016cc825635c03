"""The accounting report: its ranges, the command line's flags, and ``nvdash report`` on a real history file."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import HOUR_S, Key, Tally
from nvdash.accounting.report import RangeError, accounting_range
from nvdash.cli import main
from nvdash.history import accounting_table
from nvdash.history.database import open_database
from nvdash.server.options import UsageError, parse_settings

NOW = 1_795_000_000.0


def test_today_starts_at_local_midnight_and_the_default_is_seven_days() -> None:
    today = accounting_range({"range": "today"}, NOW)
    midnight = datetime.fromtimestamp(NOW).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    assert (today.start_s, today.end_s, today.label) == (midnight, NOW, "today")
    week = accounting_range({}, NOW)
    assert (week.start_s, week.end_s, week.label) == (NOW - 7 * 86_400, NOW, "7d")
    custom = accounting_range({"from": "1794990000", "to": "1794996000"}, NOW)
    assert (custom.start_s, custom.end_s, custom.label) == (1794990000.0, 1794996000.0, "custom")
    for bad in ({"range": "live"}, {"range": "soon"}, {"from": "1794996000", "to": "1794990000"}):
        with pytest.raises(RangeError):
            accounting_range(bad, NOW)


def test_the_accounting_flags() -> None:
    settings = parse_settings([], {})
    assert (settings.job_mapping_dir, settings.accounting_retention_s, settings.idle_after_s) == (
        None, 365 * 86_400.0, 1800.0)
    assert settings.metrics_job_label is False
    settings = parse_settings(["--accounting-retention", "2w", "--idle-after", "10m", "--metrics-job-label",
                               "--job-mapping-dir", "/"], {})
    assert (settings.accounting_retention_s, settings.idle_after_s, settings.job_mapping_dir) == (
        14 * 86_400.0, 600.0, "/")
    assert settings.metrics_job_label is True
    assert parse_settings([], {"NVDASH_JOB_MAPPING_DIR": "/"}).job_mapping_dir == "/"
    with pytest.raises(UsageError, match=r"^\$NVDASH_JOB_MAPPING_DIR: /nowhere is not a directory$"):
        parse_settings([], {"NVDASH_JOB_MAPPING_DIR": "/nowhere"})
    for argv, message in ((["--job-mapping-dir", "/no/such/dir"], "--job-mapping-dir: /no/such/dir is not a"),
                          (["--idle-after", "soon"], "--idle-after: 'soon' is not a duration"),
                          (["--accounting-retention", "1h"], "--accounting-retention must be at least")):
        with pytest.raises(UsageError, match=message):
            parse_settings(argv, {})


def history_with_jobs(path: Path, now_s: float) -> None:
    hour = now_s - now_s % HOUR_S
    job = Owner("slurm", "555", "alice", "physics")
    pod = Owner("pod", "ml/train-0", "unknown", "ml")
    tallies: dict[Key, Tally] = {
        (job, 0, hour - HOUR_S): Tally(start_s=hour - 3000, end_s=hour, allocated_s=3000, busy_s=1800,
                                       activity_known_s=3000, utilization_s=900, energy_j=3_600_000,
                                       energy_known_s=3000, peak_memory_bytes=40 << 30),
        (job, 1, hour): Tally(start_s=hour, end_s=hour + 600, allocated_s=600, busy_s=600, activity_known_s=600,
                              utilization_s=600, energy_j=360_000, energy_known_s=300),
        (pod, 2, hour - 2 * HOUR_S): Tally(start_s=hour - 7200, end_s=hour - 3600, allocated_s=3600, busy_s=0,
                                           activity_known_s=3600, energy_j=0.0, energy_known_s=3600),
    }
    connection = open_database(path)
    accounting_table.store(connection, tallies)
    connection.close()


def test_nvdash_report_prints_json_csv_and_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.sqlite"
    history_with_jobs(path, time.time())
    assert main(["report", "--history", str(path), "--format", "json", "--range", "1d"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {row["key"]: row for row in report["rows"]}
    assert list(rows) == ["555", "ml/train-0"], "most GPU-hours first, then by name (both have one)"
    job = rows["555"]
    assert (job["gpus"], job["gpu_seconds"]) == ([0, 1], 3600.0)
    assert job["busy_hours"] == pytest.approx(2400 / 3600, abs=1e-6)
    assert job["efficiency_pct"] == pytest.approx(100 * 2400 / 3600, abs=0.01)
    assert job["energy_kwh"] == pytest.approx(1.1)
    assert job["energy_complete"] is False, "GPU 1's counter covered half of its time"
    assert job["peak_memory_bytes"] == 40 << 30
    assert rows["ml/train-0"]["wasted_hours"] == 1.0
    assert report["totals"]["gpu_hours"] == pytest.approx(2.0)

    assert main(["report", "--history", str(path), "--format", "csv", "--by", "namespace", "--range", "1d"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(row["namespace"], row["gpu_hours"]) for row in table] == [("ml", "1.0"), ("physics", "1.0")]

    assert main(["report", "--history", str(path), "--by", "user"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1].split()[:4] == ["USER", "KIND", "GPUS", "GPU-H"]
    assert "alice" in text
    assert "total: 2.00 GPU-hours, 0.67 busy, 1.33 wasted, 1.100 kWh" in text
    assert "* the energy counter was not read over all of the allocated time" in text


def test_nvdash_report_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.sqlite"
    assert main(["report", "--history", str(missing)]) == 1
    assert capsys.readouterr().err.strip() == f"nvdash: error: history file {missing} does not exist"
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_text("not a database")
    assert main(["report", "--history", str(garbage)]) == 1
    assert "is not an nvdash history file" in capsys.readouterr().err
    assert main(["report", "--history", str(missing), "--range", "soon"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["report", "--by", "team"]) == 2
