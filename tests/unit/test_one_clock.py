"""One clock for "now": the index page, ``/api/snapshot.json`` and GPU Health judge the same state at the same
moment, the server's injected clock, and so reach the same verdict."""

from __future__ import annotations

import re

from nvdash.apps.context import AppContext
from nvdash.apps.gpu_health import HealthView
from nvdash.apps.stale_banner import StaleBanner
from nvdash.freshness import Stale
from nvdash.health.status import RECENT_S
from nvdash.sampling.records import GpuEvent, HostSample, Snapshot
from nvdash.server.app import Runtime, index_verdict
from nvdash.server.pages import render_index
from nvdash.server.snapshot import snapshot_json
from nvdash.store import Store
from tests.unit.test_apps_health import INVENTORY, h100

T = 1_000.0
"""When the newest reading was taken; an XID 79 on GPU 0 came 5 s before it."""
INTERVAL_S = 1.0


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class LiveSampler:
    """A live server's sampler (the index judges staleness only for one); it reports no part stuck."""

    def stale(self) -> list[Stale]:
        return []


def _store() -> Store:
    store = Store(INVENTORY, capacity=10)
    store.append(Snapshot(T, (h100(T),), HostSample()))
    store.add_events([GpuEvent(T - 5.0, 0, "xid", "XID 79", "critical", code=79)])
    return store


def _verdicts(store: Store, runtime: Runtime, view: HealthView) -> dict[str, list[str]]:
    """Each GPU's status as the index page, the snapshot API and GPU Health show it."""
    health, stale = index_verdict(runtime, INTERVAL_S)
    page = render_index(INVENTORY, "", INTERVAL_S, 10, "t4", health=health, stale_since=stale)
    view.poll()
    return {
        "index": re.findall(r'<span class="health (\w+)">', page),
        "snapshot": [gpu["health"]["status"] for gpu in snapshot_json(store, runtime.clock)["gpus"]],
        "gpu_health": re.findall(r'<tr data-status="(\w+)">', view.status.text),
    }


def test_a_recent_xid_is_critical_on_all_three_and_ages_out_of_all_three_together() -> None:
    store, clock = _store(), Clock(T + 1.0)
    runtime = Runtime(store=store, sampler=LiveSampler(), clock=clock)  # type: ignore[arg-type]
    view = HealthView(store, dark=False, interval_s=INTERVAL_S, clock=runtime.clock)
    critical = ["critical", "ok", "ok"]
    assert _verdicts(store, runtime, view) == {"index": critical, "snapshot": critical, "gpu_health": critical}

    # No reading arrives any more (a stuck sampler) while the clock moves past the XID's window: the open GPU
    # Health page judges again without a new reading and agrees with the index page and the snapshot API.
    clock.now_s = T + RECENT_S + 60.0
    fine = ["ok", "ok", "ok"]
    assert _verdicts(store, runtime, view) == {"index": fine, "snapshot": fine, "gpu_health": fine}


def test_stale_readings_are_stale_on_the_index_and_on_the_dashboards_at_the_same_moment() -> None:
    store, clock = _store(), Clock(T + 2.0)
    runtime = Runtime(store=store, sampler=LiveSampler(), clock=clock)  # type: ignore[arg-type]
    banner = StaleBanner(AppContext(store=store, interval_s=INTERVAL_S, clock=runtime.clock))
    banner.check()
    assert (index_verdict(runtime, INTERVAL_S)[1], banner.div.visible) == (None, False)
    clock.now_s = T + 60.0
    banner.check()
    assert (index_verdict(runtime, INTERVAL_S)[1], banner.div.visible) == (T, True)


def test_a_replay_is_judged_at_its_recordings_end_not_at_the_wall_clock() -> None:
    store = _store()
    runtime = Runtime(store=store, sampler=None, clock=lambda: T)
    view = HealthView(store, dark=False, interval_s=INTERVAL_S, clock=runtime.clock)
    critical = ["critical", "ok", "ok"]
    assert _verdicts(store, runtime, view) == {"index": critical, "snapshot": critical, "gpu_health": critical}
    assert index_verdict(runtime, INTERVAL_S)[1] is None, "a replay is never stale"
