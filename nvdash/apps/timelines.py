"""Stacked, x-aligned timelines: live (backfilled from the store, then streamed with rollover) or, chosen with
the time range control, a past range from the history (bucket means as lines over min-max bands)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from bokeh.core.properties import value
from bokeh.document import Document
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, Line, Patch
from bokeh.models.annotations import LegendItem
from bokeh.models.renderers import DataRenderer, GlyphRenderer
from bokeh.plotting import figure

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    TIME_FORMATS_JS,
    Unit,
    add_legend_above,
    add_page,
    add_timeline_hover,
    gpu_color,
    gpu_description,
    gpu_label,
    legend_item,
    set_time_tick_format,
    source_view,
    timeline_figure,
    timeline_range,
)
from nvdash.apps.rows import FloatArray, column, gpu_sample, gpu_value, time_ms
from nvdash.apps.theme import apply_theme
from nvdash.apps.time_range import TimeRangeControl
from nvdash.history.query import HistoryResult
from nvdash.history.query import Series as HistorySeries
from nvdash.live.follow import Follower, follow, pause_toggle, refresh_batch, streamable
from nvdash.live.stages import Stage, StagedGrid, run_in_stages
from nvdash.live.ticks import TickCache, opening_columns
from nvdash.sampling.records import GpuInfo, GpuSample, Snapshot
from nvdash.store import Store

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
    metric: str | None = None
    """The history metric (``nvdash.history.catalog.METRICS``) drawn for a past range; ``None``: nothing there."""


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
    key: str, gpus: Iterable[GpuInfo], read: Callable[[GpuSample], float | None], metric: str | None = None
) -> tuple[Series, ...]:
    """One line per GPU, coloured by GPU index, reading ``read`` live and history ``metric`` for a past range."""
    return tuple(
        Series(f"{key}/{gpu.index}", gpu_label(gpu), gpu_description(gpu), gpu_color(gpu.index),
               gpu_value(gpu.index, read), gpu.index, metric=metric)
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
                      name=item.key, nonselection_glyph=None, muted_glyph=None, view=source_view(source))
        for item in series
    ]


RANGE_TICKS_JS = TIME_FORMATS_JS + """
const moment = new Date(tick);
const span = ticks.length > 1 ? Math.abs(ticks[ticks.length - 1] - ticks[0]) : 0;
if (span < 12 * 3600e3) {
  return formats.time.format(moment);
}
return formats.day.format(moment) + " " + formats.minutes.format(moment);
"""
"""Local time ticks as Live shows them; with the date once the axis spans half a day or more (a past range)."""

BAND_ALPHA = 0.2
BAND_X = ":band x"
BAND_Y = ":band y"
BANDS_NAME = "history bands"
ENDS_NAME = "history range ends"


def show_dates_on_long_ranges(fig: figure) -> None:
    """Give ``fig``'s time axis :data:`RANGE_TICKS_JS` ticks."""
    set_time_tick_format(fig, RANGE_TICKS_JS)


def history_metrics(series: Iterable[Series]) -> list[str]:
    """The history metrics of ``series``, each once, in order."""
    return list(dict.fromkeys(item.metric for item in series if item.metric is not None))


def all_series(panels: Sequence[Panel]) -> list[Series]:
    """Every series of every panel."""
    return [item for panel in panels for item in panel.series]


def _nan(size: int) -> FloatArray:
    return np.full(size, math.nan)


def _with_edges(times: FloatArray, result: HistoryResult) -> FloatArray:
    """``times`` between the range's ends (or the outer buckets' centres, where those lie beyond them)."""
    start_ms, end_ms = result.start_s * 1000.0, result.end_s * 1000.0
    first = min(start_ms, float(times[0])) if len(times) else start_ms
    last = max(end_ms, float(times[-1])) if len(times) else end_ms
    return np.concatenate([[first], times, [last]]).astype(np.float64)


def align(result: HistoryResult, series: Iterable[Series], *, edges: bool = False
          ) -> tuple[FloatArray, dict[str, HistorySeries]]:
    """Every series' buckets on one time axis (bucket centres, epoch ms); a series lacking a bucket is NaN there.

    Returns the axis and, per series key, its mean, minimum and maximum on it (a page's metrics share one scope,
    so one step). With ``edges`` the axis also starts and ends at the range's ends (NaN there), so a line drawn
    on it spans the whole range.
    """
    step = result.step_s
    origin = math.floor(result.start_s / step) * step
    found: dict[str, tuple[npt.NDArray[np.int64], HistorySeries]] = {}
    for item in series:
        held = None if item.metric is None else result.series.get(item.metric, {}).get(item.gpu)
        if held is not None and len(held.time_s):
            found[item.key] = (np.rint((held.time_s - origin) / step).astype(np.int64), held)
    buckets = np.unique(np.concatenate([keys for keys, _ in found.values()])) if found else np.zeros(0, np.int64)
    times: FloatArray = np.asarray((origin + (buckets + 0.5) * step) * 1000.0, dtype=np.float64)
    if edges:
        times = _with_edges(times, result)
    lead = 1 if edges else 0
    aligned: dict[str, HistorySeries] = {}
    for key, (keys, held) in found.items():
        at = np.searchsorted(buckets, keys) + lead
        columns = [_nan(len(times)) for _ in range(3)]
        for target, values in zip(columns, (held.mean, held.minimum, held.maximum), strict=True):
            target[at] = values
        aligned[key] = HistorySeries(times / 1000.0, *columns)
    return times, aligned


def history_data(times: FloatArray, aligned: dict[str, HistorySeries], panels: Sequence[Panel]) -> DataDict:
    """Line columns for a past range: ``time`` and each series' bucket means (NaN: no reading, or no metric)."""
    data: DataDict = {"time": times}
    for item in all_series(panels):
        held = aligned.get(item.key)
        data[item.key] = held.mean if held is not None else _nan(len(times))
    return data


def band_polygon(times: FloatArray, low: FloatArray, high: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The min-max band as polygons for a ``Patch``: for each run of buckets with a value, the upper edge forward
    and the lower edge back, runs separated by NaN (a gap stays a gap)."""
    known = np.flatnonzero(np.isfinite(low) & np.isfinite(high))
    if not len(known):
        return _nan(0), _nan(0)
    breaks = np.flatnonzero(np.diff(known) > 1)
    starts = np.concatenate([[known[0]], known[breaks + 1]])
    ends = np.concatenate([known[breaks], [known[-1]]])
    xs: list[FloatArray] = []
    ys: list[FloatArray] = []
    for first, last in zip(starts, ends, strict=True):
        run = slice(int(first), int(last) + 1)
        xs += [times[run], times[run][::-1], _nan(1)]
        ys += [high[run], low[run][::-1], _nan(1)]
    return np.concatenate(xs), np.concatenate(ys)


class HistoryLayers:
    """What a past range adds to a page's plots: a translucent min-max band under each line, and two invisible
    points at the range's ends so the shared x axis spans the whole range.

    Pages with a history make them with the page (empty in Live); adding renderers to a shown page costs the
    browser about a second (measured by ``benchmarks/history_render.py``). Each band is one ``Patch`` (a polygon
    per run of buckets), far cheaper for the browser to draw than a block per bucket.
    """

    def __init__(self, plots: Sequence[tuple[figure, Sequence[Series], Sequence[GlyphRenderer[Any]]]] = ()) -> None:
        self.plots: list[tuple[figure, Sequence[Series], Sequence[GlyphRenderer[Any]]]] = []
        self.keys: list[str] = []
        self.bands: ColumnDataSource | None = None
        self.ends: ColumnDataSource | None = None
        self.pairs: list[tuple[GlyphRenderer[Any], GlyphRenderer[Any]]] = []
        """Each band with its line; bands are hidden in Live, so the browser skips them while streaming."""
        for fig, series, lines in plots:
            self._record(fig, series, lines)

    def _record(self, fig: figure, series: Sequence[Series], lines: Sequence[GlyphRenderer[Any]]) -> list[str]:
        if not series:
            return []
        self.plots.append((fig, series, lines))
        keys = [item.key for item in series if item.metric is not None]
        self.keys += keys
        return keys

    def _empty(self, keys: Sequence[str], size: int = 0) -> DataDict:
        data: DataDict = {}
        for key in keys:
            data[key + BAND_X] = _nan(size)
            data[key + BAND_Y] = _nan(size)
        return data

    def _make_bands(self, fig: figure, series: Sequence[Series], lines: Sequence[GlyphRenderer[Any]],
                    bands: ColumnDataSource, ends: ColumnDataSource) -> None:
        made: list[GlyphRenderer[Any]] = []
        for item, line in zip(series, lines, strict=True):
            if item.metric is None:
                continue
            glyph = Patch(x=item.key + BAND_X, y=item.key + BAND_Y, fill_color=item.color,
                          fill_alpha=BAND_ALPHA, line_color=None)
            band = GlyphRenderer(data_source=bands, glyph=glyph, name=item.key + " band", visible=False,
                                 nonselection_glyph=None, muted_glyph=None)
            line.js_link("visible", band, "visible")  # hidden with its line from the legend
            made.append(band)
            self.pairs.append((band, line))
        # One change of each plot's renderers (the browser rebuilds a plot's views on every change).
        fig.renderers = [*made, *fig.renderers]
        if fig is self.plots[0][0]:
            fig.add_glyph(ends, Line(x="time", y="zero", line_alpha=0.0), name=ENDS_NAME,
                          nonselection_glyph=None, muted_glyph=None)

    def _make(self) -> tuple[ColumnDataSource, ColumnDataSource]:
        bands = ColumnDataSource(data=self._empty(self.keys), name=BANDS_NAME)
        ends = ColumnDataSource(data={"time": _nan(0), "zero": _nan(0)}, name=ENDS_NAME)
        for fig, series, lines in self.plots:
            self._make_bands(fig, series, lines, bands, ends)
        return bands, ends

    def add(self, fig: figure, series: Sequence[Series], lines: Sequence[GlyphRenderer[Any]]) -> None:
        """A plot added to the page after the layers were made (a page built in stages gets its bands with it)."""
        keys = self._record(fig, series, lines)
        if self.bands is not None and self.ends is not None and series:
            size = len(next(iter(self.bands.data.values()), ()))
            self.bands.data.update(self._empty(keys, size))
            self._make_bands(fig, series, lines, self.bands, self.ends)

    def prepare(self) -> tuple[ColumnDataSource, ColumnDataSource]:
        """The band and range-end sources, made now if not yet (a page opening on a past range makes them while
        it is built, so the browser gets them with the page rather than as new models later)."""
        if self.bands is None or self.ends is None:
            document = self.plots[0][0].document if self.plots else None
            if document is None:
                self.bands, self.ends = self._make()
            else:
                # One recomputation of the document's models for all the new renderers, not one per renderer.
                with document.models.freeze():
                    self.bands, self.ends = self._make()
        return self.bands, self.ends

    def show(self, times: FloatArray, aligned: dict[str, HistorySeries], result: HistoryResult) -> None:
        """The bands of ``aligned`` and the range's ends."""
        bands, ends = self.prepare()
        polygons: dict[str, tuple[FloatArray, FloatArray]] = {}
        for key in self.keys:
            held = aligned.get(key)
            polygons[key] = band_polygon(times, held.minimum, held.maximum) if held is not None else (_nan(0),) * 2
        size = max((len(xs) for xs, _ in polygons.values()), default=0)
        data: DataDict = {}
        for key, (xs, ys) in polygons.items():
            data[key + BAND_X] = _padded(xs, size)
            data[key + BAND_Y] = _padded(ys, size).astype(np.float32)  # half the bytes; ample for a plot
        bands.data = data
        for band, line in self.pairs:
            band.visible = line.visible
        ends.data = {"time": np.array([result.start_s, result.end_s]) * 1000.0, "zero": np.zeros(2)}

    def clear(self) -> None:
        """Nothing drawn (Live)."""
        if self.bands is not None and self.ends is not None:
            self.bands.data = self._empty(self.keys)
            for band, _line in self.pairs:
                band.visible = False
            self.ends.data = {"time": _nan(0), "zero": _nan(0)}


def _padded(values: FloatArray, size: int) -> FloatArray:
    """``values`` with NaN after them up to ``size`` (a source's columns share one length)."""
    return np.concatenate([values, _nan(size - len(values))]) if len(values) < size else values


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


class TimelineView:
    """A page's shared line source: live from the store, or a past range for its time range control."""

    def __init__(self, store: Store, panels: Sequence[Panel], source: ColumnDataSource, layers: HistoryLayers,
                 legends: _LostLegends, *, ticks: TickCache | None = None, name: Hashable = "") -> None:
        self.store = store
        self.panels = panels
        self.ticks = ticks if ticks is not None else TickCache(capacity=4)
        self.name = (name, tuple(item.key for item in all_series(panels)))
        """What the streamed columns are computed from besides the rows: shared by the route's sessions."""
        self.source = source
        self.layers = layers
        self.legends = legends
        self.follower: Follower | None = None
        self.control: TimeRangeControl | None = None

    @property
    def following(self) -> bool:
        """Whether new rows are streamed (not while a past range is shown)."""
        return self.control is None or self.control.live

    def on_rows(self, new: Sequence[Snapshot]) -> None:
        """Stream the new rows in Live; the legends follow the newest reading either way."""
        if self.following:
            data = self.ticks.rows(self.name, new, lambda rows: streamable(timeline_data(rows, self.panels)))
            self.source.stream(data, rollover=self.store.capacity)
        self.legends.update(new[-1])

    def history_request(self) -> tuple[list[str], list[int] | None]:
        return history_metrics(all_series(self.panels)), None

    def _columns(self, rows: Sequence[Snapshot]) -> DataDict:
        return timeline_data(rows, self.panels)

    def store_data(self) -> tuple[DataDict, int]:
        """The columns of every row the store holds (shared by the route's pages) and the newest row's number."""
        return self.ticks.store_columns(("store", self.name), self.store, self._columns)

    def opening(self) -> tuple[DataDict, int, list[Stage]]:
        """The columns to open with, their newest row's number, and the steps to run before :meth:`show_live`
        when the route's columns are cold (see :func:`~nvdash.live.ticks.opening_columns`)."""
        return opening_columns(self.ticks, ("store", self.name), self.store, self._columns)

    def show_live(self) -> None:
        data, seq = self.store_data()
        if self.follower is not None:
            self.follower.seq = seq
        self.source.data = data
        self.layers.clear()
        self.legends.update(self.store.latest())

    def prepare_history(self) -> None:
        """Make the band layers now (see :meth:`HistoryLayers.prepare`)."""
        self.layers.prepare()

    def show_history(self, result: HistoryResult) -> None:
        times, aligned = align(result, all_series(self.panels))
        self.source.data = history_data(times, aligned, self.panels)
        self.layers.show(times, aligned, result)


def _add_plot(fig: figure, panel: Panel, source: ColumnDataSource, items: dict[str, LegendItem],
              legends: _LostLegends) -> tuple[list[GlyphRenderer[Any]], list[tuple[LegendItem, GlyphRenderer[Any]]]]:
    """The panel's lines, legend (labels new to the page) and hover on ``fig``; returns the lines and, for labels
    an earlier plot has, the legend items the caller adds each line to (once ``fig`` is in the document)."""
    lines = add_series_lines(fig, source, panel.series)
    new_items = []
    shared: list[tuple[LegendItem, GlyphRenderer[Any]]] = []
    for series, line in zip(panel.series, lines, strict=True):
        item = items.get(series.legend)
        if item is None:
            item = items[series.legend] = legend_item(series.legend, line)
            legends.add(series, item)
            new_items.append(item)
        else:
            shared.append((item, line))
    per_gpu = any(series.gpu is not None for series in panel.series)
    if len(new_items) > 1 or (new_items and per_gpu):
        add_legend_above(fig, new_items)
    labels = {series.key: series.description for series in panel.series}
    renderers: list[DataRenderer] = list(lines)
    add_timeline_hover(fig, renderers, labels, what=panel.what, value=panel.value, unit=panel.unit)
    return lines, shared


def add_to_legends(doc: Document, shared: Sequence[tuple[LegendItem, GlyphRenderer[Any]]]) -> None:
    """Add each line to its legend item (so the item hides it too), recomputing the document's models once.

    The lines must already be in the document: then no new model appears while the models are frozen, and every
    patch refers to models the viewer has (new models in a frozen document were sent in patches the viewer could
    not resolve)."""
    if not shared:
        return
    with doc.models.freeze():
        for item, line in shared:
            item.renderers.append(line)


def build_timelines(doc: Document, ctx: AppContext, title: str, panels: Sequence[Panel]) -> ColumnDataSource:
    """Fill ``doc`` with one plot per panel over a single shared source; returns that source.

    A legend is shown once per label, above the first plot that has it (the GPUs' above the first plot);
    clicking an entry hides that series in every plot. A panel with a single new host series has none.
    A time range control above the plots switches between Live and a past range. On a server the page is
    built in stages (:mod:`nvdash.live.stages`): its frame first, then a plot (with the data) per event-loop turn.
    """
    dark = apply_theme(doc)
    source = ColumnDataSource()
    x_range = timeline_range()
    legends = _LostLegends()
    layers = HistoryLayers()
    if ctx.history is not None:
        # Made with the page: adding them to a shown page later costs the browser about a second.
        layers.prepare()
    view = TimelineView(ctx.store, panels, source, layers, legends, ticks=ctx.ticks, name=title)
    source.data, seq, warm = view.opening()  # a cold route's columns are computed in slices, then shown
    pause = pause_toggle()
    view.control = TimeRangeControl(doc, ctx, view, x_range, pause=pause, dark=dark)
    view.follower = follow(doc, ctx, seq, view.on_rows, pause, batch=refresh_batch(ctx))
    grid = StagedGrid()
    add_page(doc, title, row(*view.control.widgets(), sizing_mode="stretch_width"), grid.plot, dark=dark)
    items: dict[str, LegendItem] = {}
    made: list[tuple[figure, list[tuple[LegendItem, GlyphRenderer[Any]]]]] = []

    # Three stages per plot, so no turn of the event loop holds the others up for long: the plot is made whole
    # outside the document (a change to a model of a shown document walks all its models again, tens of
    # milliseconds on this page; to a model outside it, nothing), then it joins the page, then its lines join the
    # legend entries an earlier plot has (one change per entry, each sent on its own).
    def make_plot(panel: Panel) -> None:
        fig = timeline_figure(panel.title, panel.y_label, panel.unit, x_range, panel.y_max)
        show_dates_on_long_ranges(fig)
        lines, shared = _add_plot(fig, panel, source, items, legends)
        layers.add(fig, panel.series, lines)
        made.append((fig, shared))

    def join_page() -> None:
        grid.add(made[0][0])

    def join_legends() -> None:
        add_to_legends(doc, made.pop(0)[1])

    def show_legends() -> None:
        legends.update(ctx.store.latest())

    def open_control() -> None:
        if view.control is not None:
            view.control.open()

    stages: list[Stage] = [stage for panel in panels for stage in (partial(make_plot, panel), join_page, join_legends)]
    filled: list[Stage] = [*warm, view.show_live] if warm else []
    run_in_stages(doc, [*filled, *stages, grid.finish, show_legends, open_control], staging=ctx.staging)
    return source
