"""The sampler is shared: ten viewers on every dashboard cost NVML what one viewer costs, per sweep.

NVML calls are counted per entry point by the simulated library and compared with the sampler's own schedule:
every GPU read once per sweep, its health counters at most once per ``SLOW_INTERVAL_S``, one XID wait per
``WAIT_TIMEOUT_MS``. Counting per sweep made (not per wall-clock second) keeps the comparison exact on a loaded
machine, where sweeps may come late.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.nvml_read import SLOW_INTERVAL_S
from nvdash.sampling.nvml_source import NvmlSource, install_library
from nvdash.sampling.xid_watcher import WAIT_TIMEOUT_MS
from tests.conftest import NvdashServer, get_json, nvdash_server, wait_for
from tests.server.bokeh_viewer import Viewer, stop_all
from tests.server.test_server import ROUTES

PROFILE = "dgx-h100"
SWEEPS = 20
"""Sweeps per measured window."""
XID_WAIT = "nvmlEventSetWait_v2"
# --process-interval 3600: the GPU processes are read at the first sweep only (and carried in every snapshot), so
# no process read falls into a measured window.
SERVER_ARGS = ["--simulate", PROFILE, "--interval", "0.25", "--process-interval", "3600"]


@dataclass(frozen=True)
class Costs:
    """NVML calls per entry point of one read of every GPU, measured through the same code on the same profile."""

    sweep: Counter[str]
    """What every sweep calls."""
    health_counters: Counter[str]
    """What the first sweep calls besides: the health counters (read again every ``SLOW_INTERVAL_S``) and the
    one-time set-up of GPM sample buffers."""


def _calls(fake: FakeNvmlLibrary, action: Callable[[], object]) -> Counter[str]:
    before = Counter(fake.call_counts())
    action()
    return Counter(fake.call_counts()) - before


def _costs() -> Costs:
    fake = FakeNvmlLibrary(PROFILE, latency_scale=0.0)
    restore = install_library(pynvml, fake)
    source = NvmlSource(pynvml, slow_interval_s=math.inf)  # the health counters at the first read only
    try:
        source.open()
        first = _calls(fake, lambda: source.read(30.0))
        later = _calls(fake, lambda: source.read(30.0))
    finally:
        source.close()
        restore()
    return Costs(sweep=later, health_counters=first - later)


@dataclass(frozen=True)
class Window:
    """What the server did between two readings of its health."""

    sweeps: int
    seconds: float
    """At least the time between the server's two readings (measured around both requests)."""
    calls: Counter[str]
    skipped: int
    """GPU reads the sampler left out of a sweep (an earlier read of that GPU still running on a loaded machine)."""


def _window(server: NvdashServer) -> Window:
    started = time.monotonic()
    def counts() -> Any:
        return get_json(server.url + "/api/simulation.json")

    first = counts()
    last = wait_for(counts, lambda h: h["sampler"]["sweeps"] >= first["sampler"]["sweeps"] + SWEEPS, timeout_s=120.0)
    seconds = time.monotonic() - started
    calls = Counter(last["fake_nvml_call_counts"])
    calls.subtract(first["fake_nvml_call_counts"])
    skipped = last["sampler"]["skipped_device_reads"] - first["sampler"]["skipped_device_reads"]
    return Window(last["sampler"]["sweeps"] - first["sampler"]["sweeps"], seconds, +calls, skipped)


def _assert_only_the_samplers_calls(window: Window, costs: Costs) -> None:
    """Each entry point of a sweep is called exactly as often as in the sweeps made (give or take the sweep under
    way at either reading); the health counters and XID waits no more often than their own cadence allows; no
    other entry point at all."""
    health_reads = math.floor(window.seconds / SLOW_INTERVAL_S) + 2  # begun in the window, plus one under way
    xid_waits = math.floor(window.seconds * 1000 / WAIT_TIMEOUT_MS) + 2
    assert window.sweeps >= SWEEPS
    for name in costs.sweep.keys() | costs.health_counters.keys() | window.calls.keys() | {XID_WAIT}:
        per_sweep = costs.sweep[name]
        # A GPU whose read of an earlier sweep is still running is not asked again (the sampler counts these); a
        # GPU left out costs a sweep at most part of its calls.
        lowest = per_sweep * (window.sweeps - 1 - window.skipped)
        highest = per_sweep * (window.sweeps + 1) + costs.health_counters[name] * health_reads
        if name == XID_WAIT:
            highest += xid_waits
        assert lowest <= window.calls[name] <= highest, (name, window, lowest, highest)


def _connect(server: NvdashServer, viewers: int) -> list[Viewer]:
    threads = [Viewer(server.url, route) for _ in range(viewers) for route in ROUTES]
    for thread in threads:
        thread.start()
    for thread in threads:
        assert thread.ready.wait(120), "a viewer did not connect"  # 110 sessions on a loaded 2-core machine
        assert thread.error is None, thread.error
    return threads


def test_ten_viewers_cost_the_same_nvml_calls_per_sweep_as_one() -> None:
    costs = _costs()
    assert sum(costs.sweep.values()) > 0
    assert sum(costs.health_counters.values()) > 0
    with nvdash_server(SERVER_ARGS) as server:
        wait_for(server.health, lambda h: h["sampler"]["sweeps"] >= 1)  # the start-up sweep reads the processes
        idle = _window(server)
        one = _connect(server, 1)
        try:
            assert server.health()["sessions"] == len(ROUTES)
            single = _window(server)
            nine = _connect(server, 9)
            try:
                assert server.health()["sessions"] == 10 * len(ROUTES)
                many = _window(server)
            finally:
                stop_all(nine)
        finally:
            stop_all(one)
    for window in (idle, single, many):
        _assert_only_the_samplers_calls(window, costs)
