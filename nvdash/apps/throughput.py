"""Link throughput bars shared by PCIe and NVLink: TX and RX per GPU against that GPU's own maximum, each with a
marker at its peak of the last few seconds (traffic comes in bursts: between them the bars alone look idle)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bokeh.document import Document
from bokeh.models import ColumnDataSource, Segment
from bokeh.models.annotations import LegendItem
from bokeh.models.renderers import DataRenderer, GlyphRenderer
from bokeh.plotting import figure
from bokeh.transform import dodge

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    BACKGROUND_ALPHA,
    LOST_COLOR,
    RX_COLOR,
    TX_COLOR,
    Unit,
    add_bar_hover,
    add_legend_above,
    add_page,
    bar_figure,
    bar_labels,
    format_rate,
    format_rate_of,
    gpu_description,
    gpu_label,
    legend_item,
    text_color,
)
from nvdash.apps.rows import gpu_reading, largest, nan_if_none
from nvdash.apps.theme import apply_theme
from nvdash.live.follow import follow, patch_changed, refresh_batch
from nvdash.live.stages import Later
from nvdash.sampling.records import GpuInfo, GpuSample, Snapshot
from nvdash.store import Store

Metric = Callable[[GpuSample], float | None]

PEAK_WINDOW_S = 5.0
"""The peak markers show the highest reading of this many seconds."""
PEAK_LABEL = f"peak, last {PEAK_WINDOW_S:g} s"
PEAK_LINE_PX = 3
BAR_WIDTH = 0.36
BAR_OFFSET = 0.2


@dataclass(frozen=True)
class LinkMaximum:
    """Which maximum a link's pale bar and percentages are, in words: ``legend`` on the plot, ``of`` after the
    figure in texts (``12 GB/s of 450 GB/s data rate``), and ``detail`` for the hover (the other figure, say)."""

    legend: str = "link maximum"
    of: str = ""
    detail: Callable[[GpuInfo], str] | None = None

    def describe(self, gpu: GpuInfo, maximum: float | None) -> str:
        """The hover's text for ``gpu``'s maximum: ``450.0 GB/s data rate per direction (...)``."""
        text = f"{format_rate(maximum)}{' ' + self.of if self.of else ''} per direction"
        extra = self.detail(gpu) if self.detail is not None and maximum is not None else ""
        return f"{text} ({extra})" if extra else text


def recent_rows(store: Store, interval_s: float, window_s: float = PEAK_WINDOW_S) -> tuple[list[Snapshot], int]:
    """The readings of the last ``window_s`` seconds (the newest and those at most ``window_s`` older, by the
    readings' own times), oldest first, and the newest sequence number."""
    count = math.ceil(window_s / interval_s) + 1
    rows, seq = store.since(max(0, store.last_seq - count))
    if not rows:
        return [], seq
    start = rows[-1].time_s - window_s
    return [row for row in rows if row.time_s >= start], seq


def peaks(rows: Sequence[Snapshot], gpus: Sequence[GpuInfo], metric: Metric) -> list[float]:
    """Each GPU's highest ``metric`` over ``rows``; NaN where no row has a value (lost, unsupported, no rows)."""
    highest = [-math.inf] * len(gpus)
    for row in rows:
        for position, gpu in enumerate(gpus):
            sample, _lost = gpu_reading(row, gpu.index)
            value = None if sample is None else metric(sample)
            if value is not None and not math.isnan(value):
                highest[position] = max(highest[position], value)
    return [value if value > -math.inf else math.nan for value in highest]


def columns(
    gpus: Sequence[GpuInfo],
    maxima: Sequence[float | None],
    snapshot: Snapshot | None,
    tx: Metric,
    rx: Metric,
    *,
    partial: Callable[[GpuSample], bool] | None = None,
    named: LinkMaximum | None = None,
) -> dict[str, list[Any]]:
    """The bar source: TX, RX, the GPU's maximum (or the axis top when unknown, for hovering) and texts.

    ``partial`` says when a reading is a lower bound (some NVLink links did not answer): its texts and label
    say so rather than showing a silently smaller number. ``named`` names the figure the percentages are of.
    """
    label = named or LinkMaximum()
    top = largest(maxima)
    data: dict[str, list[Any]] = {name: [] for name in (
        "gpu", "description", "tx", "rx", "max", "max_bar", "tx_text", "rx_text", "max_text", "note")}
    for gpu, maximum in zip(gpus, maxima, strict=True):
        sample, lost = gpu_reading(snapshot, gpu.index)
        tx_value = None if sample is None else tx(sample)
        rx_value = None if sample is None else rx(sample)
        data["gpu"].append(gpu_label(gpu))
        data["description"].append(gpu_description(gpu))
        data["tx"].append(nan_if_none(tx_value))
        data["rx"].append(nan_if_none(rx_value))
        data["max"].append(nan_if_none(maximum))
        data["max_bar"].append(nan_if_none(top if maximum is None else maximum))
        is_partial = sample is not None and partial is not None and partial(sample)
        suffix = " (partial: some links did not answer)" if is_partial else ""
        data["tx_text"].append("GPU lost" if lost else format_rate_of(tx_value, maximum, maximum_name=label.of)
                               + suffix)
        data["rx_text"].append("GPU lost" if lost else format_rate_of(rx_value, maximum, maximum_name=label.of)
                               + suffix)
        data["max_text"].append(label.describe(gpu, maximum))
        data["note"].append("lost" if lost else "partial" if is_partial else "")
    return data


def peak_columns(
    rows: Sequence[Snapshot], gpus: Sequence[GpuInfo], maxima: Sequence[float | None], tx: Metric, rx: Metric,
    *, maximum_name: str = "",
) -> dict[str, list[Any]]:
    """The markers' columns: each GPU's TX and RX peak over ``rows`` and their texts."""
    data: dict[str, list[Any]] = {"tx_peak": peaks(rows, gpus, tx), "rx_peak": peaks(rows, gpus, rx)}
    for direction in ("tx", "rx"):
        data[f"{direction}_peak_text"] = [
            "n/a" if math.isnan(value) else format_rate_of(value, maximum, maximum_name=maximum_name)
            for value, maximum in zip(data[f"{direction}_peak"], maxima, strict=True)
        ]
    return data


def _peak_marker(fig: Any, source: ColumnDataSource, column: str, offset: float, color: str) -> GlyphRenderer[Any]:
    """A thin line across the bar at ``offset`` from each GPU's category, at the height of ``column``."""
    half = BAR_WIDTH / 2
    glyph = Segment(x0=dodge("gpu", offset - half, range=fig.x_range), y0=column,
                    x1=dodge("gpu", offset + half, range=fig.x_range), y1=column,
                    line_color=color, line_width=PEAK_LINE_PX)
    renderer: GlyphRenderer[Any] = fig.add_glyph(source, glyph, nonselection_glyph=None, muted_glyph=None)
    return renderer


def build_throughput(
    doc: Document,
    ctx: AppContext,
    title: str,
    gpus: Sequence[GpuInfo],
    *,
    maximum: Callable[[GpuInfo], float | None],
    tx: Metric,
    rx: Metric,
    partial: Callable[[GpuSample], bool] | None = None,
    named: LinkMaximum | None = None,
) -> None:
    """Grouped TX/RX bars per GPU over a pale bar at the GPU's own link maximum, with a marker on each bar at its
    peak of the last :data:`PEAK_WINDOW_S` seconds; both follow every new reading. ``named`` says which maximum
    the pale bar and the percentages are (NVLink: the data rate, not the signalling rate)."""
    dark = apply_theme(doc)
    maxima = [maximum(gpu) for gpu in gpus]
    label = named or LinkMaximum()

    def compute(rows: Sequence[Snapshot]) -> dict[str, list[Any]]:
        data = columns(gpus, maxima, rows[-1] if rows else None, tx, rx, partial=partial, named=label)
        data.update(peak_columns(rows, gpus, maxima, tx, rx, maximum_name=label.of))
        return data

    def current() -> tuple[dict[str, list[Any]], int]:
        rows, seq = recent_rows(ctx.store, ctx.interval_s)
        return ctx.ticks.rows(("throughput bars", title), rows, compute), seq

    data, seq = current()
    source = ColumnDataSource(data=data)
    follow(doc, ctx, seq, lambda _new: patch_changed(source, current()[0]), batch=refresh_batch(ctx))

    def make() -> figure:
        fig = bar_figure(f"{title} per direction (pale bar: each GPU's {label.legend})",
                         [gpu_label(gpu) for gpu in gpus], value_label="rate", unit=Unit.RATE,
                         maximum=largest(maxima), vertical=True)
        limit = fig.vbar(x="gpu", top="max_bar", width=0.85, source=source, color=LOST_COLOR,
                         alpha=BACKGROUND_ALPHA)
        tx_bars = fig.vbar(x=dodge("gpu", -BAR_OFFSET, range=fig.x_range), top="tx", width=BAR_WIDTH, source=source,
                           color=TX_COLOR, line_color=None)
        rx_bars = fig.vbar(x=dodge("gpu", BAR_OFFSET, range=fig.x_range), top="rx", width=BAR_WIDTH, source=source,
                           color=RX_COLOR, line_color=None)
        # In the text colour, not the bars': a marker sits on its own bar, and blue and orange mean TX and RX.
        markers = [_peak_marker(fig, source, f"{direction}_peak", offset, text_color(dark))
                   for direction, offset in (("tx", -BAR_OFFSET), ("rx", BAR_OFFSET))]
        fig.add_layout(bar_labels(source, "gpu", 0.0, "note", dark=dark, vertical=True))
        add_legend_above(fig, [legend_item("TX (sent)", tx_bars),
                               legend_item("RX (received)", rx_bars),
                               LegendItem(label=PEAK_LABEL, renderers=markers),
                               legend_item(label.legend, limit)])
        hover_on: list[DataRenderer] = [limit] if largest(maxima) is not None else [tx_bars, rx_bars]
        add_bar_hover(fig, hover_on, [("GPU", "@description"), ("TX", "@tx_text"), ("RX", "@rx_text"),
                                      (f"TX {PEAK_LABEL}", "@tx_peak_text"), (f"RX {PEAK_LABEL}", "@rx_peak_text"),
                                      (label.legend, "@max_text")])
        return fig

    add_page(doc, title, Later(make), dark=dark, staging=ctx.staging)
