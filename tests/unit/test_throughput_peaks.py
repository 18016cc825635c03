"""The throughput bars' peak markers: each GPU's highest TX and RX of the last few seconds, from the store."""

from __future__ import annotations

import math
from typing import Any

import pytest
from bokeh.document import Document
from bokeh.models import ColumnDataSource, HoverTool, Segment
from bokeh.models.annotations import LegendItem

from nvdash.apps import pcie_throughput
from nvdash.apps.context import AppContext
from nvdash.apps.throughput import PEAK_LABEL, PEAK_WINDOW_S, peak_columns, peaks, recent_rows
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot
from nvdash.store import Store
from tests.unit.test_apps import assert_floats, tick

NAN = math.nan
GPUS = (GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 1, 5, 16, 63e9, 0, None),
        GpuInfo(1, "NVIDIA H100 80GB HBM3", "GPU-1", 1, 5, 16, 63e9, 0, None))
INVENTORY = Inventory(host=HostInfo("node", 1, 1), gpus=GPUS)


def row(time_s: float, *rates: tuple[float | None, float | None] | str | None) -> Snapshot:
    """A snapshot with each GPU's ``(tx, rx)``; ``"lost"`` for a lost GPU, ``None`` for one absent."""
    samples = []
    for index, rate in enumerate(rates):
        if rate == "lost":
            samples.append(GpuSample(index, lost=True))
        elif isinstance(rate, tuple):
            samples.append(GpuSample(index, pcie_tx_bytes_per_s=rate[0], pcie_rx_bytes_per_s=rate[1]))
    return Snapshot(time_s, tuple(samples), HostSample())


def tx(sample: GpuSample) -> float | None:
    return sample.pcie_tx_bytes_per_s


def rx(sample: GpuSample) -> float | None:
    return sample.pcie_rx_bytes_per_s


def store_of(*rows: Snapshot) -> Store:
    store = Store(INVENTORY, capacity=100)
    for snapshot in rows:
        store.append(snapshot)
    return store


def test_peaks_are_each_gpus_highest_known_value() -> None:
    rows = [
        row(1.0, (1e9, 5e9), (2e9, None)),
        row(2.0, (7e9, NAN), "lost"),
        row(3.0, (3e9, 4e9), None),
    ]
    assert_floats(peaks(rows, GPUS, tx), [7e9, 2e9])
    assert_floats(peaks(rows, GPUS, rx), [5e9, NAN])  # GPU 1 never had an RX reading
    assert_floats(peaks([row(1.0, "lost", (None, None))], GPUS, tx), [NAN, NAN])
    assert_floats(peaks([], GPUS, tx), [NAN, NAN])


def test_peak_texts_give_the_rate_against_the_link_maximum() -> None:
    data = peak_columns([row(1.0, (6.3e9, None), (0.0, 31.5e9))], GPUS, [63e9, 63e9], tx, rx)
    assert data["tx_peak_text"] == ["6.3 GB/s of 63.0 GB/s (10 %)", "0 B/s of 63.0 GB/s (0 %)"]
    assert data["rx_peak_text"] == ["n/a", "31.5 GB/s of 63.0 GB/s (50 %)"]


def test_recent_rows_are_the_last_window_by_the_readings_own_times() -> None:
    store = store_of(*(row(100.0 + i, (float(i), 0.0)) for i in range(11)))
    rows, seq = recent_rows(store, interval_s=1.0, window_s=5.0)
    assert [snapshot.time_s for snapshot in rows] == [105.0, 106.0, 107.0, 108.0, 109.0, 110.0]
    assert seq == 11
    # Late sweeps: fewer readings span the window; the window is still 5 s of the readings' own times.
    late = store_of(*(row(t, (1.0, 1.0)) for t in (100.0, 101.0, 103.5, 104.9, 106.0, 110.0)))
    assert [snapshot.time_s for snapshot in recent_rows(late, interval_s=1.0, window_s=5.0)[0]] == [106.0, 110.0]
    assert recent_rows(store_of(), interval_s=1.0) == ([], 0)


def _peak_values(source: ColumnDataSource) -> dict[str, list[Any]]:
    return {name: list(source.data[name]) for name in ("tx", "tx_peak", "rx", "rx_peak")}


def test_pcie_bars_mark_the_peak_of_the_last_seconds_and_follow_each_tick() -> None:
    burst = row(100.0, (50e9, 20e9), (1e9, 2e9))
    store = store_of(burst, *(row(100.0 + i, (0.0, 0.0), (1e9, 2e9)) for i in range(1, 5)))
    ctx = AppContext(store=store, interval_s=1.0)
    doc = Document()
    pcie_throughput.build(doc, ctx)
    (source,) = [model for model in doc.select({"type": ColumnDataSource}) if "tx_peak" in model.data]
    # Between bursts the bars are empty, the markers hold the burst.
    data = _peak_values(source)
    assert_floats(data["tx"], [0.0, 1e9])
    assert_floats(data["tx_peak"], [50e9, 1e9])
    assert_floats(data["rx_peak"], [20e9, 2e9])

    store.append(row(105.0, (3e9, 0.0), (1e9, 2e9)))  # the burst is now 5 s old: still in the window
    tick(doc)
    assert_floats(source.data["tx_peak"], [50e9, 1e9])
    store.append(row(106.0, (0.0, 0.0), (1e9, 2e9)))  # and now it is not
    tick(doc)
    assert_floats(source.data["tx_peak"], [3e9, 1e9])
    assert_floats(source.data["rx_peak"], [0.0, 2e9])


def test_pcie_bars_say_what_the_markers_are() -> None:
    ctx = AppContext(store=store_of(row(1.0, (1e9, 2e9), (3e9, 4e9))), interval_s=1.0)
    doc = Document()
    pcie_throughput.build(doc, ctx)
    markers = [model for model in doc.select({"type": Segment}) if isinstance(model, Segment)]
    assert sorted(str(marker.y0) for marker in markers) == ["rx_peak", "tx_peak"]
    (item,) = [item for item in doc.select({"type": LegendItem}) if item.label.value == PEAK_LABEL]
    assert PEAK_LABEL == f"peak, last {PEAK_WINDOW_S:g} s" == "peak, last 5 s"
    assert {renderer.glyph.y0 for renderer in item.renderers} == {"tx_peak", "rx_peak"}
    (hover,) = doc.select({"type": HoverTool})
    assert ("TX peak, last 5 s", "@tx_peak_text") in hover.tooltips
    assert ("RX peak, last 5 s", "@rx_peak_text") in hover.tooltips


@pytest.mark.parametrize("window_s", [0.5, 5.0])
def test_recent_rows_read_enough_rows_for_the_window_at_the_interval(window_s: float) -> None:
    store = store_of(*(row(100.0 + i * 0.125, (float(i), 0.0)) for i in range(200)))  # exact binary fractions
    rows, _ = recent_rows(store, interval_s=0.125, window_s=window_s)
    assert rows[-1].time_s == 124.875
    assert rows[0].time_s == 124.875 - window_s
    assert len(rows) == window_s / 0.125 + 1
