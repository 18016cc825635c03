"""The history on a real server: recording, ``/api/history.json``, ``/export.csv``, two servers on one file,
refused files, ``kill -9`` at random moments, and ``nvdash replay``."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nvdash.history.database import APPLICATION_ID
from tests.conftest import free_port, get_json, http_get, nvdash_env, nvdash_server, wait_for

FAST = ["--simulate", "dgx-h100", "--interval", "0.25", "--process-interval", "0.5"]


def _rows(path: Path, table: str) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        return int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def _history(server_url: str, query: str) -> tuple[int, Any]:
    status, body, _ = http_get(f"{server_url}/api/history.json?{query}")
    return status, json.loads(body)


def test_a_server_records_and_serves_its_history(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with nvdash_server([*FAST, "--history", str(path)]) as server:
        health = wait_for(server.health, lambda h: h["history"]["snapshots"] >= 8, timeout_s=60.0)
        assert health["history"]["status"] == f"recording to {path}"
        assert health["history"]["errors"] == 0
        status, doc = _history(server.url, "metric=utilization_pct&range=10m&gpu=0,3")
        assert status == 200
        assert doc["metric"] == "utilization_pct"
        assert doc["unit"] == "%"
        assert doc["resolution"] == "raw"
        assert doc["to"] - doc["from"] == 600
        assert [series["gpu"] for series in doc["series"]] == [0, 3]
        values = [v for v in doc["series"][0]["mean"] if v is not None]
        assert values
        assert all(0 <= v <= 100 for v in values)
        status, host = _history(server.url, "metric=host_cpu_pct&range=10m")
        assert status == 200
        assert [series["gpu"] for series in host["series"]] == [None]
        status, body, headers = http_get(server.url + "/export.csv?range=10m")
        assert status == 200
        assert headers["Content-Type"].startswith("text/csv")
        lines = body.splitlines()
        assert lines[0] == ("timestamp, index, name, utilization.gpu [%], memory.used [MiB], temperature.gpu, "
                            "power.draw [W]")
        assert lines[1].split(", ")[1:3] == ["0", "NVIDIA H100 80GB HBM3"]
        assert len(lines) - 1 >= 8 * 8
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert connection.execute("SELECT count(DISTINCT gpu) FROM gpu_raw").fetchone()[0] == 8


def test_api_errors_are_400_with_one_line(tmp_path: Path) -> None:
    with nvdash_server([*FAST, "--history", str(tmp_path / "h.sqlite")]) as server:
        cases = {
            "range=1h": "name a metric with metric=",
            "metric=watts&range=1h": "unknown metric 'watts'",
            "metric=power_w&range=soon": "'soon' is not a duration",
            "metric=power_w&from=2026-11-22T10:00:00Z&to=2026-11-22T09:00:00Z": "from is after to",
            "metric=power_w&from=yesterday": "'yesterday' is not a time",
            "metric=power_w&range=1h&gpu=zero": "gpu must be GPU indices",
            "metric=power_w&range=1h&step=0.001": "more than 20000 points",
            "metric=power_w&range=live": "range=live has no history",
        }
        for query, message in cases.items():
            status, doc = _history(server.url, query)
            assert status == 400, query
            assert message in doc["error"], (query, doc)
            assert "\n" not in doc["error"]
        status, body, _ = http_get(server.url + "/export.csv?range=1h&query-gpu=timestamp,bogus.field")
        assert status == 400
        assert "bogus.field" in body


def test_history_off_answers_404(tmp_path: Path) -> None:
    with nvdash_server([*FAST, "--no-history"]) as server:
        status, doc = _history(server.url, "metric=power_w&range=1h")
        assert status == 404
        assert "off" in doc["error"]
        assert server.health()["history"]["status"] == "off (--no-history)"


def test_a_second_server_on_the_same_file_reads_without_writing(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with nvdash_server([*FAST, "--history", str(path)]) as first:
        wait_for(first.health, lambda h: h["history"]["snapshots"] >= 4, timeout_s=60.0)
        with nvdash_server([*FAST, "--history", str(path)]) as second:
            assert "is being written by another nvdash" in second.output()
            assert second.health()["history"]["status"].startswith("read-only: ")
            status, doc = _history(second.url, "metric=power_w&range=10m")
            assert status == 200
            assert len(doc["series"]) == 8
            before = first.health()["history"]["snapshots"]
            wait_for(first.health, lambda h: h["history"]["snapshots"] > before + 4, timeout_s=60.0)
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert connection.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1


def _start(args: list[str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "nvdash", "--port", str(free_port()), *args]
    return subprocess.Popen(command, env=nvdash_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_foreign_or_corrupt_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE accounts (name TEXT)")
    for path, message in ((text, "is not an nvdash history file"), (other, "of another program")):
        before = path.read_bytes()
        process = _start([*FAST, "--history", str(path)])
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 1
        lines = output.strip().splitlines()
        assert len(lines) == 1, output
        assert lines[0].startswith("nvdash: error: ")
        assert message in lines[0]
        assert path.read_bytes() == before


def test_kill_9_at_random_moments_never_corrupts_and_loses_only_seconds(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    chooser = random.Random()
    for attempt in range(3):
        with nvdash_server([*FAST, "--history", str(path)]) as server:
            # A random moment: after 1 to 4 of the writer's batches.
            batches = chooser.randint(1, 4)
            wait_for(server.health, lambda h, n=batches: h["history"]["batches"] >= n, timeout_s=60.0)
            killed_at = time.time()
            server.process.kill()
            server.process.wait(10)
        with sqlite3.connect(path) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok", attempt
            newest = connection.execute("SELECT max(t) FROM gpu_raw").fetchone()[0]
            sessions = connection.execute("SELECT count(*) FROM sessions").fetchone()[0]
        assert newest is not None
        assert killed_at - newest < 5.0, (attempt, killed_at - newest)
        assert sessions == attempt + 1


def test_replay_serves_a_recording_without_nvml(tmp_path: Path) -> None:
    path = tmp_path / "recording.sqlite"
    with nvdash_server([*FAST, "--history", str(path)]) as server:
        wait_for(server.health, lambda h: h["history"]["snapshots"] >= 12, timeout_s=60.0)
    with sqlite3.connect(path) as connection:
        newest = connection.execute("SELECT max(t) FROM gpu_raw").fetchone()[0]
    port = free_port()
    command = [sys.executable, "-m", "nvdash", "replay", str(path), "--port", str(port)]
    process = subprocess.Popen(command, env=nvdash_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        health = wait_for(lambda: _try_json(url + "/health"), lambda h: h is not None, timeout_s=60.0)
        assert health["sampler"] is None
        assert health["nvml_calls"] == 0
        assert health["history"]["replay"] is True
        assert http_get(url + "/api/simulation.json")[0] == 404, "no simulated library: no simulation route"
        index = get_json(url + "/index.json")
        assert index["/GPU-Resources"] == "GPU Resources (replay)"
        info = get_json(url + "/info.json")
        assert info["mode"] == "replay"
        assert len(info["gpus"]) == 8
        assert info["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
        status, page, _ = http_get(url + "/")
        assert status == 200
        assert "Replay" in page
        status, doc = _history(url, "metric=power_w&range=10m")
        assert status == 200
        assert doc["to"] == newest
        assert len(doc["series"]) == 8
        snapshot = get_json(url + "/api/snapshot.json")
        assert snapshot["time_s"] == newest
        status, _, _ = http_get(url + "/GPU-Resources")
        assert status == 200
        assert get_json(url + "/api/snapshot.json")["time_s"] == newest
    finally:
        process.terminate()
        process.wait(10)


def _try_json(url: str) -> Any:
    try:
        return get_json(url)
    except (OSError, AssertionError):
        return None


def test_replay_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "nvdash", "replay", str(tmp_path / "none.sqlite"),
                                "--port", str(free_port())], env=nvdash_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert output.strip() == f"nvdash: error: history file {tmp_path / 'none.sqlite'} does not exist"
