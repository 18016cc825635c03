"""GPU Utilization: one bar per GPU, 0-100 %, coloured by how busy it is."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bokeh.document import Document
from bokeh.plotting import figure
from bokeh.transform import linear_cmap

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    LEVEL_PALETTE,
    LOST_COLOR,
    Unit,
    add_bar_hover,
    add_page,
    bar_figure,
    bar_labels,
    format_pct,
    gpu_description,
    gpu_label,
)
from nvdash.apps.rows import gpu_reading, nan_if_none
from nvdash.apps.theme import apply_theme
from nvdash.live.follow import follow_latest
from nvdash.live.stages import Later
from nvdash.sampling.records import GpuInfo, Snapshot

TITLE = "GPU Utilization"


def columns(gpus: Sequence[GpuInfo], snapshot: Snapshot | None) -> dict[str, list[Any]]:
    """The bar source for the newest snapshot: a lost GPU gets a full grey bar labelled ``lost``."""
    data: dict[str, list[Any]] = {name: [] for name in (
        "gpu", "description", "utilization_pct", "bar", "label", "utilization", "temperature", "power")}
    for gpu in gpus:
        sample, lost = gpu_reading(snapshot, gpu.index)
        util = nan_if_none(None if sample is None else sample.utilization_pct)
        known = not math.isnan(util)
        data["gpu"].append(gpu_label(gpu))
        data["description"].append(gpu_description(gpu))
        data["utilization_pct"].append(util)
        data["bar"].append(100.0 if lost else util if known else 0.0)
        data["label"].append("lost" if lost else format_pct(util, 0) if known else "n/a")
        data["utilization"].append("GPU lost" if lost else format_pct(util))
        temperature = None if sample is None else sample.temperature_c
        power = None if sample is None else sample.power_w
        data["temperature"].append("n/a" if temperature is None else f"{temperature:.0f} °C")
        data["power"].append("n/a" if power is None else f"{power:.0f} W")
    return data


def build(doc: Document, ctx: AppContext) -> None:
    """Bars of the newest utilization, patched as new snapshots arrive."""
    dark = apply_theme(doc)
    gpus = ctx.store.inventory.gpus
    source = follow_latest(doc, ctx, lambda snapshot: columns(gpus, snapshot), share="GPU utilization bars")

    def make() -> figure:
        fig = bar_figure("GPU utilization", [gpu_label(gpu) for gpu in gpus], value_label="utilization",
                         unit=Unit.PCT, maximum=100.0, vertical=True)
        bars = fig.vbar(x="gpu", top="bar", width=0.8, source=source, line_color=None,
                        fill_color=linear_cmap("utilization_pct", LEVEL_PALETTE, 0, 100, nan_color=LOST_COLOR))
        fig.add_layout(bar_labels(source, "gpu", "bar", "label", dark=dark, vertical=True))
        add_bar_hover(fig, [bars], [("GPU", "@description"), ("utilization", "@utilization"),
                                    ("temperature", "@temperature"), ("power", "@power")])
        return fig

    add_page(doc, TITLE, Later(make), dark=dark, staging=ctx.staging)
