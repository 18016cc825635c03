"""GPU Memory: each GPU's used memory against its own total, with the driver-reserved part shown apart; a GPU in
MIG mode has a row per MIG instance under its own, each against the instance's own memory."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bokeh.document import Document
from bokeh.models import ColumnDataSource
from bokeh.plotting import figure
from bokeh.transform import linear_cmap

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    BACKGROUND_ALPHA,
    LEVEL_PALETTE,
    LOST_COLOR,
    Unit,
    add_bar_hover,
    add_page,
    bar_figure,
    bar_labels,
    format_bytes,
    format_bytes_of,
    format_pct,
    gpu_description,
    gpu_label,
)
from nvdash.apps.process_bars import bar_categories, refresh, refresh_factors
from nvdash.apps.process_usage import GPU_BAR_HEIGHT, MIG_BAR_HEIGHT, instance_text, mig_rows
from nvdash.apps.rows import gpu_memory_total, gpu_reading
from nvdash.apps.theme import apply_theme
from nvdash.live.follow import follow, latest, refresh_batch
from nvdash.live.stages import Later
from nvdash.sampling.records import GpuInfo, Snapshot

TITLE = "GPU Memory"


RESERVED_COLOR = "#8c564b"

_COLUMNS = ("gpu", "height", "description", "used_bytes", "total_bytes", "used_pct", "bar", "label", "used", "total",
            "reserved_bytes", "reserved_pct", "reserved_left", "reserved")


def _label(used: int | None, reserved: int | None, own_total: int | None, pct: float) -> str:
    text = f"{format_bytes_of(used, own_total)} ({format_pct(pct, 0)})"
    return text if reserved is None else f"{text} + {format_bytes(reserved)} reserved"


def _add_row(data: dict[str, list[Any]], label: str, description: str, *, used: int | None,
             reserved: int | None, own_total: int | None, lost: bool, height: float = GPU_BAR_HEIGHT) -> None:
    pct = 100.0 * used / own_total if used is not None and own_total else math.nan
    reserved_pct = 100.0 * reserved / own_total if reserved is not None and own_total else math.nan
    data["gpu"].append(label)
    data["height"].append(height)
    data["description"].append(description)
    data["used_bytes"].append(math.nan if used is None else float(used))
    data["total_bytes"].append(math.nan if own_total is None else float(own_total))
    data["used_pct"].append(pct)
    data["bar"].append(100.0 if lost else 0.0 if math.isnan(pct) else pct)
    data["label"].append("lost" if lost else _label(used, reserved, own_total, pct))
    data["used"].append("GPU lost" if lost else format_bytes(used))
    data["total"].append(format_bytes(own_total))
    data["reserved_bytes"].append(math.nan if reserved is None else float(reserved))
    data["reserved_pct"].append(reserved_pct)
    data["reserved_left"].append(100.0 if lost or math.isnan(reserved_pct) else 100.0 - reserved_pct)
    data["reserved"].append("n/a" if lost or reserved is None else
                            f"{format_bytes(reserved)} ({format_pct(reserved_pct)})")


def columns(gpus: Sequence[GpuInfo], snapshot: Snapshot | None) -> dict[str, list[Any]]:
    """The bar source: used bytes, own total, used as a percentage of that total, and the reserved part.

    Used memory excludes what the driver reserves; the reserved part is drawn at the end of the bar
    (``reserved_left`` to 100 %), the memory no application can have. A GPU in MIG mode is followed by one row
    per MIG instance, with the instance's own used and total memory.
    """
    data: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    usage = None if snapshot is None else snapshot.usage
    for gpu in gpus:
        sample, lost = gpu_reading(snapshot, gpu.index)
        used = None if sample is None else sample.memory_used_bytes
        reserved = None if sample is None else sample.memory_reserved_bytes
        _add_row(data, gpu_label(gpu), gpu_description(gpu), used=used, reserved=reserved,
                 own_total=gpu_memory_total(gpu, sample), lost=lost)
        for label, instance in mig_rows(usage, gpu.index):
            description = f"{gpu_description(gpu)} / MIG {instance_text(instance)} ({instance.uuid})"
            _add_row(data, label, description, used=instance.memory_used_bytes, reserved=None,
                     own_total=instance.memory_total_bytes, lost=lost, height=MIG_BAR_HEIGHT)
    return data


def build(doc: Document, ctx: AppContext) -> None:
    """Horizontal bars on a 0-100 % of-own-total axis, each labelled ``used / total GiB``; reserved at the end.

    The rows follow the MIG instances: a GPU entering or leaving MIG mode gains or loses its instance rows live.
    """
    dark = apply_theme(doc)
    gpus = ctx.store.inventory.gpus
    snapshot, seq = latest(ctx.store)
    data = columns(gpus, snapshot)
    source = ColumnDataSource(data=data)
    made: list[figure] = []

    def make() -> figure:
        fig = bar_figure("GPU memory used (of each GPU's own total)", list(source.data["gpu"]),
                         value_label="memory used (% of own total)", unit=Unit.PCT, maximum=100.0,
                         vertical=False, headroom=1.0)
        fig.hbar(y="gpu", left=0, right=100, height="height", source=source, color=LOST_COLOR,
                 alpha=BACKGROUND_ALPHA)
        reserved = fig.hbar(y="gpu", left="reserved_left", right=100, height="height", source=source,
                            line_color=None, fill_color=RESERVED_COLOR, fill_alpha=0.5, hatch_pattern="/",
                            hatch_color=RESERVED_COLOR, hatch_alpha=0.9)
        bars = fig.hbar(y="gpu", left=0, right="bar", height="height", source=source, line_color=None,
                        fill_color=linear_cmap("used_pct", LEVEL_PALETTE, 0, 100, nan_color=LOST_COLOR))
        fig.add_layout(bar_labels(source, 100.0, "gpu", "label", dark=dark, vertical=False))
        add_bar_hover(fig, [bars, reserved], [("GPU", "@description"), ("used", "@used"), ("total", "@total"),
                                              ("share", "@used_pct{0.0} %"),
                                              ("reserved by the driver", "@reserved")])
        made.append(fig)
        return fig

    def show(rows: Sequence[Snapshot]) -> None:
        data = columns(gpus, rows[-1])
        if made:
            refresh_factors(bar_categories(made[0]), data["gpu"])
        refresh(source, data)

    follow(doc, ctx, seq, show, batch=refresh_batch(ctx))
    add_page(doc, TITLE, Later(make), dark=dark, staging=ctx.staging)
