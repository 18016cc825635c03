"""Link throughput bars shared by PCIe and NVLink: TX and RX per GPU against that GPU's own maximum."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bokeh.document import Document
from bokeh.models.renderers import DataRenderer
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
)
from nvdash.apps.live import follow_latest
from nvdash.apps.rows import gpu_reading, largest, nan_if_none
from nvdash.apps.theme import apply_theme
from nvdash.sampling.records import GpuInfo, GpuSample, Snapshot

Metric = Callable[[GpuSample], float | None]


def columns(
    gpus: Sequence[GpuInfo],
    maxima: Sequence[float | None],
    snapshot: Snapshot | None,
    tx: Metric,
    rx: Metric,
    *,
    partial: Callable[[GpuSample], bool] | None = None,
) -> dict[str, list[Any]]:
    """The bar source: TX, RX, the GPU's maximum (or the axis top when unknown, for hovering) and texts.

    ``partial`` says when a reading is a lower bound (some NVLink links did not answer): its texts and label
    say so rather than showing a silently smaller number.
    """
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
        data["tx_text"].append("GPU lost" if lost else format_rate_of(tx_value, maximum) + suffix)
        data["rx_text"].append("GPU lost" if lost else format_rate_of(rx_value, maximum) + suffix)
        data["max_text"].append(f"{format_rate(maximum)} per direction")
        data["note"].append("lost" if lost else "partial" if is_partial else "")
    return data


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
) -> None:
    """Grouped TX/RX bars per GPU over a pale bar at the GPU's own link maximum."""
    dark = apply_theme(doc)
    maxima = [maximum(gpu) for gpu in gpus]
    source = follow_latest(doc, ctx, lambda snapshot: columns(gpus, maxima, snapshot, tx, rx, partial=partial),
                           share=("throughput bars", title))
    fig = bar_figure(f"{title} per direction (pale bar: each GPU's link maximum)",
                     [gpu_label(gpu) for gpu in gpus], value_label="rate", unit=Unit.RATE,
                     maximum=largest(maxima), vertical=True)
    limit = fig.vbar(x="gpu", top="max_bar", width=0.85, source=source, color=LOST_COLOR,
                     alpha=BACKGROUND_ALPHA)
    tx_bars = fig.vbar(x=dodge("gpu", -0.2, range=fig.x_range), top="tx", width=0.36, source=source,
                       color=TX_COLOR, line_color=None)
    rx_bars = fig.vbar(x=dodge("gpu", 0.2, range=fig.x_range), top="rx", width=0.36, source=source,
                       color=RX_COLOR, line_color=None)
    fig.add_layout(bar_labels(source, "gpu", 0.0, "note", dark=dark, vertical=True))
    add_legend_above(fig, [legend_item("TX", tx_bars),
                           legend_item("RX", rx_bars),
                           legend_item("link maximum", limit)])
    hover_on: list[DataRenderer] = [limit] if largest(maxima) is not None else [tx_bars, rx_bars]
    add_bar_hover(fig, hover_on, [("GPU", "@description"), ("TX", "@tx_text"), ("RX", "@rx_text"),
                                  ("link maximum", "@max_text")])
    add_page(doc, title, fig, dark=dark)
