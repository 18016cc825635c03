"""GPU Memory by Notebook: one line per Jupyter kernel (legend: its notebook's path) of the GPU memory it holds.

Opens on the last 30 minutes: the history's minutes before the live store's first reading, then the store's
readings; then streams each new process reading. A notebook that starts holding memory gets its line; one that stops
drops to 0 and ends. While the kernels cannot be joined to the GPU processes the page says why, in plain words.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

from bokeh.document import Document
from bokeh.models import ColumnDataSource, DataRange1d, HoverTool, Line, Scatter
from bokeh.models.annotations import Legend, LegendItem
from bokeh.models.renderers import GlyphRenderer
from bokeh.models.widgets import Div
from bokeh.palettes import Category10_10

from nvdash.apps.context import AppContext
from nvdash.apps.figures import Unit, add_legend_above, add_page, text_color, time_hover, timeline_figure
from nvdash.apps.notebook_lines import (
    WINDOW_S,
    Changes,
    NotebookLines,
    Reading,
    history_readings,
    live_readings,
)
from nvdash.apps.theme import apply_theme
from nvdash.history.notebook_table import NotebookMinute, notebook_minutes
from nvdash.history.query import SqliteHistory
from nvdash.live.follow import follow, refresh_batch
from nvdash.sampling.records import Snapshot

TITLE = "GPU Memory by Notebook"
MESSAGE_NAME = "notebook message"
LINE_PREFIX = "notebook "
"""A line's renderer (and source) is named this plus its kernel id."""
ROLLOVER = 20_000
"""The most points a line keeps (a page left open for days at one reading every few seconds)."""
WAITING = "Waiting for the first process reading that joins this Jupyter server's kernels to the GPU processes."

log = logging.getLogger(__name__)


def message(snapshot: Snapshot | None) -> str:
    """Why the newest snapshot cannot say which notebook holds the GPUs; empty when it can."""
    view = None if snapshot is None else snapshot.notebooks
    if view is None:
        return WAITING
    if view.state == "ok":
        return ""
    return view.reason or f"The notebooks cannot be joined to the GPU processes ({view.state})."


def read_minutes(history: SqliteHistory, start_s: float, end_s: float) -> list[NotebookMinute]:
    """The history's notebook minutes of ``[start_s, end_s)`` (blocking: run it off the event loop)."""
    with history.reading() as connection:
        return notebook_minutes(connection, start_s, end_s)


class NotebookMemoryPage:
    """The page's plot, its lines (made as kernels appear) and the message above it."""

    def __init__(self, doc: Document, ctx: AppContext) -> None:
        self.doc = doc
        self.ctx = ctx
        dark = apply_theme(doc)
        self.message = Div(text="", visible=False, name=MESSAGE_NAME, sizing_mode="stretch_width", render_as_text=True,
                           styles={"color": text_color(dark), "font-size": "1.1em", "padding": "4px 8px"})
        self.history_error = ""
        x_range = DataRange1d(range_padding=0.02, follow="end", follow_interval=WINDOW_S * 1000.0)  # newest dot whole
        self.fig = timeline_figure("GPU memory by notebook", "memory used", Unit.BYTES, x_range, None)
        # An invisible point at the window's start, so the page opens on the whole 30 minutes.
        self.ends = ColumnDataSource({"time": [(ctx.clock() - WINDOW_S) * 1000.0], "memory": [0.0]})
        self.fig.add_glyph(self.ends, Line(x="time", y="memory", line_alpha=0.0), name="window start")
        self.legend: Legend = add_legend_above(self.fig, [])
        self.hover = HoverTool(renderers=[], tooltips=[("notebook", "@title"), ("memory", "@memory{bytes}"),
                                                       ("time", "@time{time}")],
                               formatters={"@memory": Unit.BYTES.hover_formatter(), "@time": time_hover(x_range)})
        self.fig.add_tools(self.hover)
        self.lines = NotebookLines()
        self.sources: dict[str, ColumnDataSource] = {}
        self.items: dict[str, LegendItem] = {}
        self.pending: list[Snapshot] | None = None
        """Rows that arrived while the history is read (shown after it)."""
        rows, seq = ctx.store.since(0)
        self.show_message(rows[-1] if rows else None)
        follow(doc, ctx, seq, self.on_rows, batch=refresh_batch(ctx))
        add_page(doc, TITLE, self.message, self.fig, dark=dark, staging=ctx.staging)
        opening = self.readings(rows)
        if isinstance(ctx.history, SqliteHistory):
            self.pending = []
            history = ctx.history

            async def load() -> None:
                await self.load_history(history, opening)

            doc.add_next_tick_callback(cast("Callable[[], None]", load))
        else:
            self.apply(opening)

    def readings(self, rows: Sequence[Snapshot]) -> list[Reading]:
        """The readings of ``rows``, computed once per batch for every session of the route."""
        return self.ctx.ticks.rows((TITLE, "readings"), rows, live_readings)

    async def load_history(self, history: SqliteHistory, opening: list[Reading]) -> None:
        """Draw the history's minutes before the store's first reading, then the store's readings and those that
        came meanwhile."""
        now = self.ctx.clock()
        before = opening[0].time_s if opening else now
        start = min(now - WINDOW_S, before)
        try:
            minutes = await asyncio.get_running_loop().run_in_executor(
                self.ctx.history_executor, read_minutes, history, start, before)
        except Exception as error:  # a damaged or locked file: said on the page; the live readings still shown
            log.warning("notebook memory history: %s", error)
            self.history_error = f"The history could not be read: {error}"
            minutes = []
        pending, self.pending = self.pending or [], None
        self.apply([*history_readings(minutes, before), *opening, *self.readings(pending)])
        self.show_message(self.ctx.store.latest())

    def on_rows(self, rows: Sequence[Snapshot]) -> None:
        self.show_message(rows[-1])
        if self.pending is not None:
            self.pending.extend(rows)
            return
        self.apply(self.readings(rows))

    def show_message(self, snapshot: Snapshot | None) -> None:
        text = " ".join(part for part in (message(snapshot), self.history_error) if part)
        if self.message.text != text:
            self.message.text = text
        if self.message.visible != bool(text):
            self.message.visible = bool(text)

    def apply(self, readings: Sequence[Reading]) -> None:
        changes = self.lines.add(readings)
        for kernel in changes.new:
            self.add_line(kernel, changes)
        for kernel, points in changes.points.items():
            if kernel in changes.new:
                continue
            title = self.lines.titles[kernel]
            self.sources[kernel].stream({"time": points.time, "memory": points.memory,
                                         "title": [title] * len(points.time)}, rollover=ROLLOVER)
        for kernel, title in changes.titles.items():
            if kernel not in changes.new:
                self.items[kernel].label = title

    def add_line(self, kernel: str, changes: Changes) -> None:
        points = changes.points[kernel]
        title = self.lines.titles[kernel]
        source = ColumnDataSource({"time": points.time, "memory": points.memory, "title": [title] * len(points.time)},
                                  name=LINE_PREFIX + kernel)
        color = Category10_10[len(self.sources) % len(Category10_10)]
        line: GlyphRenderer[Any] = self.fig.add_glyph(
            source, Line(x="time", y="memory", line_color=color, line_width=2), name=LINE_PREFIX + kernel,
            nonselection_glyph=None, muted_glyph=None)
        # Each reading also as a dot: a notebook seen for a few seconds is a line too short to see on 30 minutes.
        dots: GlyphRenderer[Any] = self.fig.add_glyph(
            source, Scatter(x="time", y="memory", size=4, fill_color=color, line_color=color),
            nonselection_glyph=None, muted_glyph=None)
        item = LegendItem(label=title, renderers=[line, dots])
        self.sources[kernel] = source
        self.items[kernel] = item
        self.legend.items = [*self.legend.items, item]
        self.hover.renderers = [*self.hover.renderers, line]


def build(doc: Document, ctx: AppContext) -> None:
    """The page (see the module's docstring)."""
    NotebookMemoryPage(doc, ctx)
