"""What each view does with stale readings: the hang_host fault, the dashboards' banner, the index, /metrics,
and the stuck parts /health names (none for a replay)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bokeh.document import Document
from bokeh.models import Column
from bokeh.models.widgets import Div
from prometheus_client import CollectorRegistry

from nvdash.apps.context import AppContext
from nvdash.apps.stale_banner import STALE_BANNER_NAME, add_stale_banner
from nvdash.freshness import Stale, banner_text
from nvdash.metrics.collector import ExportOptions, StoreCollector
from nvdash.metrics.counters import parse_counters
from nvdash.metrics.exposition import text_format
from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.fake.faults import Fault, parse_faults
from nvdash.sampling.fake.host import HangingHost
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.records import GpuSample, HostInfo, HostSample, Snapshot
from nvdash.sampling.usage_records import Usage
from nvdash.server.app import Runtime, stuck_parts
from nvdash.server.pages import render_index
from nvdash.store import Store
from tests.unit.test_apps_health import INVENTORY
from tests.unit.test_metrics import COUNTERS, families

FUNCTIONS = FakeNvmlLibrary("a100-pcie-2").function_names()


def test_the_hang_host_fault_is_parsed_with_its_path_and_time() -> None:
    assert parse_faults("hang_host:/tmp/x y/hold@2.5", FUNCTIONS, 2) == [
        Fault("hang_host", path="/tmp/x y/hold", at_s=2.5)]
    with pytest.raises(ValueError, match=r"bad NVML fault 'hang_host:'.*the file that holds the hang"):
        parse_faults("hang_host:", FUNCTIONS, 2)


class Host:
    def __init__(self) -> None:
        self.reads = 0

    def info(self) -> HostInfo:
        return HostInfo("h", 1, 1)

    def read(self) -> HostSample:
        self.reads += 1
        return HostSample(cpu_pct=1.0)


def test_a_hung_host_reading_waits_while_the_file_exists() -> None:
    looked: list[str] = []
    answers = iter([True, True, True, False])

    def exists(path: str) -> bool:
        looked.append(path)
        return next(answers)

    host = Host()
    hanging = HangingHost(host, [Fault("hang_host", path="/hold", at_s=5.0)], created_at=100.0,
                          clock=lambda: now, exists=exists)
    now = 104.0
    assert hanging.read().cpu_pct == 1.0
    assert looked == [], "not due yet"
    now = 105.0
    assert hanging.read().cpu_pct == 1.0
    assert looked == ["/hold"] * 4
    assert host.reads == 2
    assert hanging.info() == HostInfo("h", 1, 1)


def test_open_hardware_wraps_the_host_of_a_simulation_with_a_hang(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hardware = open_hardware("a100-pcie-2", faults=f"hang_host:{hold}")
    try:
        assert isinstance(hardware.host, HangingHost)
        assert hardware.host.read().cpu_pct is None  # the file is absent: no hang
    finally:
        hardware.close()


def _store(*times: float) -> Store:
    store = Store(INVENTORY, capacity=10)
    for time_s in times:
        store.append(Snapshot(time_s, (GpuSample(0, utilization_pct=87.0),), HostSample(),
                              usage=Usage(time_s=time_s - 2.0)))
    return store


def _page(ctx: AppContext) -> Document:
    doc = Document()
    doc.add_root(Column(children=[Div(text="the dashboard")]))
    return doc


def test_the_banner_shows_while_readings_are_stale_and_goes_when_they_resume() -> None:
    now = [1000.5]
    store = _store(1000.0)
    ctx = AppContext(store=store, interval_s=0.5, clock=lambda: now[0])
    doc = _page(ctx)
    banner = add_stale_banner(doc, ctx)
    assert banner is not None
    root = doc.roots[0]
    assert isinstance(root, Column)
    assert root.children[0] is banner.div
    assert banner.div.name == STALE_BANNER_NAME
    assert (banner.div.visible, banner.div.text) == (False, "")
    now[0] = 1005.1
    banner.check()
    assert (banner.div.visible, banner.div.text) == (True, banner_text(1000.0))
    store.append(Snapshot(1005.0, (), HostSample()))
    banner.check()
    assert (banner.div.visible, banner.div.text) == (False, "")


def test_a_replay_page_gets_no_banner() -> None:
    ctx = AppContext(store=_store(1000.0), interval_s=0.5, clock=lambda: 9e9, replay=True)
    doc = _page(ctx)
    assert add_stale_banner(doc, ctx) is None
    assert doc.select_one({"name": STALE_BANNER_NAME}) is None


def test_the_index_says_since_when_readings_stopped() -> None:
    fresh = render_index(INVENTORY, "", 0.5, 100, "")
    stale = render_index(INVENTORY, "", 0.5, 100, "", stale_since=1000.0)
    assert "no new readings" not in fresh
    assert f"{banner_text(1000.0)}: the values below are not live." in stale


def _scrape(store: Store, now: float, stale_after_s: float | None) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    options = ExportOptions(hostname="n1", stale_after_s=stale_after_s)
    registry.register(StoreCollector(store, parse_counters(COUNTERS), options, clock=lambda: now))
    return families(text_format(registry.collect()).decode())


def test_metrics_leave_out_gpu_readings_older_than_the_bound_and_say_when_the_newest_were_taken() -> None:
    store = _store(1000.0)
    fresh = _scrape(store, 1001.5, 1.5)
    assert [value for _, value in fresh["DCGM_FI_DEV_GPU_UTIL"]] == [87.0]
    assert fresh["nvdash_last_sample_timestamp_seconds"] == [({"Hostname": "n1"}, 1000.0)]
    assert fresh["nvdash_last_process_sample_timestamp_seconds"] == [({"Hostname": "n1"}, 998.0)]
    stale = _scrape(store, 1001.6, 1.5)
    assert all(not samples for name, samples in stale.items() if name.startswith("DCGM_"))
    assert stale["nvdash_last_sample_timestamp_seconds"] == [({"Hostname": "n1"}, 1000.0)]
    unbounded = _scrape(store, 9e9, None)  # a replay: the recording's readings, and no timestamps
    assert [value for _, value in unbounded["DCGM_FI_DEV_GPU_UTIL"]] == [87.0]
    assert "nvdash_last_sample_timestamp_seconds" not in unbounded


def test_a_replay_is_never_stuck_and_a_live_servers_parts_are_named() -> None:
    assert stuck_parts(Runtime(store=_store(1000.0), sampler=None)) == []

    class Held:
        def stale(self) -> list[Stale]:
            return [Stale("processes", 10.0), Stale("sampler", 20.0)]

    runtime = Runtime(store=_store(1000.0), sampler=Held())  # type: ignore[arg-type]
    assert stuck_parts(runtime) == [Stale("processes", 10.0), Stale("sampler", 20.0)]
