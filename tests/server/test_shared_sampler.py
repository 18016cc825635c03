"""The sampler is shared: ten viewers on every dashboard cost NVML what one viewer costs."""

from __future__ import annotations

import time

from tests.conftest import NvdashServer, nvdash_server
from tests.server.bokeh_viewer import Viewer, stop_all
from tests.server.test_server import ROUTES

WINDOW_S = 5.0


def _calls_per_second(server: NvdashServer) -> float:
    start = server.health()
    started = time.monotonic()
    time.sleep(WINDOW_S)
    end = server.health()
    return (end["fake_nvml_calls"] - start["fake_nvml_calls"]) / (time.monotonic() - started)


def _connect(server: NvdashServer, viewers: int) -> list[Viewer]:
    threads = [Viewer(server.url, route) for _ in range(viewers) for route in ROUTES]
    for thread in threads:
        thread.start()
    for thread in threads:
        assert thread.ready.wait(120), "a viewer did not connect"  # 110 sessions on a loaded 2-core machine
        assert thread.error is None, thread.error
    return threads


def test_ten_viewers_cost_the_same_nvml_calls_as_one() -> None:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25"]) as server:
        time.sleep(1.0)
        idle = _calls_per_second(server)
        one = _connect(server, 1)
        try:
            assert server.health()["sessions"] == len(ROUTES)
            single = _calls_per_second(server)
            nine = _connect(server, 9)
            try:
                assert server.health()["sessions"] == 10 * len(ROUTES)
                many = _calls_per_second(server)
            finally:
                stop_all(nine)
        finally:
            stop_all(one)
    assert idle > 0
    assert abs(single - idle) / idle < 0.1, (idle, single)
    assert abs(many - single) / single < 0.1, (single, many)
