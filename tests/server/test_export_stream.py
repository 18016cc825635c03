"""``/export.csv`` on a real server with a week of history: exports stream in turn on their own thread, so a
page's query is answered while four big exports run, and each export arrives whole and exactly as
``nvdash export`` writes it; odd input to the history APIs is a 400 with one line, never a 500."""

from __future__ import annotations

import http.client
import json
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, get_json, nvdash_env, stop_process, wait_for
from tests.history_week import WEEK_S, write_week

END_S = 1_790_000_000.0
EXPORTS = 4
TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("week") / "week.sqlite"
    write_week(path, END_S)
    return path


@contextmanager
def replay(path: Path) -> Iterator[str]:
    """``nvdash replay PATH`` on a free port; yields its URL once it answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "nvdash", "replay", str(path), "--port", str(port)],
                               env=nvdash_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _try(url + "/health"), lambda health: health is not None, timeout_s=60.0)
        yield url
    finally:
        stop_process(process)


def _try(url: str) -> Any:
    try:
        return get_json(url)
    except (OSError, AssertionError):
        return None


def _get(port: int, target: str, started: threading.Event | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        if started is not None:
            started.set()
        body = response.read()
        return response.status, dict(response.getheaders()), body
    finally:
        connection.close()


def test_a_page_query_is_answered_while_four_big_exports_run_and_each_export_is_whole(week: Path) -> None:
    start, end = END_S - WEEK_S, END_S
    expected = subprocess.run([sys.executable, "-m", "nvdash", "export", "--history", str(week), "--from", str(start),
                               "--to", str(end)], env=nvdash_env(), capture_output=True, text=True, check=True,
                              timeout=TIMEOUT_S).stdout
    assert expected.count("\n") > 70_000
    with replay(week) as url:
        port = int(url.rsplit(":", 1)[1])
        finished: list[str] = []
        lock = threading.Lock()
        results: dict[int, tuple[int, dict[str, str], bytes]] = {}
        first_started = threading.Event()

        def export(number: int) -> None:
            results[number] = _get(port, f"/export.csv?from={start}&to={end}",
                                   first_started if number == 0 else None)
            with lock:
                finished.append(f"export {number}")

        threads = [threading.Thread(target=export, args=(n,), daemon=True) for n in range(EXPORTS)]
        threads[0].start()
        assert first_started.wait(TIMEOUT_S), "the first export never answered"
        for thread in threads[1:]:
            thread.start()
        status, _, body = _get(port, "/api/history.json?metric=utilization_pct&range=1h")
        with lock:
            finished.append("query")
        assert status == 200
        assert len(json.loads(body)["series"]) == 8
        for thread in threads:
            thread.join(TIMEOUT_S)
        assert finished[0] == "query", finished
        assert sorted(finished) == sorted(["query", *(f"export {n}" for n in range(EXPORTS))])
        for number in range(EXPORTS):
            status, headers, body = results[number]
            assert status == 200
            assert headers["Content-Type"].startswith("text/csv")
            text = body.decode()
            assert text.count("\n") == expected.count("\n")
            assert text == expected


def test_exports_past_the_line_are_turned_away_with_retry_after(week: Path) -> None:
    """Nine exports may run or wait (one at a time, eight in line); more at once are a 503 with Retry-After."""
    with replay(week) as url:
        port = int(url.rsplit(":", 1)[1])
        statuses: list[tuple[int, dict[str, str], bytes]] = []
        lock = threading.Lock()

        def export() -> None:
            result = _get(port, "/export.csv?range=7d")
            with lock:
                statuses.append(result)

        threads = [threading.Thread(target=export, daemon=True) for _ in range(14)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT_S)
        refused = [result for result in statuses if result[0] == 503]
        served = [result for result in statuses if result[0] == 200]
        assert len(statuses) == 14
        assert len(served) >= 9
        assert refused, "fourteen exports at once were all admitted"
        assert len(served) + len(refused) == 14
        for _, headers, body in refused:
            assert headers["Retry-After"] == "10"
            assert body.decode().count("\n") == 1
            assert "exports are running or waiting" in body.decode()
        lengths = {len(body) for _, _, body in served}
        assert len(lengths) == 1


ODD_QUERIES = {
    "from=1&to=-inf": "is not a time",
    "from=nan": "is not a time",
    "from=1e400": "is not a time",
    "range=" + "9" * 400 + "d": "longer than all time",
    "gpu=" + "9" * 40: "gpu indices run from 0 to 1023",
    "gpu=-1": "gpu indices run from 0 to 1023",
    "gpu=" + ",".join(["0"] * 2000): "at most 1024",
    "from=99999999999999999999999999": "out of range",
    "range=1h&from=1": "not both",
}


def test_odd_input_is_a_400_with_one_line_on_both_apis(week: Path) -> None:
    with replay(week) as url:
        port = int(url.rsplit(":", 1)[1])
        for query, message in ODD_QUERIES.items():
            status, _, body = _get(port, f"/api/history.json?metric=power_w&{query}")
            assert status == 400, (query, body[:200])
            error = json.loads(body)["error"]
            assert message in error, (query, error)
            assert "\n" not in error
            status, _, body = _get(port, f"/export.csv?{query}")
            assert status == 400, (query, body[:200])
            assert message in body.decode(), (query, body[:200])
            assert body.decode().count("\n") == 1
        fields = ",".join(["timestamp"] * 5000)
        status, _, body = _get(port, f"/export.csv?range=1h&query-gpu={fields}")
        assert status == 400
        assert "5000 fields named" in body.decode()
        status, _, _ = _get(port, "/api/history.json?metric=power_w&range=1h&step=nan")
        assert status == 400


def test_an_export_that_fails_midway_is_cut_off_not_passed_off_as_whole(week: Path, tmp_path: Path) -> None:
    """A value nvdash refuses (over 16 MiB) 20,000 readings in: the answer has begun, so the connection ends
    without the last chunk (the client sees an incomplete body) and the server logs one line."""
    crafted = tmp_path / "midway.sqlite"
    shutil.copyfile(week, crafted)
    connection = sqlite3.connect(crafted, isolation_level=None)
    try:
        moment = connection.execute("SELECT t FROM gpu_raw ORDER BY t LIMIT 1 OFFSET 20000").fetchone()[0]
        connection.execute("UPDATE gpu_raw SET utilization_pct = zeroblob(20000000) WHERE t = ? AND gpu = 0",
                           (moment,))
    finally:
        connection.close()
    with replay(crafted) as url:
        port = int(url.rsplit(":", 1)[1])
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        try:
            client.request("GET", "/export.csv?range=7d")
            response = client.getresponse()
            assert response.status == 200
            with pytest.raises(http.client.IncompleteRead):
                response.read()
        finally:
            client.close()
        status, _, _ = _get(port, "/api/history.json?metric=power_w&range=1h")
        assert status == 200
