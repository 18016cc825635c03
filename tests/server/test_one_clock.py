"""A real ``nvdash replay`` of an old recording: the index page, ``/api/snapshot.json`` and GPU Health judge it at
the recording's end (the server's one clock), not at today's wall time, and so reach the same verdict."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nvdash.apps.stale_banner import STALE_BANNER_NAME
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, Snapshot
from tests.conftest import free_port, get_json, http_get, nvdash_env, stop_process, wait_for
from tests.history_week import dgx_inventory
from tests.server.bokeh_viewer import open_session

END_S = time.time() - 30 * 86_400.0
"""The recording ended a month ago; an XID 79 came to GPU 3 twenty seconds before its end."""
XID_GPU = 3


def _record(path: Path) -> None:
    inventory = dgx_inventory()
    writer = HistoryWriter(path, inventory, "simulated:dgx-h100", 1.0, clock=lambda: END_S)
    writer.open()
    try:
        for n in range(60):
            gpus = tuple(GpuSample(index=gpu.index, utilization_pct=50.0, temperature_c=45.0, power_w=300.0)
                         for gpu in inventory.gpus)
            writer.submit(Snapshot(time_s=END_S - 59 + n, gpus=gpus, host=HostSample(cpu_pct=10.0)))
        writer.submit_events([GpuEvent(END_S - 20.0, XID_GPU, "xid", "XID 79", "critical", code=79)])
        writer.flush()
    finally:
        writer.stop()


def _answer(url: str) -> Any:
    try:
        return get_json(url)
    except (OSError, AssertionError):
        return None


def test_a_replay_of_an_old_recording_is_judged_at_its_end_by_every_view(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    _record(path)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "nvdash", "replay", str(path), "--port", str(port)],
                               env=nvdash_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answer(url + "/health"), lambda answer: answer is not None, timeout_s=60.0)
        expected = ["critical" if index == XID_GPU else "ok" for index in range(8)]

        snapshot = get_json(url + "/api/snapshot.json")
        assert [gpu["health"]["status"] for gpu in snapshot["gpus"]] == expected
        assert "XID 79" in snapshot["gpus"][XID_GPU]["health"]["reasons"][0]["text"]

        status, page, _ = http_get(url + "/")
        assert status == 200
        assert re.findall(r'<span class="health (\w+)">', page) == expected
        assert "no new readings" not in page, "a replay is not stale, however old"

        session = open_session(url, "/GPU-Health")
        try:
            text = session.document.select_one({"name": "status"}).text
            assert re.findall(r'<tr data-status="(\w+)">', text) == expected
            assert session.document.select_one({"name": STALE_BANNER_NAME}) is None
        finally:
            session.close()
    finally:
        stop_process(process)
