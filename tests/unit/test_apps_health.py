"""GPU Health, GPU Details, GPU Topology and GPU Memory's reserved part, built on bare documents from known rows."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.models import ColumnDataSource, Plot
from bokeh.models.widgets import DataTable, Div, Select, Toggle

from nvdash.accounting.accountant import Accountant
from nvdash.accounting.report import AccountingBook
from nvdash.apps import (
    APPS,
    AppContext,
    Requirement,
    available_apps,
    gpu_details,
    gpu_health,
    gpu_memory,
    gpu_topology,
    unavailable_reason,
)
from nvdash.apps.gpu_topology import describe_code
from nvdash.health.clock_events import GPU_IDLE, HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, SW_POWER_CAP
from nvdash.sampling.records import (
    GpuEvent,
    GpuInfo,
    GpuSample,
    HostInfo,
    HostSample,
    Inventory,
    NvLinkSample,
    Snapshot,
)
from nvdash.store import Store
from tests.unit.test_apps import assert_floats, models, tick, values

GiB = 1024**3
NAN = math.nan

HOST = HostInfo(hostname="node", cpu_count=16, memory_total_bytes=64 * GiB)
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 80 * GiB, 5, 16, 63e9, 18, 450e9,
               pci_bus_id="00000000:18:00.0", nvlink_version="4.0", temperature_slowdown_c=87.0,
               temperature_shutdown_c=92.0, power_max_limit_w=700.0, clock_sm_max_mhz=1980.0,
               clock_memory_max_mhz=2619.0, ecc_enabled=True, memory_error_mechanism="row remapping",
               gpm_supported=True)
A100 = GpuInfo(1, "NVIDIA A100-SXM4-40GB", "GPU-1", 40 * GiB, 4, 16, 31.5e9, 12, 300e9,
               pci_bus_id="00000000:3B:00.0", temperature_slowdown_c=90.0, temperature_shutdown_c=95.0,
               clock_sm_max_mhz=1410.0, clock_memory_max_mhz=1215.0)
L4 = GpuInfo(2, "NVIDIA L4", "GPU-2", 24 * GiB, 4, 16, 31.5e9, 0, None, pci_bus_id="00000000:86:00.0")
TOPOLOGY = (("X", "NV12", "SYS"), ("NV12", "X", "PHB"), ("SYS", "PHB", "X"))
INVENTORY = Inventory(host=HOST, gpus=(H100, A100, L4), driver_version="550.54", topology=TOPOLOGY)

LINKS = tuple(NvLinkSample(link, active=True) for link in range(18))


def h100(time_s: float, **changes: Any) -> GpuSample:
    base = GpuSample(0, utilization_pct=90.0, memory_used_bytes=30 * GiB, memory_total_bytes=80 * GiB,
                     memory_reserved_bytes=GiB // 2, temperature_c=60.0 + time_s - 1000.0, memory_temperature_c=70.0,
                     power_w=500.0, power_limit_w=700.0, pstate=0, clock_sm_mhz=1980.0, clock_memory_mhz=2619.0,
                     clock_event_reasons=SW_POWER_CAP, ecc_uncorrected_volatile=0, remap_pending=False,
                     pcie_generation_current=5, pcie_width_current=16, nvlinks=LINKS, gpm_sm_active_pct=80.0,
                     gpm_sm_occupancy_pct=40.0, gpm_tensor_active_pct=55.0, gpm_dram_active_pct=30.0)
    return replace(base, **changes)


def a100(**changes: Any) -> GpuSample:
    base = GpuSample(1, utilization_pct=20.0, memory_used_bytes=10 * GiB, memory_total_bytes=40 * GiB,
                     temperature_c=50.0, power_w=100.0, power_limit_w=400.0, clock_sm_mhz=1410.0,
                     clock_memory_mhz=1215.0, clock_event_reasons=GPU_IDLE)
    return replace(base, **changes)


ROWS = (
    Snapshot(1000.0, (h100(1000.0), a100(), GpuSample(2, utilization_pct=5.0)), HostSample(cpu_pct=20.0)),
    Snapshot(1001.0, (h100(1001.0, clock_event_reasons=HW_THERMAL_SLOWDOWN | HW_SLOWDOWN), a100(power_w=None),
                      GpuSample(2)), HostSample(cpu_pct=20.0)),
    Snapshot(1002.0, (h100(1002.0, remap_pending=True, ecc_uncorrected_volatile=1, pcie_width_current=8),
                      a100(), GpuSample(2, lost=True)), HostSample(cpu_pct=20.0)),
)
EVENTS = [
    GpuEvent(900.0, 0, "throttle", "HW thermal throttling started at 88 °C", "warning"),
    GpuEvent(1001.5, 0, "xid", "Xid 48", "critical", 48),
    GpuEvent(1001.8, 2, "lost", "GPU lost: it stopped answering (fallen off the bus?)", "critical"),
]


def make_ctx(inventory: Inventory = INVENTORY, rows: tuple[Snapshot, ...] = ROWS,
             events: list[GpuEvent] | None = None, capacity: int = 100) -> AppContext:
    store = Store(inventory, capacity=capacity)
    for row in rows:
        store.append(row)
    store.add_events(EVENTS if events is None else events)
    return AppContext(store=store, interval_s=1.0, clock=newest_reading(store))


def newest_reading(store: Store) -> Callable[[], float]:
    """A clock that says "now" is the newest reading's time: readings that arrive as if in real time."""

    def now() -> float:
        latest = store.latest()
        return 0.0 if latest is None else latest.time_s

    return now


def div_texts(doc: Document) -> list[str]:
    return [div.text for div in models(doc, Div)]


def plots_by_title(doc: Document) -> dict[str, Plot]:
    return {str(getattr(plot.title, "text", "")): plot for plot in models(doc, Plot)}


def plain(html: str) -> str:
    """The words of an HTML fragment, tags and entities left out."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>|&#\d+;", " ", html)).strip()


# --- registry -------------------------------------------------------------------------------------------


def test_new_dashboards_are_registered_with_what_they_need() -> None:
    specs = {spec.route: spec for spec in APPS}
    assert (specs["/GPU-Health"].title, specs["/GPU-Health"].requires) == ("GPU Health", Requirement.GPU)
    assert (specs["/GPU-Details"].title, specs["/GPU-Details"].requires) == ("GPU Details", Requirement.GPU)
    assert (specs["/GPU-Topology"].title, specs["/GPU-Topology"].requires) == ("GPU Topology", Requirement.TOPOLOGY)


def test_topology_needs_two_gpus_and_nvmls_matrix() -> None:
    spec = next(spec for spec in APPS if spec.requires is Requirement.TOPOLOGY)
    assert unavailable_reason(spec, INVENTORY) is None
    assert unavailable_reason(spec, Inventory(host=HOST, gpus=(H100,), topology=(("X",),))) == (
        "This machine has a single GPU: there is no GPU-to-GPU topology to show.")
    assert unavailable_reason(spec, replace(INVENTORY, topology=())) == (
        "NVML did not say how the GPUs on this machine are connected.")
    assert unavailable_reason(spec, Inventory(host=HOST, nvml_error="no driver")) == (
        "No NVIDIA GPU was found: no driver.")
    assert "/GPU-Topology" not in [s.route for s in available_apps(replace(INVENTORY, topology=()))]


# --- GPU Health -----------------------------------------------------------------------------------------


def health_doc(ctx: AppContext) -> tuple[Document, Div, Div, ColumnDataSource]:
    doc = Document()
    gpu_health.build(doc, ctx)
    status, hints = doc.select_one({"name": "status"}), doc.select_one({"name": "hints"})
    assert isinstance(status, Div)
    assert isinstance(hints, Div)
    (table,) = models(doc, DataTable)
    source = table.source
    assert isinstance(source, ColumnDataSource)
    return doc, status, hints, source


def test_health_shows_each_gpus_status_with_its_reasons() -> None:
    doc, status, hints, _ = health_doc(make_ctx())
    assert doc.title == "GPU Health"
    assert re.findall(r'data-status="(\w+)"', status.text) == ["critical", "ok", "critical"]
    words = plain(status.text)
    assert "GPU 0 NVIDIA H100 80GB HBM3 00000000:18:00.0" in words
    assert "uncorrectable ECC error, row remapping pending: reset the GPU (drain the GPU and reset it)" in words
    assert "PCIe Gen5 x16 running at x8" in words
    assert "XID 48: uncorrectable double-bit ECC error in GPU memory, just now" in words
    assert "GPU 1 NVIDIA A100-SXM4-40GB 00000000:3B:00.0 no problem found" in words
    assert "GPU lost: it stopped answering" in words
    assert plain(hints.text) == "No bottleneck stands out in the recent readings."


def test_health_event_log_is_newest_first_with_the_xid_catalog() -> None:
    _, _, _, source = health_doc(make_ctx())
    assert values(source, "gpu") == ["GPU 2", "GPU 0", "GPU 0"]
    assert_floats(values(source, "time"), [1_001_800.0, 1_001_500.0, 900_000.0])
    assert values(source, "severity") == ["critical", "critical", "warning"]
    assert values(source, "kind") == ["lost", "xid", "throttle"]
    assert values(source, "message")[1] == "XID 48: uncorrectable double-bit ECC error in GPU memory"
    assert "reset the GPU" in values(source, "action")[1]
    assert values(source, "action")[2] == ""
    assert values(source, "color")[2] == "#e69500"


def test_health_event_log_orders_by_time_and_can_hide_info_events() -> None:
    events = [GpuEvent(10.0, 0, "throttle", "SW power cap throttling started", "info"),
              GpuEvent(30.0, 1, "ecc", "corrected ECC errors rose by 1 (now 1)", "warning"),
              GpuEvent(20.0, None, "xid", "Xid 13", "warning", 13)]  # the XID watcher's thread was late
    doc, _, _, source = health_doc(make_ctx(events=events))
    assert_floats(values(source, "time"), [30_000.0, 20_000.0, 10_000.0])
    assert values(source, "gpu") == ["GPU 1", "all", "GPU 0"]
    (hide,) = models(doc, Toggle)
    hide.active = True
    assert values(source, "kind") == ["ecc", "xid"]
    hide.active = False
    assert values(source, "kind") == ["ecc", "xid", "throttle"]
    assert gpu_health.event_columns(events, limit=1)["kind"] == ["ecc"]


def test_health_updates_live_from_the_store_and_only_when_something_is_new() -> None:
    ctx = make_ctx()
    doc, status, _, source = health_doc(ctx)
    assert tick(doc) == []
    ctx.store.append(Snapshot(1003.0, (h100(1003.0, temperature_c=60.0), a100(), GpuSample(2, utilization_pct=1.0)),
                              HostSample(cpu_pct=20.0)))
    tick(doc)
    assert re.findall(r'data-status="(\w+)"', status.text) == ["critical", "ok", "ok"]
    assert "PCIe" not in plain(status.text)
    assert len(values(source, "kind")) == 3

    ctx.store.add_events([GpuEvent(1003.5, 1, "xid", "Xid 79", "critical", 79)])
    tick(doc)
    assert values(source, "message")[0] == "XID 79: GPU fell off the bus"
    assert re.findall(r'data-status="(\w+)"', status.text) == ["critical", "critical", "ok"]
    assert "XID 79: GPU fell off the bus, just now" in plain(status.text)


def test_health_status_strip_backfills_each_rows_status_and_streams_new_rows() -> None:
    ctx = make_ctx(capacity=3)
    doc, _, _, table = health_doc(ctx)
    (strip,) = [source for source in models(doc, ColumnDataSource) if source is not table]
    assert_floats(strip.data["time"], [1_000_000.0, 1_001_000.0, 1_002_000.0])
    # GPU 0: fine, then HW thermal slowdown (warning), then remap pending (critical); GPU 2 lost at the end.
    assert_floats(strip.data["status/0"], [0.0, 1.0, 2.0])
    assert_floats(strip.data["status/1"], [0.0, 0.0, 0.0])
    assert_floats(strip.data["status/2"], [0.0, 0.0, 2.0])
    ctx.store.append(Snapshot(1003.0, (h100(1003.0), a100()), HostSample()))
    streamed = [event for event in tick(doc) if isinstance(event, ColumnsStreamedEvent)]
    assert len(streamed) == 1
    assert streamed[0].rollover == 3
    assert_floats(strip.data["status/0"], [1.0, 2.0, 0.0])
    assert_floats(strip.data["status/2"], [0.0, 2.0, NAN])


def test_health_hints_carry_their_evidence() -> None:
    starved = tuple(Snapshot(2000.0 + t, (h100(2000.0, utilization_pct=5.0, temperature_c=50.0),
                                          a100(utilization_pct=5.0), GpuSample(2)), HostSample(cpu_pct=98.0))
                    for t in range(30))
    _, _, hints, _ = health_doc(make_ctx(rows=starved, events=[]))
    words = plain(hints.text)
    assert words.startswith("GPU 0, GPU 1 are mostly idle while the host CPU is saturated")
    assert "the host CPU averaged 98 % busy; GPU 0 5 % busy holding 30.0 GiB" in words


def test_health_without_gpus_or_rows_says_so() -> None:
    _, status, _, source = health_doc(make_ctx(inventory=Inventory(host=HOST, nvml_error="no driver"), rows=(),
                                               events=[]))
    assert plain(status.text) == "No NVIDIA GPU was found: no driver"
    assert values(source, "kind") == []
    _, empty, _, _ = health_doc(make_ctx(rows=(), events=[]))
    assert re.findall(r'data-status="(\w+)"', empty.text) == ["ok", "ok", "ok"]


def test_health_escapes_text_from_the_driver() -> None:
    rows = (Snapshot(1.0, (GpuSample(0, error="<script>x</script>"),), HostSample()),)
    _, status, _, _ = health_doc(make_ctx(rows=rows, events=[]))
    assert "<script>" not in status.text
    assert "&lt;script&gt;" in status.text


def test_health_flags_an_allocation_idle_for_long_enough_and_follows_it_live(tmp_path: Path) -> None:
    (tmp_path / "1").write_text("555\n")  # Slurm job 555 holds GPU 1 and runs nothing on it
    store = Store(INVENTORY, capacity=100)
    accountant = Accountant({info.index: info.uuid for info in INVENTORY.gpus}, job_mapping_dir=tmp_path,
                            idle_after_s=1.0)
    store.add_listener(accountant)
    for row in ROWS:
        store.append(row)
    store.add_events(EVENTS)
    ctx = AppContext(store=store, interval_s=1.0, accounting=AccountingBook(accountant), clock=newest_reading(store))
    doc, status, _, _ = health_doc(ctx)
    assert re.findall(r'data-status="(\w+)"', status.text) == ["critical", "warning", "critical"]
    assert "allocated but idle for 2 s: Slurm job 555, no process (end the job or release the GPU)" in plain(
        status.text)
    store.append(Snapshot(1003.0, (h100(1003.0), a100(), GpuSample(2, utilization_pct=1.0)), HostSample()))
    tick(doc)
    assert "allocated but idle for 3 s: Slurm job 555, no process" in plain(status.text)
    # Without the accounting (or with nothing idle) GPU 1 is OK.
    _, plain_status, _, _ = health_doc(make_ctx())
    assert "allocated but idle" not in plain(plain_status.text)


# --- GPU Details ----------------------------------------------------------------------------------------


def details_doc(ctx: AppContext) -> tuple[Document, ColumnDataSource]:
    doc = Document()
    gpu_details.build(doc, ctx)
    (source,) = models(doc, ColumnDataSource)
    return doc, source


def test_details_backfills_the_first_gpu_against_its_limits() -> None:
    doc, source = details_doc(make_ctx())
    assert doc.title == "GPU Details"
    assert_floats(source.data["time"], [1_000_000.0, 1_001_000.0, 1_002_000.0])
    assert_floats(source.data["temp"], [60.0, 61.0, 62.0])
    assert_floats(source.data["slowdown"], [87.0] * 3)
    assert_floats(source.data["shutdown"], [92.0] * 3)
    assert_floats(source.data["power"], [500.0] * 3)
    assert_floats(source.data["power_limit"], [700.0] * 3)
    assert_floats(source.data["sm_clock"], [1980.0] * 3)
    assert_floats(source.data["mem_max"], [2619.0] * 3)
    assert_floats(source.data["gpm_tensor"], [55.0] * 3)
    # The band: each reason's row number where its bit is set, nothing elsewhere.
    assert_floats(source.data["reason/0x4"], [2.0, NAN, 2.0])
    assert_floats(source.data["reason/0x40"], [NAN, 6.0, NAN])
    assert_floats(source.data["reason/0x8"], [NAN, 3.0, NAN])
    assert_floats(source.data["reason/0x1"], [NAN, NAN, NAN])
    plots = plots_by_title(doc)
    assert sorted(plots) == ["Clock event reasons", "Clocks", "GPM activity", "Power", "Temperature", "Video engines"]
    assert plots["GPM activity"].visible
    assert not plots["Video engines"].visible, "no encoder or decoder figure: the plot is not shown"
    header = next(text for text in div_texts(doc) if "GPU 0" in text)
    assert "P0 · 62 °C · 500 W of 700 W enforced · SM 1980 MHz" in plain(header)
    assert "clock events: SW power cap" in plain(header)
    assert "held back" not in plain(header), "no violation counter: nothing said about it"


def _video_and_throttle_rows() -> tuple[Snapshot, ...]:
    """Seven readings 10 s apart (60 s) of an H100 whose power cap held its clocks 2.5 s in every 10 s (25 %),
    thermal slowdown 0.3 s (3 %), sync boost never; whose reliability counter fell (a driver reload); and whose
    board-limit counter is not read."""
    return tuple(
        Snapshot(1000.0 + 10 * i, (h100(1000.0 + 10 * i, power_limit_w=600.0, power_management_limit_w=700.0,
                                        encoder_utilization_pct=12.0 + i, decoder_utilization_pct=34.0,
                                        gpm_fp64_active_pct=1.0, gpm_fp32_active_pct=22.0, gpm_fp16_active_pct=3.0,
                                        violation_power_ns=7_000_000_000 + 2_500_000_000 * i,
                                        violation_thermal_ns=300_000_000 * i, violation_sync_boost_ns=42,
                                        violation_low_utilization_ns=5_000_000_000,
                                        violation_reliability_ns=9_000_000_000 - i),
                         a100(), GpuSample(2)), HostSample())
        for i in range(7))


def test_details_shows_both_power_limits_the_video_engines_the_fp_pipes_and_held_back_clocks() -> None:
    doc, source = details_doc(make_ctx(rows=_video_and_throttle_rows()))
    assert_floats(source.data["power_limit"], [600.0] * 7)
    assert_floats(source.data["power_requested"], [700.0] * 7)
    assert_floats(source.data["encoder"], [12.0 + i for i in range(7)])
    assert_floats(source.data["decoder"], [34.0] * 7)
    assert_floats(source.data["gpm_fp64"], [1.0] * 7)
    assert_floats(source.data["gpm_fp32"], [22.0] * 7)
    assert_floats(source.data["gpm_fp16"], [3.0] * 7)
    plots = plots_by_title(doc)
    assert plots["Video engines"].visible
    header = plain(next(text for text in div_texts(doc) if "GPU 0" in text))
    assert "500 W of 600 W enforced (700 W requested)" in header
    assert "video encoder 18 % · decoder 34 %" in header
    assert "clocks held back in the last 60 s: power cap 25 % · thermal 3 %" in header
    # Switching to a GPU that reports no video engine hides the plot.
    (select,) = models(doc, Select)
    select.value = "1"
    assert not plots["Video engines"].visible


def test_held_back_shares_are_counter_rises_over_the_time_between_readings() -> None:
    span, shares = gpu_details.held_back_shares(_video_and_throttle_rows(), 0)
    assert span == 60.0
    assert dict(shares) == pytest.approx({"power cap": 25.0, "thermal": 3.0, "sync boost": 0.0,
                                          "low utilization": 0.0})
    assert gpu_details.held_back_shares(_video_and_throttle_rows()[:1], 0) == (0.0, [])
    assert gpu_details.held_back_text(60.0, [("sync boost", 0.0), ("thermal", 0.2)]) == (
        "clocks held back in the last 60 s: never")
    assert gpu_details.held_back_text(0.0, []) == ""


def test_details_switches_gpu_with_the_selector_and_refills_the_same_renderers() -> None:
    ctx = make_ctx()
    doc, source = details_doc(ctx)
    renderers_before = len(plots_by_title(doc)["Temperature"].renderers)
    (select,) = models(doc, Select)
    assert [option[0] for option in select.options if isinstance(option, tuple)] == ["0", "1", "2"]
    select.value = "1"
    assert_floats(source.data["temp"], [50.0] * 3)
    assert_floats(source.data["power"], [100.0, NAN, 100.0])
    assert_floats(source.data["sm_max"], [1410.0] * 3)
    assert_floats(source.data["reason/0x1"], [0.0] * 3)
    assert_floats(source.data["gpm_sm"], [NAN] * 3)
    assert len(plots_by_title(doc)["Temperature"].renderers) == renderers_before
    assert not plots_by_title(doc)["GPM activity"].visible
    assert any(div.visible and div.text == gpu_details.GPM_NOT_AVAILABLE for div in models(doc, Div))

    ctx.store.append(Snapshot(1003.0, (h100(1003.0), a100(temperature_c=55.0), GpuSample(2)), HostSample()))
    events = [event for event in tick(doc) if isinstance(event, ColumnsStreamedEvent)]
    assert len(events) == 1
    assert_floats(events[0].data["temp"], [55.0])
    assert_floats(source.data["temp"], [50.0, 50.0, 50.0, 55.0])


def test_details_shows_a_lost_gpu_as_lost() -> None:
    doc, source = details_doc(make_ctx())
    (select,) = models(doc, Select)
    select.value = "2"
    assert_floats(source.data["temp"], [NAN, NAN, NAN])
    assert any("lost: the GPU stopped answering" in text for text in div_texts(doc))


def test_details_follows_the_gpu_query_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    request = SimpleNamespace(arguments={"gpu": [b"1"]})
    monkeypatch.setattr(Document, "session_context", property(lambda _: SimpleNamespace(request=request)))
    doc, source = details_doc(make_ctx())
    (select,) = models(doc, Select)
    assert select.value == "1"
    assert_floats(source.data["temp"], [50.0] * 3)
    assert gpu_details.selected_index({"gpu": ["7"]}, INVENTORY.gpus) == 0
    assert gpu_details.selected_index({"gpu": ["x"]}, INVENTORY.gpus) == 0
    assert gpu_details.selected_index(None, ()) is None


def test_details_streams_only_new_rows_with_rollover() -> None:
    ctx = make_ctx(capacity=3)
    doc, source = details_doc(ctx)
    ctx.store.append(Snapshot(1003.0, (h100(1003.0), a100(), GpuSample(2)), HostSample()))
    (event,) = [event for event in tick(doc) if isinstance(event, ColumnsStreamedEvent)]
    assert event.rollover == 3
    assert_floats(source.data["temp"], [61.0, 62.0, 63.0])
    assert tick(doc) == []


# --- GPU Topology ---------------------------------------------------------------------------------------


def test_topology_grid_has_a_cell_per_pair_with_code_colour_and_meaning() -> None:
    doc = Document()
    gpu_topology.build(doc, make_ctx())
    assert doc.title == "GPU Topology"
    assert doc.session_callbacks == []
    (source,) = models(doc, ColumnDataSource)
    assert values(source, "code") == ["X", "NV12", "SYS", "NV12", "X", "PHB", "SYS", "PHB", "X"]
    assert values(source, "y")[:3] == ["GPU 0"] * 3
    assert values(source, "x")[:3] == ["GPU 0", "GPU 1", "GPU 2"]
    assert values(source, "description")[1] == "GPU 0 to GPU 1: NV12, a bonded set of 12 NVLinks"
    assert values(source, "color")[1] == describe_code("NV4")[0]
    words = plain(" ".join(div_texts(doc)))
    assert "GPU 0 NVIDIA H100 80GB HBM3 00000000:18:00.0 18 links, NVLink 4.0" in words
    assert "GPU 2 NVIDIA L4 00000000:86:00.0 none" in words
    for code in ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS"):
        assert f" {code} " in f" {words} "


def test_topology_codes_are_explained_and_unknown_ones_are_grey() -> None:
    assert describe_code("NV1")[1] == "a bonded set of 1 NVLink"
    assert describe_code("NODE")[1].startswith("PCIe plus the interconnect between PCIe host bridges")
    assert describe_code("WEIRD") == (gpu_topology.UNKNOWN_COLOR, "a connection nvdash does not know")


def test_topology_without_a_matrix_or_with_a_short_row_breaks_nothing() -> None:
    doc = Document()
    gpu_topology.build(doc, make_ctx(inventory=replace(INVENTORY, topology=())))
    assert plain(" ".join(div_texts(doc))) == "NVML did not say how the GPUs are connected."
    ragged = replace(INVENTORY, topology=(("X", "NV12"), ("NV12", "X", "PHB"), ("SYS", "PHB", "X")))
    doc = Document()
    gpu_topology.build(doc, make_ctx(inventory=ragged))
    (source,) = models(doc, ColumnDataSource)
    assert values(source, "code")[2] == "?"


# --- GPU Memory: reserved -------------------------------------------------------------------------------


def test_gpu_memory_shows_driver_reserved_memory_apart_from_used() -> None:
    doc = Document()
    gpu_memory.build(doc, make_ctx())
    (source,) = models(doc, ColumnDataSource)
    assert_floats(values(source, "used_bytes"), [30 * GiB, 10 * GiB, NAN])
    assert_floats(values(source, "reserved_bytes"), [GiB / 2, NAN, NAN])
    assert_floats(values(source, "reserved_pct"), [100 * 0.5 / 80, NAN, NAN])
    assert_floats(values(source, "reserved_left"), [100 - 100 * 0.5 / 80, 100.0, 100.0])
    assert values(source, "reserved") == ["512.0 MiB (0.6 %)", "n/a", "n/a"]
    assert values(source, "label") == ["30.0 / 80.0 GiB (38 %) + 512.0 MiB reserved", "10.0 / 40.0 GiB (25 %)",
                                       "lost"]


def test_pages_on_one_store_share_one_hints_computation(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = gpu_health.bottleneck_hints

    def counted(inventory: Inventory, rows: Any) -> Any:
        calls.append(len(rows))
        return original(inventory, rows)

    monkeypatch.setattr(gpu_health, "bottleneck_hints", counted)
    ctx = make_ctx()
    docs = [health_doc(ctx) for _ in range(5)]
    assert len(calls) == 1, "five pages, one computation"
    assert len({hints.text for _, _, hints, _ in docs}) == 1
    other = make_ctx()
    health_doc(other)
    assert len(calls) == 2, "another store has its own hints"
