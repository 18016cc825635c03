"""The sampler is shared: ten viewers on every dashboard cost NVML what one viewer costs."""

from __future__ import annotations

import time

from bokeh.client import ClientSession

from tests.conftest import NvdashServer, nvdash_server
from tests.server.bokeh_viewer import open_session
from tests.server.test_server import ROUTES

WINDOW_S = 4.0


def _calls_per_second(server: NvdashServer, sessions: list[ClientSession]) -> float:
    start = server.health()
    started = time.monotonic()
    while time.monotonic() - started < WINDOW_S:
        for session in sessions:
            session.force_roundtrip()
        time.sleep(0.2)
    end = server.health()
    elapsed = time.monotonic() - started
    return (end["fake_nvml_calls"] - start["fake_nvml_calls"]) / elapsed


def test_ten_viewers_cost_the_same_nvml_calls_as_one() -> None:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25"]) as server:
        time.sleep(1.0)
        idle = _calls_per_second(server, [])
        one = [open_session(server.url, route) for route in ROUTES]
        try:
            single = _calls_per_second(server, one)
            ten = one + [open_session(server.url, route) for _ in range(9) for route in ROUTES]
            try:
                assert server.health()["sessions"] == 70
                many = _calls_per_second(server, ten)
            finally:
                for session in ten[len(one) :]:
                    session.close()
        finally:
            for session in one:
                session.close()
    assert idle > 0
    assert abs(single - idle) / idle < 0.1, (idle, single)
    assert abs(many - single) / single < 0.1, (single, many)
