"""The Bokeh apps: built on bare documents from a store of known rows, asserting on the values they show."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np
import pytest
from bokeh.core.property.vectorization import Value
from bokeh.document import Document
from bokeh.document.events import ColumnsPatchedEvent, ColumnsStreamedEvent, DocumentChangedEvent
from bokeh.models import ColumnDataSource, Model, Plot, Range1d
from bokeh.models.annotations import LegendItem
from bokeh.models.widgets import Toggle
from bokeh.server.callbacks import PeriodicCallback
from bokeh.themes import built_in_themes

from nvdash.apps import (
    APPS,
    AppContext,
    AppSpec,
    Requirement,
    available_apps,
    gpu_memory,
    gpu_resources,
    gpu_utilization,
    machine_resources,
    nvlink_throughput,
    nvlink_timeline,
    pcie_throughput,
    unavailable_reason,
)
from nvdash.apps.figures import format_bytes, format_bytes_of, format_pct, format_rate, format_rate_of
from nvdash.apps.theme import DARK_THEME, apply_theme, wants_dark
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot
from nvdash.store import Store

M = TypeVar("M", bound=Model)
GiB = 1024**3
NAN = math.nan

HOST = HostInfo(hostname="node", cpu_count=16, memory_total_bytes=64 * GiB)
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 80 * GiB, 5, 16, 63e9, 18, 450e9,
               nvlink_signalling_max_bytes_per_s=18 * 26.5625e9)
"""NVLink 4: 18 links of 25 GB/s data per direction; the driver's speed field says 26.5625 GB/s (signalling)."""
A100 = GpuInfo(1, "NVIDIA A100-SXM4-40GB", "GPU-1", 40 * GiB, 4, 16, 31.5e9, 12, 300e9)
L4 = GpuInfo(2, "NVIDIA L4", "GPU-2", 24 * GiB, 4, 16, 31.5e9, 0, None)
INVENTORY = Inventory(host=HOST, gpus=(H100, A100, L4), driver_version="550.54")


def gpu(index: int, util: float | None, mem_gib: float | None, total_gib: float, **rest: Any) -> GpuSample:
    """A GPU sample with readable arguments; ``rest`` sets rates, temperature and power."""
    used = None if mem_gib is None else int(mem_gib * GiB)
    return GpuSample(index, utilization_pct=util, memory_used_bytes=used,
                     memory_total_bytes=int(total_gib * GiB), **rest)


def host(cpu: float | None, mem_gib: float, **rates: float | None) -> HostSample:
    """A host sample; ``rates`` are the disk and network rates."""
    return HostSample(cpu_pct=cpu, memory_used_bytes=int(mem_gib * GiB), memory_total_bytes=64 * GiB, **rates)


ROWS = (
    Snapshot(1000.0, (
        gpu(0, 10.0, 8, 80, pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=2e9,
            nvlink_tx_bytes_per_s=10e9, nvlink_rx_bytes_per_s=20e9, temperature_c=40.0, power_w=100.0),
        gpu(1, 20.0, 4, 40, pcie_tx_bytes_per_s=3e9, pcie_rx_bytes_per_s=4e9,
            nvlink_tx_bytes_per_s=30e9, nvlink_rx_bytes_per_s=40e9),
        gpu(2, 30.0, 2, 24, pcie_tx_bytes_per_s=5e9, pcie_rx_bytes_per_s=6e9),
    ), host(5.0, 10, disk_read_bytes_per_s=1e6, disk_write_bytes_per_s=2e6,
            net_sent_bytes_per_s=3e6, net_recv_bytes_per_s=4e6)),
    Snapshot(1001.0, (
        gpu(0, 50.0, 16, 80, pcie_tx_bytes_per_s=None, pcie_rx_bytes_per_s=2e9,
            nvlink_tx_bytes_per_s=11e9, nvlink_rx_bytes_per_s=21e9),
        gpu(1, None, 5, 40, pcie_tx_bytes_per_s=3e9, pcie_rx_bytes_per_s=4e9,
            nvlink_tx_bytes_per_s=31e9, nvlink_rx_bytes_per_s=41e9),
        gpu(2, 31.0, 3, 24),
    ), host(None, 11)),
    Snapshot(1002.0, (
        gpu(0, 73.0, 28, 80, pcie_tx_bytes_per_s=12.3e9, pcie_rx_bytes_per_s=6.3e9,
            nvlink_tx_bytes_per_s=90e9, nvlink_rx_bytes_per_s=45e9, temperature_c=65.0, power_w=350.0),
        gpu(1, 12.0, 10, 40, pcie_tx_bytes_per_s=0.0, pcie_rx_bytes_per_s=3.15e9,
            nvlink_tx_bytes_per_s=150e9, nvlink_rx_bytes_per_s=None),
        GpuSample(2, lost=True),
    ), host(25.0, 12, disk_read_bytes_per_s=5e6, disk_write_bytes_per_s=None,
            net_sent_bytes_per_s=7e6, net_recv_bytes_per_s=8e6)),
)
NEW_ROW = Snapshot(1003.0, (
    gpu(0, 99.0, 40, 80, pcie_tx_bytes_per_s=60e9, pcie_rx_bytes_per_s=1e9,
        nvlink_tx_bytes_per_s=400e9, nvlink_rx_bytes_per_s=1e9),
    gpu(1, 1.0, 20, 40, pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=1e9,
        nvlink_tx_bytes_per_s=1e9, nvlink_rx_bytes_per_s=2e9),
    gpu(2, 44.0, 12, 24, pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=1e9),
), host(50.0, 20, disk_read_bytes_per_s=1e6, disk_write_bytes_per_s=1e6,
        net_sent_bytes_per_s=1e6, net_recv_bytes_per_s=1e6))


def make_ctx(inventory: Inventory = INVENTORY, rows: tuple[Snapshot, ...] = ROWS, capacity: int = 100,
             interval_s: float = 1.0) -> AppContext:
    store = Store(inventory, capacity=capacity)
    for row in rows:
        store.append(row)
    return AppContext(store=store, interval_s=interval_s)


Build = Callable[[Document, AppContext], None]


def built(build: Build, ctx: AppContext) -> tuple[Document, ColumnDataSource]:
    """Build an app on a bare document; return it and its single data source."""
    doc = Document()
    build(doc, ctx)
    (source,) = models(doc, ColumnDataSource)
    return doc, source


def models(doc: Document, kind: type[M]) -> list[M]:
    """The document's models of one type."""
    found = [model for model in doc.select({"type": kind}) if isinstance(model, kind)]
    assert found
    return found


def legend_labels(doc: Document) -> set[str]:
    return {str(item.label.value) for item in models(doc, LegendItem) if isinstance(item.label, Value)}


def tick(doc: Document) -> list[DocumentChangedEvent]:
    """Run the document's one periodic callback, as the server would; return the changes it made."""
    (callback,) = doc.session_callbacks
    events: list[DocumentChangedEvent] = []
    doc.on_change(events.append)
    try:
        callback.callback()
    finally:
        doc.remove_on_change(events.append)
    return events


def values(source: ColumnDataSource, name: str) -> list[Any]:
    return list(source.data[name])


def assert_floats(actual: Any, expected: list[float]) -> None:
    """Equal element by element, NaN equal to NaN."""
    actual = [float(value) for value in actual]
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want), (actual, expected)


def streamed(events: list[DocumentChangedEvent]) -> list[ColumnsStreamedEvent]:
    return [event for event in events if isinstance(event, ColumnsStreamedEvent)]


# --- registry -------------------------------------------------------------------------------------------


def test_apps_routes_titles_and_order() -> None:
    assert [(spec.route, spec.title) for spec in APPS] == [
        ("/GPU-Utilization", "GPU Utilization"),
        ("/GPU-Memory", "GPU Memory"),
        ("/GPU-Processes", "GPU Processes"),
        ("/GPU-Accounting", "GPU Accounting"),
        ("/GPU-Resources", "GPU Resources"),
        ("/GPU-Health", "GPU Health"),
        ("/GPU-Details", "GPU Details"),
        ("/PCIe-Throughput", "PCIe Throughput"),
        ("/NVLink-Throughput", "NVLink Throughput"),
        ("/NVLink-Timeline", "NVLink Timeline"),
        ("/GPU-Topology", "GPU Topology"),
        ("/Machine-Resources", "Machine Resources"),
        ("/Cluster-Nodes", "Cluster Nodes"),
        ("/Cluster-Fleet", "Fleet Health"),
        ("/Cluster-Pods", "Cluster Pods"),
        ("/Cluster-Accounting", "Cluster Accounting"),
        ("/GPU-Memory-by-Notebook", "GPU Memory by Notebook"),
    ]
    assert [spec.requires for spec in APPS] == [Requirement.GPU] * 8 + [Requirement.NVLINK] * 2 + [
        Requirement.TOPOLOGY, Requirement.NONE, Requirement.PROMETHEUS, Requirement.PROMETHEUS, Requirement.POD_HISTORY,
        Requirement.PROMETHEUS, Requirement.NOTEBOOKS]
    assert all(isinstance(spec, AppSpec) and callable(spec.build) for spec in APPS)


def test_without_gpus_only_the_machine_is_offered_with_the_nvml_reason() -> None:
    inventory = Inventory(host=HOST, nvml_error="NVML Shared Library Not Found")
    reasons = {spec.route: unavailable_reason(spec, inventory) for spec in APPS}
    assert reasons.pop("/Machine-Resources") is None
    assert reasons.pop("/Cluster-Nodes") == reasons.pop("/Cluster-Fleet") == (
        "The cluster pages read every node's readings from Prometheus: start nvdash with --prometheus URL.")
    assert reasons.pop("/Cluster-Accounting") == (
        "The cluster pages read every node's readings from Prometheus: start nvdash with --prometheus URL.")
    assert reasons.pop("/Cluster-Pods") == (
        "The pods page reads pods from Prometheus (--prometheus URL), or on a Kubernetes node from this node's "
        "history file: it needs the kubelet's pod-resources socket (--kubelet-socket), process readings "
        "(--process-interval above 0) and the history (not --no-history).")
    assert reasons.pop("/GPU-Memory-by-Notebook") == (
        "The notebooks page shows the GPU memory of a Jupyter server's kernels: it is offered when JupyterLab starts "
        "nvdash (--jupyter-kernels) with process readings on (--process-interval above 0).")
    assert set(reasons.values()) == {"No NVIDIA GPU was found: NVML Shared Library Not Found."}
    assert [spec.route for spec in available_apps(inventory)] == ["/Machine-Resources"]
    # A machine without GPUs can still show the cluster, read from Prometheus.
    assert [spec.route for spec in available_apps(inventory, cluster=True)] == [
        "/Machine-Resources", "/Cluster-Nodes", "/Cluster-Fleet", "/Cluster-Pods", "/Cluster-Accounting"]
    # A single node with its history: the pods page, read from the history; the nodes page needs Prometheus.
    assert [spec.route for spec in available_apps(inventory, local_history=True)] == [
        "/Machine-Resources", "/Cluster-Pods"]
    # Started by a Jupyter server (--jupyter-kernels, process readings on): its notebooks' page, whatever the GPUs.
    assert [spec.route for spec in available_apps(inventory, notebooks=True)] == [
        "/Machine-Resources", "/GPU-Memory-by-Notebook"]
    assert unavailable_reason(APPS[0], Inventory(host=HOST)) == "No NVIDIA GPU was found."


def test_without_nvlink_the_nvlink_apps_are_not_offered() -> None:
    inventory = Inventory(host=HOST, gpus=(L4,))
    assert [spec.route for spec in available_apps(inventory)] == [
        "/GPU-Utilization", "/GPU-Memory", "/GPU-Processes", "/GPU-Accounting", "/GPU-Resources", "/GPU-Health",
        "/GPU-Details", "/PCIe-Throughput", "/Machine-Resources"]
    nvlink_apps = [spec for spec in APPS if spec.requires is Requirement.NVLINK]
    assert {unavailable_reason(spec, inventory) for spec in nvlink_apps} == {
        "None of the GPUs on this machine has NVLink."}
    with_topology = replace(INVENTORY, topology=(("X", "NV18", "SYS"), ("NV18", "X", "SYS"), ("SYS", "SYS", "X")))
    cluster_only = (Requirement.PROMETHEUS, Requirement.POD_HISTORY, Requirement.NOTEBOOKS)
    assert available_apps(with_topology) == [spec for spec in APPS if spec.requires not in cluster_only]
    assert available_apps(with_topology, cluster=True, notebooks=True) == list(APPS)
    assert [spec.route for spec in available_apps(INVENTORY)] == [
        spec.route for spec in APPS if spec.requires not in (Requirement.TOPOLOGY, *cluster_only)]


def test_importing_apps_loads_no_hardware_library_and_starts_no_thread() -> None:
    code = (
        "import sys, threading, nvdash.apps\n"
        "assert 'pynvml' not in sys.modules, 'pynvml'\n"
        "assert 'psutil' not in sys.modules, 'psutil'\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


# --- units and theme --------------------------------------------------------------------------------------


def test_formatters_use_iec_bytes_and_decimal_rates() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(35.2 * GiB) == "35.2 GiB"
    assert format_bytes(1536 * 1024) == "1.5 MiB"
    assert format_bytes(None) == "n/a"
    assert format_bytes_of(35.2 * GiB, 79.6 * GiB) == "35.2 / 79.6 GiB"
    assert format_rate(12.3e9) == "12.3 GB/s"
    assert format_rate(450e6) == "450.0 MB/s"
    assert format_rate_of(12.3e9, 63e9) == "12.3 GB/s of 63.0 GB/s (20 %)"
    assert format_rate_of(None, 63e9) == "n/a"
    assert format_pct(73.0) == "73.0 %"
    assert format_pct(NAN) == "n/a"


def test_theme_follows_the_query_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    assert wants_dark({"theme": [b"dark"]})
    assert wants_dark({"theme": ["light", "dark"]})
    assert not wants_dark({"theme": [b"light"]})
    assert not wants_dark({})
    assert not wants_dark(None)

    bare = Document()
    default_theme = bare.theme
    assert apply_theme(bare) is False
    assert bare.theme is default_theme

    request = SimpleNamespace(arguments={"theme": [b"dark"]})
    monkeypatch.setattr(Document, "session_context", property(lambda _: SimpleNamespace(request=request)))
    doc = Document()
    assert apply_theme(doc) is True
    assert doc.theme is built_in_themes[DARK_THEME]
    gpu_utilization.build(doc, make_ctx())
    assert doc.theme is built_in_themes[DARK_THEME]


# --- bar charts -----------------------------------------------------------------------------------------


def test_gpu_utilization_shows_the_newest_values_and_marks_the_lost_gpu() -> None:
    ctx = make_ctx(interval_s=0.5)
    doc, source = built(gpu_utilization.build, ctx)
    assert doc.title == "GPU Utilization"
    (callback,) = doc.session_callbacks
    assert isinstance(callback, PeriodicCallback)
    assert callback.period == 500
    assert values(source, "gpu") == ["GPU 0", "GPU 1", "GPU 2"]
    assert_floats(values(source, "utilization_pct"), [73.0, 12.0, NAN])
    assert_floats(values(source, "bar"), [73.0, 12.0, 100.0])
    assert values(source, "label") == ["73 %", "12 %", "lost"]
    assert values(source, "utilization") == ["73.0 %", "12.0 %", "GPU lost"]
    assert values(source, "temperature") == ["65 °C", "n/a", "n/a"]
    assert values(source, "power") == ["350 W", "n/a", "n/a"]
    assert values(source, "description")[0] == "0: NVIDIA H100 80GB HBM3"

    assert tick(doc) == []
    ctx.store.append(NEW_ROW)
    events = tick(doc)
    assert len(events) == 1
    assert isinstance(events[0], ColumnsPatchedEvent)
    assert_floats(values(source, "utilization_pct"), [99.0, 1.0, 44.0])
    assert values(source, "label") == ["99 %", "1 %", "44 %"]


def test_gpu_absent_from_a_snapshot_or_unknown_metric_breaks_nothing() -> None:
    ctx = make_ctx(rows=(Snapshot(5.0, (GpuSample(0, utilization_pct=None),), HostSample()),))
    _, source = built(gpu_utilization.build, ctx)
    assert_floats(values(source, "utilization_pct"), [NAN, NAN, NAN])
    assert_floats(values(source, "bar"), [0.0, 0.0, 0.0])
    assert values(source, "label") == ["n/a"] * 3
    _, memory = built(gpu_memory.build, ctx)
    assert_floats(values(memory, "used_pct"), [NAN, NAN, NAN])
    assert_floats(values(memory, "total_bytes"), [80 * GiB, 40 * GiB, 24 * GiB])


def test_gpu_memory_is_drawn_against_each_gpus_own_total() -> None:
    ctx = make_ctx()
    doc, source = built(gpu_memory.build, ctx)
    assert_floats(values(source, "used_bytes"), [28 * GiB, 10 * GiB, NAN])
    assert_floats(values(source, "total_bytes"), [80 * GiB, 40 * GiB, 24 * GiB])
    assert_floats(values(source, "used_pct"), [100 * 28 / 80, 100 * 10 / 40, NAN])
    assert_floats(values(source, "bar"), [35.0, 25.0, 100.0])
    assert values(source, "label") == ["28.0 / 80.0 GiB (35 %)", "10.0 / 40.0 GiB (25 %)", "lost"]
    assert values(source, "used") == ["28.0 GiB", "10.0 GiB", "GPU lost"]

    ctx.store.append(NEW_ROW)
    tick(doc)
    assert_floats(values(source, "used_pct"), [50.0, 50.0, 50.0])
    assert values(source, "label")[2] == "12.0 / 24.0 GiB (50 %)"


def test_pcie_throughput_is_measured_against_each_gpus_link_maximum() -> None:
    ctx = make_ctx()
    doc, source = built(pcie_throughput.build, ctx)
    assert values(source, "gpu") == ["GPU 0", "GPU 1", "GPU 2"]
    assert_floats(values(source, "tx"), [12.3e9, 0.0, NAN])
    assert_floats(values(source, "rx"), [6.3e9, 3.15e9, NAN])
    assert_floats(values(source, "max"), [63e9, 31.5e9, 31.5e9])
    assert values(source, "tx_text") == [
        "12.3 GB/s of 63.0 GB/s (20 %)", "0 B/s of 31.5 GB/s (0 %)", "GPU lost"]
    assert values(source, "rx_text")[1] == "3.1 GB/s of 31.5 GB/s (10 %)"
    assert values(source, "note") == ["", "", "lost"]
    (plot,) = models(doc, Plot)
    assert isinstance(plot.y_range, Range1d)
    assert plot.y_range.end == pytest.approx(63e9 * 1.12)

    ctx.store.append(NEW_ROW)
    tick(doc)
    assert_floats(values(source, "tx"), [60e9, 1e9, 1e9])
    assert values(source, "note") == ["", "", ""]


def test_nvlink_throughput_shows_only_gpus_with_nvlink() -> None:
    doc, source = built(nvlink_throughput.build, make_ctx())
    assert values(source, "gpu") == ["GPU 0", "GPU 1"]
    assert_floats(values(source, "tx"), [90e9, 150e9])
    assert_floats(values(source, "rx"), [45e9, NAN])
    assert_floats(values(source, "max"), [450e9, 300e9])
    # Percentages are of the data rate, and say so; the hover names the signalling rate beside it where known.
    assert values(source, "tx_text") == ["90.0 GB/s of 450.0 GB/s data rate (20 %)",
                                         "150.0 GB/s of 300.0 GB/s data rate (50 %)"]
    assert values(source, "rx_text")[1] == "n/a"
    assert values(source, "max_text") == ["450.0 GB/s data rate per direction (signalling 478.1 GB/s)",
                                          "300.0 GB/s data rate per direction"]
    assert values(source, "tx_peak_text")[0] == "90.0 GB/s of 450.0 GB/s data rate (20 %)"
    (plot,) = models(doc, Plot)
    assert "NVLink data rate" in str(getattr(plot.title, "text", ""))
    assert "NVLink data rate" in legend_labels(doc)


# --- timelines ------------------------------------------------------------------------------------------


def test_gpu_resources_backfills_every_row_and_streams_only_new_ones() -> None:
    ctx = make_ctx(capacity=4)
    doc, source = built(gpu_resources.build, ctx)
    assert doc.title == "GPU Resources"
    assert_floats(source.data["time"], [1_000_000.0, 1_001_000.0, 1_002_000.0])
    assert_floats(source.data["util/0"], [10.0, 50.0, 73.0])
    assert_floats(source.data["util/1"], [20.0, NAN, 12.0])
    assert_floats(source.data["util/2"], [30.0, 31.0, NAN])
    assert_floats(source.data["mem/0"], [8 * GiB, 16 * GiB, 28 * GiB])
    assert_floats(source.data["pcie/0"], [3e9, NAN, 18.6e9])
    assert_floats(source.data["nvlink/1"], [70e9, 72e9, NAN])
    assert "nvlink/2" not in source.data
    plots = models(doc, Plot)
    assert len(plots) == 4
    assert len({id(plot.x_range) for plot in plots}) == 1
    assert legend_labels(doc) == {"GPU 0", "GPU 1", "GPU 2 (lost)"}

    ctx.store.append(NEW_ROW)
    events = streamed(tick(doc))
    assert len(events) == 1
    assert events[0].rollover == 4
    assert {len(column) for column in events[0].data.values()} == {1}
    assert_floats(events[0].data["time"], [1_003_000.0])
    assert_floats(events[0].data["util/0"], [99.0])
    assert isinstance(source.data["util/0"], np.ndarray)
    assert_floats(source.data["util/0"], [10.0, 50.0, 73.0, 99.0])
    assert legend_labels(doc) == {"GPU 0", "GPU 1", "GPU 2"}

    ctx.store.append(replace(NEW_ROW, time_s=1004.0))
    tick(doc)
    assert_floats(source.data["time"], [1_001_000.0, 1_002_000.0, 1_003_000.0, 1_004_000.0])
    assert_floats(source.data["util/0"], [50.0, 73.0, 99.0, 99.0])
    assert tick(doc) == []


def test_gpu_resources_without_nvlink_has_no_nvlink_plot() -> None:
    ctx = make_ctx(inventory=Inventory(host=HOST, gpus=(replace(L4, index=0),)),
                   rows=(Snapshot(1.0, (gpu(0, 5.0, 1, 24),), HostSample()),))
    doc, source = built(gpu_resources.build, ctx)
    assert len(models(doc, Plot)) == 3
    assert sorted(source.data) == ["mem/0", "pcie/0", "time", "util/0"]


def test_nvlink_timeline_has_tx_and_rx_per_nvlink_gpu() -> None:
    ctx = make_ctx()
    doc, source = built(nvlink_timeline.build, ctx)
    assert sorted(source.data) == ["rx/0", "rx/1", "time", "tx/0", "tx/1"]
    assert_floats(source.data["tx/0"], [10e9, 11e9, 90e9])
    assert_floats(source.data["rx/1"], [40e9, 41e9, NAN])
    ctx.store.append(NEW_ROW)
    tick(doc)
    assert_floats(source.data["tx/0"], [10e9, 11e9, 90e9, 400e9])


def test_machine_resources_backfills_host_rows_with_gaps_for_unknowns() -> None:
    ctx = make_ctx(capacity=3)
    doc, source = built(machine_resources.build, ctx)
    assert doc.title == "Machine Resources"
    assert_floats(source.data["cpu"], [5.0, NAN, 25.0])
    assert_floats(source.data["memory"], [10 * GiB, 11 * GiB, 12 * GiB])
    assert_floats(source.data["disk_write"], [2e6, NAN, NAN])
    assert_floats(source.data["net_recv"], [4e6, NAN, 8e6])
    titles = {getattr(plot.title, "text", None): plot for plot in models(doc, Plot)}
    memory_plot = titles["Memory used"]
    assert isinstance(memory_plot.y_range, Range1d)
    assert memory_plot.y_range.end == pytest.approx(64 * GiB * 1.02)

    ctx.store.append(NEW_ROW)
    tick(doc)
    assert_floats(source.data["cpu"], [NAN, 25.0, 50.0])


def test_pause_holds_updates_and_resume_catches_up() -> None:
    ctx = make_ctx()
    doc, source = built(machine_resources.build, ctx)
    (pause,) = models(doc, Toggle)
    pause.active = True
    ctx.store.append(NEW_ROW)
    ctx.store.append(replace(NEW_ROW, time_s=1004.0, host=host(60.0, 21)))
    assert tick(doc) == []
    assert len(source.data["cpu"]) == 3

    pause.active = False
    assert_floats(source.data["cpu"], [5.0, NAN, 25.0, 50.0, 60.0])
    assert tick(doc) == []


def test_every_app_builds_on_an_empty_store_and_without_gpus() -> None:
    for inventory in (INVENTORY, Inventory(host=HOST, nvml_error="no driver")):
        ctx = make_ctx(inventory=inventory, rows=())
        for spec in APPS:
            if spec.requires in (Requirement.PROMETHEUS, Requirement.POD_HISTORY):
                continue  # the cluster pages read Prometheus, not the store: see tests/unit/test_cluster_pages.py
            doc = Document()
            spec.build(doc, ctx)
            assert doc.title == spec.title
            (root,) = doc.roots
            assert getattr(root, "sizing_mode", None) == "stretch_both"
            if spec.requires is Requirement.TOPOLOGY or spec.route == "/GPU-Accounting":
                # static: read once at start; the accounting page without accounting (none here) is one note
                assert doc.session_callbacks == []
                continue
            assert len(doc.session_callbacks) == 1
            ctx.store.append(ROWS[0])
            tick(doc)


def test_data_tables_redraw_on_new_data_of_the_same_length() -> None:
    """BokehJS redraws a DataTable only when its row count changes: new ``data`` must ask its view to redraw."""
    from bokeh.models import CustomJS

    from nvdash.apps.figures import data_table

    source = ColumnDataSource(data={"a": [1, 2]})
    table = data_table(source, [], dark=False)
    (callback,) = source.js_property_callbacks["change:data"]
    assert isinstance(callback, CustomJS)
    assert callback.args["table"] is table
    assert "updateGrid" in callback.code
    assert table.sortable
    assert table.index_position is None
