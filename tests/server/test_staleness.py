"""A real server whose sampler sticks says so everywhere, and recovers when it resumes.

The simulation's ``hang_host:PATH`` fault holds the host reading (on the sampler's own thread) while ``PATH`` exists.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bokeh.client import ClientSession, pull_session
from prometheus_client.parser import text_string_to_metric_families

from nvdash.apps.stale_banner import STALE_BANNER_NAME
from tests.conftest import http_get, nvdash_server, wait_for

TOKEN = "s3cret-token"
ARGS = ["--simulate", "a100-pcie-2", "--interval", "0.25", "--token", TOKEN, "--no-history"]


def _get(url: str, token: bool) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")


def _health(base: str, token: bool) -> tuple[int, Any]:
    status, body = _get(base + "/health", token)
    return status, json.loads(body)


def _metrics(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, body = _get(base + "/metrics", token=True)
    assert status == 200, body
    return {family.name: [(sample.labels, sample.value) for sample in family.samples]
            for family in text_string_to_metric_families(body)}


class BannerWatcher(threading.Thread):
    """A viewer of a dashboard in a thread of its own, applying the server's updates and noting the banner's state
    (visible, text) after each; ``None`` until the page has arrived, or when it has no banner."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="banner-watcher")
        self._url = url
        self._stop_requested = threading.Event()
        self._loop: Any = None
        self.state: tuple[bool, str] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            session = pull_session(url=self._url, arguments={"token": TOKEN})
        except BaseException as error:  # reported to the test through .error
            self.error = error
            return
        self._loop = session._connection._loop
        try:
            while not self._stop_requested.is_set():
                end = time.monotonic() + 5.0
                session._connection._loop_until(lambda end=end: self._note(session, end))
        finally:
            session.close()

    def _note(self, session: ClientSession, end: float) -> bool:
        div = session.document.select_one({"name": STALE_BANNER_NAME})
        self.state = None if div is None else (bool(div.visible), str(div.text))
        return self._stop_requested.is_set() or time.monotonic() >= end

    def stop(self) -> None:
        self._stop_requested.set()
        loop = self._loop
        if loop is not None:
            loop.add_callback(loop.stop)
        self.join(30)


def test_a_stuck_sampler_is_stale_everywhere_and_recovers(tmp_path: Path) -> None:
    hold = tmp_path / "hold-the-sampler"
    with nvdash_server(ARGS, env={"NVDASH_FAKE_FAULTS": f"hang_host:{hold}"}) as server:
        base = server.url
        wait_for(lambda: _health(base, token=True), lambda answer: answer[1]["sampler"]["sweeps"] > 3)
        assert _health(base, token=False) == (200, {"status": "ok"})
        viewer = BannerWatcher(base + "/GPU-Utilization")
        viewer.start()
        try:
            assert wait_for(lambda: viewer.error or viewer.state, bool) == (False, ""), "the banner is hidden"

            hold.touch()
            status, brief = wait_for(lambda: _health(base, token=False), lambda answer: answer[0] == 503)
            assert brief["status"] == "stale"
            assert "sampler" in brief["stuck"]
            assert set(brief) == {"status", "stuck"}, "without the token: the status and the stuck parts only"

            status, full = _health(base, token=True)
            assert status == 503
            assert full["status"] == "stale"
            sampler = next(item for item in full["stuck"] if item["part"] == "sampler")
            since = full["sampler"]["last_sweep_at"]
            assert sampler["since_epoch"] == since
            assert sampler["since"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
            wanted = f"no new readings since {time.strftime('%H:%M:%S', time.localtime(since))}"

            found = _metrics(base)
            assert found["nvdash_last_sample_timestamp_seconds"] == [({"Hostname": socket.gethostname()}, since)]
            frozen = {name: samples for name, samples in found.items() if name.startswith("DCGM_") and samples}
            assert frozen == {}, "frozen GPU readings are not exported"

            status, page = _get(base + "/", token=True)
            assert status == 200
            assert wanted in page

            assert wait_for(lambda: viewer.state, lambda banner: banner is not None and banner[0]) == (True, wanted)

            hold.unlink()
            wait_for(lambda: _health(base, token=False), lambda answer: answer == (200, {"status": "ok"}))
            status, full = _health(base, token=True)
            assert (status, full["status"], full["stuck"]) == (200, "ok", [])
            # The sweep that was held began before the hold: its readings are old, the next ones are exported.
            found = wait_for(lambda: _metrics(base), lambda found: found["DCGM_FI_DEV_GPU_UTIL"])
            assert [labels["gpu"] for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"]] == ["0", "1"]
            assert found["nvdash_last_sample_timestamp_seconds"][0][1] > since
            assert "no new readings" not in _get(base + "/", token=True)[1]
            assert wait_for(lambda: viewer.state, lambda banner: banner is not None and not banner[0]) == (False, "")
        finally:
            viewer.stop()
        assert http_get(base + "/health")[0] == 200
