"""``/api/accounting.json`` and ``.csv`` on a real server: a job-mapping directory's job is charged its GPU's time,
in the history file and, with ``--no-history``, from memory; bad requests are one-line 400s."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.conftest import get_json, http_get, nvdash_server, wait_for


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
