"""Figure code shared by every app: unit formatters (Python and JavaScript), colours, figure defaults."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Any, TypeVar

from bokeh.document import Document
from bokeh.layouts import column
from bokeh.model import Model
from bokeh.models import (
    AdaptiveTicker,
    CDSView,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    CustomJSTickFormatter,
    DataRange1d,
    DatetimeAxis,
    DatetimeTicker,
    FactorRange,
    Grid,
    HoverTool,
    Range,
    Range1d,
    Ticker,
)
from bokeh.models.annotations import LabelSet, Legend, LegendItem
from bokeh.models.css import InlineStyleSheet, Styles, StyleSheet
from bokeh.models.renderers import DataRenderer, GlyphRenderer
from bokeh.models.ui import UIElement
from bokeh.models.widgets import DataTable, TableColumn
from bokeh.palettes import Category10_10, Viridis256
from bokeh.plotting import figure

from nvdash.live.stages import Later, Staging, run_in_stages
from nvdash.live.visibility import hidden_flag
from nvdash.sampling.records import GpuInfo
from nvdash.units import (
    IEC_UNITS,
    RATE_UNITS,
    format_bytes,
    format_bytes_of,
    format_pct,
    format_rate,
    format_rate_of,
    is_known,
)

__all__ = ["format_bytes", "format_bytes_of", "format_pct", "format_rate", "format_rate_of"]


GPU_COLORS: tuple[str, ...] = tuple(Category10_10)
LEVEL_PALETTE: tuple[str, ...] = tuple(Viridis256)
"""Maps a 0-100 % level (utilization, memory use) to a colour."""
DARK_BACKGROUND = "#15191c"
"""The dark theme's border colour, behind the whole page so no white frame remains."""
LOST_COLOR = "#9e9e9e"
BACKGROUND_ALPHA = 0.25
TX_COLOR = "#1f77b4"
"""Sent (TX) on every page: a GPU's PCIe and NVLink TX, the host's network "sent"."""
RX_COLOR = "#ff7f0e"
"""Received (RX) on every page: a GPU's PCIe and NVLink RX, the host's network "received"."""

STATUS_COLORS: dict[str, str] = {
    "ok": "#2ca02c", "info": "#1f77b4", "warning": "#e69500", "critical": "#d62728",
}
"""The colour of a health status or an event severity."""

BLOCK_WIDTH = 1.05
"""A reading drawn as a block (status strips, event bands) is this many intervals wide, so neighbours meet."""

TIMELINE_TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
BAR_TOOLS = "save"


def gpu_color(index: int) -> str:
    """The colour of GPU ``index``, the same in every plot."""
    return GPU_COLORS[index % len(GPU_COLORS)]


def gpu_label(info: GpuInfo) -> str:
    """The short name of a GPU on axes and legends."""
    return f"GPU {info.index}"


def gpu_description(info: GpuInfo) -> str:
    """The long name of a GPU in tooltips, e.g. ``0: NVIDIA H100 80GB HBM3``."""
    return f"{info.index}: {info.name}"


def text_color(dark: bool) -> str:
    """A label colour readable on the light or the dark theme."""
    return "#e0e0e0" if dark else "#333333"


_JS_SCALED = """
function fmt_scaled(v, base, units, trim) {
  if (v == null || Number.isNaN(v)) return "n/a";
  let x = Math.abs(v), i = 0;
  while (x >= base && i < units.length - 1) { x /= base; i += 1; }
  let s = i === 0 ? x.toFixed(0) : x.toFixed(1);
  if (trim) s = String(parseFloat(s));
  return (v < 0 ? "-" : "") + s + " " + units[i];
}
function fmt_plain(v, suffix) {
  if (v == null || Number.isNaN(v)) return "n/a";
  return v.toFixed(0) + suffix;
}
function fmt_pct(v, trim) {
  if (v == null || Number.isNaN(v)) return "n/a";
  return (trim ? String(parseFloat(v.toFixed(1))) : v.toFixed(1)) + " %";
}
"""


class Unit(Enum):
    """What a value axis carries, and how it is labelled on ticks and in tooltips."""

    PCT = "pct"
    BYTES = "bytes"
    RATE = "rate"
    CELSIUS = "celsius"
    WATTS = "watts"
    MHZ = "mhz"

    def _js(self, name: str, trim: bool) -> str:
        flag = "true" if trim else "false"
        if self is Unit.PCT:
            return f"return fmt_pct({name}, {flag});"
        if self in _PLAIN_SUFFIXES:
            return f"return fmt_plain({name}, {json.dumps(_PLAIN_SUFFIXES[self])});"
        base, units = (1024, IEC_UNITS) if self is Unit.BYTES else (1000, RATE_UNITS)
        return f"return fmt_scaled({name}, {base}, {json.dumps(units)}, {flag});"

    def tick_formatter(self) -> CustomJSTickFormatter:
        """Axis tick labels in human units (``16 GiB``, ``2.5 GB/s``, ``50 %``)."""
        return CustomJSTickFormatter(code=_JS_SCALED + self._js("tick", trim=True))

    def hover_formatter(self) -> CustomJSHover:
        """Tooltip values in human units with one decimal."""
        return CustomJSHover(code=_JS_SCALED + self._js("value", trim=False))

    def ticker(self) -> Ticker | None:
        """Power-of-two ticks for bytes (``16 GiB``, not ``18.6 GiB``); the default otherwise."""
        return AdaptiveTicker(base=2, mantissas=[1], min_interval=1) if self is Unit.BYTES else None


_PLAIN_SUFFIXES = {Unit.CELSIUS: " °C", Unit.WATTS: " W", Unit.MHZ: " MHz"}

TIME_FORMATS_JS = """
const formats = globalThis.__nvdashTimeFormats ??= {
  time: new Intl.DateTimeFormat([], {hour12: false, hour: "numeric", minute: "numeric", second: "numeric"}),
  day: new Intl.DateTimeFormat([], {month: "short", day: "numeric"}),
  minutes: new Intl.DateTimeFormat([], {hour12: false, hour: "2-digit", minute: "2-digit"}),
};
"""
"""Local-time formatters made once per page: ``Date.toLocaleTimeString`` with options builds a new one per call
(72 us against 1.4 us per label in the tests' chromium), and a timeline's axes format their labels on every redraw.
``time`` formats as ``toLocaleTimeString([], {hour12: false})`` does (hour, minute and second by default)."""

_LOCAL_TIME_JS = TIME_FORMATS_JS + """
return formats.time.format(new Date(%s));
"""


def _value_range(maximum: float | None, headroom: float = 1.02) -> Range:
    if maximum is not None and is_known(maximum) and maximum > 0:
        return Range1d(start=0, end=maximum * headroom)
    return DataRange1d(start=0)


def _style_value_axis(fig: figure, unit: Unit, label: str, vertical: bool = True) -> None:
    axis = fig.yaxis if vertical else fig.xaxis
    axis.axis_label = label
    axis.formatter = unit.tick_formatter()
    ticker = unit.ticker()
    if ticker is not None:
        axis.ticker = ticker


class _PageParts:
    """Models that the stacked timelines of one page share rather than each making its own: the time axis's
    ticker (13 models each), its label formatters and the hover's time formatter and gap filter.

    Every model of a shown page is walked again at each change to it and sent, built and kept by the browser;
    sharing took GPU Resources from 327 models to about 220.
    """

    def __init__(self) -> None:
        self.ticker = DatetimeTicker()
        self.tick_formatters: dict[str, CustomJSTickFormatter] = {}
        self.hover_time = CustomJSHover(code=_LOCAL_TIME_JS % "value")
        self.skip_gaps = CustomJS(code=SKIP_GAPS_JS)

    def tick_formatter(self, code: str) -> CustomJSTickFormatter:
        """The page's one tick formatter running ``code``."""
        formatter = self.tick_formatters.get(code)
        if formatter is None:
            formatter = self.tick_formatters[code] = CustomJSTickFormatter(code=code)
        return formatter


T = TypeVar("T")


def _kept_on(model: Model, attribute: str, make: Callable[[], T]) -> T:
    """What ``make`` made the first time it was asked for on ``model``, kept as ``model``'s private ``attribute``.

    Kept on the model it belongs to, not in a module-level map: the shared models refer to their document once
    they are in one, and the document to ``model``, so a map from ``model`` to them would keep every page ever
    shown alive.
    """
    kept: T | None = getattr(model, attribute, None)
    if kept is None:
        kept = make()
        setattr(model, attribute, kept)
    return kept


def _page_parts(x_range: Range) -> _PageParts:
    """The shared models of the page whose timelines share ``x_range``."""
    return _kept_on(x_range, "_nvdash_page_parts", _PageParts)


def time_hover(x_range: Range) -> CustomJSHover:
    """The hover formatter of local times for the page whose timelines share ``x_range`` (``@time{time}``)."""
    return _page_parts(x_range).hover_time


def source_view(source: ColumnDataSource) -> CDSView:
    """One view (all rows) for every line drawn from ``source``, instead of a view and a filter per line."""
    return _kept_on(source, "_nvdash_source_view", CDSView)


def set_time_tick_format(fig: figure, code: str) -> None:
    """Format ``fig``'s time axis labels with the JavaScript function body ``code`` (shared per page)."""
    fig.xaxis.formatter = _page_parts(fig.x_range).tick_formatter(code)


def timeline_figure(title: str, y_label: str, unit: Unit, x_range: Range, y_max: float | None) -> figure:
    """A live timeline: local-time x axis (shared between stacked plots), value axis from 0."""
    fig = figure(
        title=title,
        x_axis_type=None,
        x_range=x_range,
        y_range=_value_range(y_max),
        tools=TIMELINE_TOOLS,
        active_drag="xpan",
        sizing_mode="stretch_both",
        min_width=300,
        min_height=120,
        min_border_left=80,
        min_border_right=20,
    )
    parts = _page_parts(x_range)
    axis = DatetimeAxis(ticker=parts.ticker)
    fig.add_layout(axis, "below")
    fig.add_layout(Grid(dimension=0, axis=axis), "center")
    fig.xaxis.formatter = parts.tick_formatter(_LOCAL_TIME_JS % "tick")
    _style_value_axis(fig, unit, y_label)
    fig.toolbar.logo = None
    return fig


def timeline_range() -> DataRange1d:
    """The x range shared by the stacked timelines of one page."""
    return DataRange1d(range_padding=0)


SKIP_GAPS_JS = """
const {data_source, vars} = cb_data;
const column = data_source.get_column(vars.name);
return column != null && Number.isFinite(column[vars.index]);
"""
"""A function body, not an ES module: BokehJS would load a module from a ``blob:`` URL."""


def skip_gaps() -> dict[str, CustomJS | list[CustomJS]]:
    """HoverTool ``filters`` that leave a line out of the tooltip where it has no value: a gap (the NaN the
    timelines put between segments, a lost GPU, a past bucket with no reading) shows no "NaN", and a gap in every
    line shows no tooltip at all. Each line's renderer is named after its column."""
    return {"$name": CustomJS(code=SKIP_GAPS_JS)}


def add_timeline_hover(
    fig: figure,
    renderers: Sequence[DataRenderer],
    labels: dict[str, str],
    *,
    what: str,
    value: str,
    unit: Unit,
) -> None:
    """One hover for all lines of a plot; each renderer's name is its column and keys ``labels``."""
    parts = _page_parts(fig.x_range)
    fig.add_tools(
        HoverTool(
            renderers=list(renderers),
            mode="vline",
            filters={"$name": parts.skip_gaps},
            tooltips=[(what, "$name{label}"), (value, "@$name{value}"), ("time", "@time{time}")],
            formatters={
                "$name": CustomJSHover(args={"labels": labels}, code="return labels[value] ?? value;"),
                "@$name": unit.hover_formatter(),
                "@time": parts.hover_time,
            },
        )
    )


def legend_item(label: str, renderer: GlyphRenderer[Any]) -> LegendItem:
    """A legend entry for one renderer."""
    return LegendItem(label=label, renderers=[renderer])


_COMPACT_LEGEND: dict[str, Any] = {
    "padding": 2, "margin": 2, "spacing": 14, "border_line_alpha": 0, "background_fill_alpha": 0,
    "label_text_font_size": "0.9em", "label_height": 14, "glyph_height": 14,
}


def add_legend_above(fig: figure, items: Iterable[LegendItem]) -> Legend:
    """A compact, horizontal, clickable legend above the plot so it never covers data."""
    legend = Legend(items=list(items), orientation="horizontal", click_policy="hide", location="top_left",
                    **_COMPACT_LEGEND)
    fig.add_layout(legend, "above")
    return legend


def bar_figure(
    title: str,
    factors: Sequence[str],
    *,
    value_label: str,
    unit: Unit,
    maximum: float | None,
    vertical: bool,
    headroom: float = 1.12,
) -> figure:
    """A bar chart with one category per GPU (the first on top when horizontal).

    The value axis runs from 0 to ``maximum`` times ``headroom`` (room for labels above the bars).
    """
    categories = FactorRange(factors=list(factors) if vertical else list(reversed(factors)))
    values = _value_range(maximum, headroom)
    fig = figure(
        title=title,
        x_range=categories if vertical else values,
        y_range=values if vertical else categories,
        tools=BAR_TOOLS,
        sizing_mode="stretch_both",
        min_width=200,
        min_height=150,
    )
    _style_value_axis(fig, unit, value_label, vertical)
    (fig.xgrid if vertical else fig.ygrid).grid_line_color = None
    fig.toolbar.logo = None
    return fig


def add_bar_hover(fig: figure, renderers: Sequence[DataRenderer], tooltips: list[tuple[str, str]]) -> None:
    """A hover on bars whose tooltips read precomputed text columns."""
    fig.add_tools(HoverTool(renderers=list(renderers), tooltips=tooltips, point_policy="follow_mouse"))


def bar_labels(
    source: ColumnDataSource, x: str | float, y: str | float, text: str, *, dark: bool, vertical: bool
) -> LabelSet:
    """Text on bars (values, ``lost``) on a translucent backing so it reads over any colour."""
    return LabelSet(
        source=source,
        x=x,
        y=y,
        text=text,
        text_color=text_color(dark),
        text_font_size="0.9em",
        text_align="center" if vertical else "right",
        text_baseline="bottom" if vertical else "middle",
        x_offset=0 if vertical else -6,
        y_offset=4 if vertical else 0,
        background_fill_color=DARK_BACKGROUND if dark else "#ffffff",
        background_fill_alpha=0.6,
    )


def add_page(doc: Document, title: str, *children: UIElement | Later, dark: bool,
             staging: Staging | None = None) -> None:
    """Title the document and add its content stacked so it fills the pane or browser window (with the invisible
    flag by which the browser says when nobody can see the page: :mod:`nvdash.live.visibility`). The
    :class:`~nvdash.live.stages.Later` parts are made after the page's frame with ``staging`` (on a server), else
    at once."""
    doc.title = title
    styles = {"background-color": DARK_BACKGROUND} if dark else {}
    parts = [child.place if isinstance(child, Later) else child for child in children]
    doc.add_root(column(*parts, hidden_flag(doc), sizing_mode="stretch_both", styles=styles))
    later = [stage for child in children if isinstance(child, Later) for stage in child.stages()]
    if later:
        run_in_stages(doc, later, staging=staging)


DARK_TABLE_CSS = """
.slick-header-column, .slick-header-columns, .slick-row, .slick-cell, .slick-viewport, .bk-data-table {
  background-color: #15191c; color: #e0e0e0; border-color: #3a3f44;
}
.slick-row.odd, .slick-row.odd .slick-cell { background-color: #1f2428; }
"""


def table_stylesheets(dark: bool) -> list[StyleSheet | str | dict[str, dict[str, str | None] | Styles]]:
    """Stylesheets that make a DataTable readable on the dark theme (none on the light one)."""
    return [InlineStyleSheet(css=DARK_TABLE_CSS)] if dark else []


REDRAW_TABLE_JS = """
const view = Bokeh.index.find_one(table);
if (view != null) {
  view.updateGrid();
}
"""


def data_table(source: ColumnDataSource, columns: list[TableColumn], dark: bool, **options: Any) -> DataTable:
    """A sortable DataTable without an index column, styled for the theme, that shows every new ``data``.

    BokehJS (3.9) redraws a DataTable only when its rows change in number (its view's indices); new values in as
    many rows would stay unseen. So each new ``data`` also asks the table's view to redraw (keeping the sort).
    """
    table = DataTable(source=source, columns=columns, index_position=None, sortable=True,
                      stylesheets=table_stylesheets(dark), **options)
    source.js_on_change("data", CustomJS(args={"table": table}, code=REDRAW_TABLE_JS))
    return table
