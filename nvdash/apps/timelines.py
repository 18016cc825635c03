"""Stacked, x-aligned live timelines: backfilled from the store, then streamed with rollover."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bokeh.core.properties import value
from bokeh.document import Document
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, Line
from bokeh.models.annotations import LegendItem
from bokeh.models.renderers import DataRenderer, GlyphRenderer
from bokeh.plotting import figure

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    Unit,
    add_legend_above,
    add_page,
    add_timeline_hover,
    gpu_color,
    gpu_description,
    gpu_label,
    legend_item,
    timeline_figure,
    timeline_range,
)
from nvdash.apps.live import follow, pause_toggle
from nvdash.apps.rows import column, gpu_sample, gpu_value, time_ms
from nvdash.apps.theme import apply_theme
from nvdash.sampling.records import GpuInfo, GpuSample, Snapshot

if TYPE_CHECKING:
    from bokeh.models.sources import DataDict


@dataclass(frozen=True)
class Series:
    """One line: its source column (also the renderer's name), legend text, tooltip text and reader."""

    key: str
    legend: str
    description: str
    color: str
    value: Callable[[Snapshot], float | None]
    gpu: int | None = None
    """The GPU the line belongs to, so its legend can say when that GPU is lost."""
    dash: str = "solid"
    """The line's dash pattern (limits and thresholds are dashed)."""


@dataclass(frozen=True)
class Panel:
    """One plot of the stack."""

    title: str
    y_label: str
    unit: Unit
    series: tuple[Series, ...]
    y_max: float | None = None
    what: str = "GPU"
    """The tooltip's name for a series (``GPU``, ``series``)."""
    value: str = "value"
    """The tooltip's name for the value (``utilization``, ``rate``)."""


def gpu_series(
    key: str, gpus: Iterable[GpuInfo], metric: Callable[[GpuSample], float | None]
) -> tuple[Series, ...]:
    """One line per GPU, coloured by GPU index, reading ``metric``."""
    return tuple(
        Series(f"{key}/{gpu.index}", gpu_label(gpu), gpu_description(gpu), gpu_color(gpu.index),
               gpu_value(gpu.index, metric), gpu.index)
        for gpu in gpus
    )


def timeline_data(rows: Sequence[Snapshot], panels: Sequence[Panel]) -> DataDict:
    """Columns for ``rows``: ``time`` (epoch ms) and one per series, NaN where unknown."""
    data: DataDict = {"time": time_ms(rows)}
    for panel in panels:
        for series in panel.series:
            data[series.key] = column(rows, series.value)
    return data


def add_series_lines(fig: figure, source: ColumnDataSource, series: Sequence[Series]) -> list[GlyphRenderer[Any]]:
    """One line per series on ``fig`` over ``source``, each renderer named by its column."""
    # No selection or mute styling is used: skip the two extra glyph models fig.line() makes per line.
    return [
        fig.add_glyph(source, Line(x="time", y=item.key, line_color=item.color, line_width=2, line_dash=item.dash),
                      name=item.key, nonselection_glyph=None, muted_glyph=None)
        for item in series
    ]


class _LostLegends:
    """Appends ``(lost)`` to the legend entries of GPUs whose newest sample says they are lost."""

    def __init__(self) -> None:
        self.items: dict[int, list[tuple[LegendItem, str]]] = {}
        self.lost: dict[int, bool] = {}

    def add(self, series: Series, item: LegendItem) -> None:
        if series.gpu is not None:
            self.items.setdefault(series.gpu, []).append((item, series.legend))

    def update(self, snapshot: Snapshot | None) -> None:
        for gpu, items in self.items.items():
            sample = gpu_sample(snapshot, gpu)
            lost = sample is not None and sample.lost
            if self.lost.get(gpu, False) != lost:
                self.lost[gpu] = lost
                for item, legend in items:
                    item.label = value(f"{legend} (lost)" if lost else legend)


def build_timelines(doc: Document, ctx: AppContext, title: str, panels: Sequence[Panel]) -> ColumnDataSource:
    """Fill ``doc`` with one plot per panel over a single shared source; returns that source.

    A legend is shown once per label, above the first plot that has it (the GPUs' above the first plot);
    clicking an entry hides that series in every plot. A panel with a single new host series has none.
    """
    dark = apply_theme(doc)
    rows, seq = ctx.store.since(0)
    source = ColumnDataSource(data=timeline_data(rows, panels))
    x_range = timeline_range()
    legends = _LostLegends()
    items: dict[str, LegendItem] = {}
    figures = []
    for panel in panels:
        fig = timeline_figure(panel.title, panel.y_label, panel.unit, x_range, panel.y_max)
        renderers: list[DataRenderer] = []
        new_items = []
        for series, line in zip(panel.series, add_series_lines(fig, source, panel.series), strict=True):
            renderers.append(line)
            item = items.get(series.legend)
            if item is None:
                item = items[series.legend] = legend_item(series.legend, line)
                legends.add(series, item)
                new_items.append(item)
            else:
                item.renderers.append(line)
        per_gpu = any(series.gpu is not None for series in panel.series)
        if len(new_items) > 1 or (new_items and per_gpu):
            add_legend_above(fig, new_items)
        labels = {series.key: series.description for series in panel.series}
        add_timeline_hover(fig, renderers, labels, what=panel.what, value=panel.value, unit=panel.unit)
        figures.append(fig)
    legends.update(rows[-1] if rows else None)

    def on_rows(new: Sequence[Snapshot]) -> None:
        source.stream(timeline_data(new, panels), rollover=ctx.store.capacity)
        legends.update(new[-1])

    pause = pause_toggle()
    follow(doc, ctx, seq, on_rows, pause)
    grid = gridplot([[fig] for fig in figures], sizing_mode="stretch_both", merge_tools=True,
                    toolbar_location="right")
    add_page(doc, title, pause, grid, dark=dark)
    return source
