"""GPU Accounting: who used the GPUs over a range (GPU-hours, busy and wasted hours, energy, memory, the share of
their GPU time lost to the power cap and to thermal slowdown), grouped by job, pod, user or project, with a CSV
download, the owners who wasted the most and the allocations idle now.

The report reads the history's SQLite file, so it is made in the history executor, off the event loop, and shown
from a next-tick callback; the page asks again when a control changes and every :data:`REFRESH_MS`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from html import escape
from typing import Any, cast

from bokeh.document import Document
from bokeh.models import BasicTickFormatter, ColumnDataSource, DataRange1d, FactorRange, HoverTool
from bokeh.models.widgets import (
    DataTable,
    Div,
    HTMLTemplateFormatter,
    NumberFormatter,
    TableColumn,
)
from bokeh.plotting import figure

from nvdash.accounting.report import (
    AccountingBook,
    RangeError,
    Report,
    accounting_range,
    make_report,
)
from nvdash.accounting.summary import GROUPINGS
from nvdash.apps.accounting_table import (
    CSV_PATH,
    csv_link_html,
    idle_columns,
    idle_note,
    row_columns,
    totals_html,
    waste_columns,
)
from nvdash.apps.context import AppContext
from nvdash.apps.figures import add_page, data_table, gpu_color, text_color
from nvdash.apps.gpu_processes import table_height
from nvdash.apps.range_controls import CUSTOM, RANGE_LABELS, RangeControls
from nvdash.apps.theme import apply_theme
from nvdash.live.visibility import hidden_flag

log = logging.getLogger(__name__)

TITLE = "GPU Accounting"
REFRESH_MS = 30_000
"""The report is hourly tallies: asking again every 30 s is plenty."""
BY_LABELS = {"job": "job", "pod": "pod", "user": "user", "namespace": "namespace/project"}
SOURCE_TEXT = {"history": "from the history file", "memory": "in memory since this server started (no history)",
               "none": "no accounting source"}
CUSTOM_HINT = ("custom range: type a from time (ISO 8601 or Unix seconds) and press Enter; "
               "the accounting is kept per hour, so a range takes in every hour it touches")
NO_ACCOUNTING = "This server keeps no GPU accounting."
ERROR_COLOR = "#c62828"
WASTE_ROW_PX = 24

_RIGHT = '<div style="text-align:right"><%- {} %></div>'


LINE_PX = 26


def _line(dark: bool, lines: int = 1, **styles: str) -> Div:
    """A Div of ``lines`` lines and fixed height (a Div following its text's height makes narrow panes
    relayout)."""
    return Div(text="", sizing_mode="stretch_width", height=LINE_PX * lines,
               styles={"color": text_color(dark), "white-space": "nowrap", "overflow": "hidden",
                       "text-overflow": "ellipsis", "line-height": f"{LINE_PX}px", **styles})


def _heading(text: str, dark: bool) -> Div:
    return Div(text=f"<b>{escape(text)}</b>", sizing_mode="stretch_width", height=26,
               styles={"color": text_color(dark), "font-size": "1.1em", "margin-top": "8px"})


def _table_columns() -> list[TableColumn]:
    def number(field: str, title: str, width: int, format: str) -> TableColumn:
        return TableColumn(field=field, title=title, width=width,
                           formatter=NumberFormatter(format=format, text_align="right", nan_format="-"))

    def shown(field: str, text: str, title: str, width: int) -> TableColumn:
        return TableColumn(field=field, title=title, width=width,
                           formatter=HTMLTemplateFormatter(template=_RIGHT.format(text)))

    return [
        TableColumn(field="key", title="owner", width=170),
        TableColumn(field="kinds", title="kind", width=95),
        TableColumn(field="gpus", title="GPUs", width=90),
        number("gpu_hours", "GPU-hours", 85, "0,0.00[00]"),
        number("busy_hours", "busy h", 75, "0,0.00[00]"),
        number("wasted_hours", "wasted h", 75, "0,0.00[00]"),
        number("efficiency_pct", "efficiency %", 90, "0.0"),
        shown("energy_kwh", "energy_text", "energy kWh", 85),
        number("utilization_pct", "mean util %", 85, "0.0"),
        shown("peak_memory_bytes", "peak_memory_text", "peak memory", 95),
        number("power_cap_pct", "power cap %", 85, "0.0"),
        number("thermal_pct", "thermal %", 75, "0.0"),
        TableColumn(field="start", title="start", width=115),
        TableColumn(field="end", title="end", width=115),
    ]


_IDLE_TABLE = (("gpu", "GPU", 45), ("unit", "unit", 330), ("owner", "owner", 220), ("reason", "reason", 200),
               ("idle_min", "idle for (min)", 100), ("memory", "memory held", 95))


def _waste_figure(source: ColumnDataSource) -> figure:
    """Horizontal bars of wasted GPU-hours, one row per owner, the most wasteful on top."""
    owners = list(source.data["owner"])
    fig = figure(title="Wasted GPU-hours by owner (allocated at 0 % utilization; top 10)",
                 y_range=FactorRange(factors=list(reversed(owners))), x_range=DataRange1d(start=0),
                 height=_waste_height(len(owners)), sizing_mode="stretch_width", tools="save", min_width=200,
                 name="waste-figure")
    bars = fig.hbar(y="owner", right="wasted", height=0.7, source=source, fill_color=gpu_color(3), line_color=None)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("owner", "@owner"), ("wasted", "@text")]))
    fig.xaxis.axis_label = "GPU-hours"
    fig.xaxis.formatter = BasicTickFormatter(use_scientific=False)
    fig.ygrid.grid_line_color = None
    fig.toolbar.logo = None
    return fig


def _waste_height(rows: int) -> int:
    return 90 + WASTE_ROW_PX * max(1, rows)


class AccountingView:
    """The page's widgets; :meth:`refresh` asks for the report the controls describe and :meth:`show` shows it."""

    def __init__(self, doc: Document, ctx: AppContext, book: AccountingBook, dark: bool) -> None:
        self.doc, self.ctx, self.book, self.dark = doc, ctx, book, dark
        self.choices = RangeControls(doc, dark, groupings=BY_LABELS, valid=GROUPINGS, csv_path=CSV_PATH,
                                     on_change=self.refresh, by_width=160, placeholders=True)
        self.range, self.start, self.end = self.choices.range, self.choices.start, self.choices.end
        self.by, self.csv, self.controls = self.choices.by, self.choices.csv, self.choices.row
        self.status = _line(dark)
        self.status.name = "status"
        self.totals = _line(dark, lines=2)
        self.totals.name = "totals"
        self.source = ColumnDataSource(data=row_columns([]), name="accounting")
        self.table: DataTable = data_table(self.source, _table_columns(), dark, autosize_mode="none",
                                           sizing_mode="stretch_width", height=table_height(0),
                                           name="accounting-table")
        self.waste_source = ColumnDataSource(data=waste_columns([]), name="waste")
        self.waste = _waste_figure(self.waste_source)
        self.idle_source = ColumnDataSource(data=idle_columns([], 0.0), name="idle-now")
        self.idle = data_table(self.idle_source, [TableColumn(field=field, title=title, width=width)
                                                  for field, title, width in _IDLE_TABLE],
                               dark, autosize_mode="none", sizing_mode="stretch_width", height=table_height(0),
                               name="idle-table", visible=False)
        self.idle_note = _line(dark, opacity="0.8")
        self.loading = False
        self._generation = 0

    def parts(self) -> list[Any]:
        """The page's parts, top to bottom."""
        return [self.status, self.controls, self.totals, self.table,
                _heading("Waste", self.dark), self.waste,
                self.idle_note, self.idle]

    def choice(self) -> tuple[dict[str, str], str, str]:
        """The range arguments, the grouping and the CSV link the controls ask for."""
        return self.choices.choice()

    def refresh(self) -> None:
        """Ask for the report the controls describe: in the history executor, or here without one (tests)."""
        arguments, by, href = self.choice()
        self._generation += 1
        try:
            if self.range.value == CUSTOM and not arguments["from"]:
                self.loading = False
                self._say(CUSTOM_HINT)
                self.csv.text = ""
                return
            chosen = accounting_range(arguments, self.book.clock())
        except RangeError as error:
            self.loading = False
            self._say(f"bad range: {error}", error=True)
            self.csv.text = ""
            return
        self.csv.text = csv_link_html(href, self.dark)
        executor = self.ctx.history_executor
        if executor is None:
            self._finish(lambda: make_report(self.book, chosen, by))
            return
        self.loading = True
        self._say("loading …")
        generation = self._generation

        async def load() -> None:
            try:
                report = await asyncio.get_running_loop().run_in_executor(executor, make_report, self.book,
                                                                          chosen, by)
            except Exception as error:
                if generation == self._generation:
                    self._failed(error)
                return
            if generation == self._generation:
                self.show(report)

        # Bokeh awaits a coroutine callback; its annotation only names plain ones.
        self.doc.add_next_tick_callback(cast("Callable[[], None]", load))

    def _finish(self, make: Callable[[], Report]) -> None:
        try:
            report = make()
        except Exception as error:
            self._failed(error)
        else:
            self.show(report)

    def _failed(self, error: Exception) -> None:
        log.warning("reading the accounting failed: %s", error)
        self.loading = False
        self._say(f"reading the accounting failed: {str(error).splitlines()[0] if str(error) else error!r}",
                  error=True)

    def tick(self) -> None:
        """The periodic refresh: skipped while a query runs or while nobody sees the page."""
        if not self.loading and not hidden_flag(self.doc).disabled:
            self.refresh()

    def show(self, report: Report) -> None:
        """Fill the table, the totals, the waste bars and the idle allocations from ``report``."""
        self.loading = False
        data = row_columns(report.rows)
        self.source.data = data
        self.table.height = table_height(len(data["key"]))
        self.totals.text = totals_html(report)
        waste = waste_columns(report.rows)
        factors = list(reversed(waste["owner"]))
        categories = self.waste.y_range
        if isinstance(categories, FactorRange) and list(categories.factors) != factors:
            categories.factors = factors
        self.waste_source.data = waste
        self.waste.height = _waste_height(len(factors))
        idle = idle_columns(report.idle, report.idle_now_s)
        self.idle_source.data = idle
        self.idle.height = table_height(len(idle["gpu"]))
        self.idle.visible = bool(idle["gpu"])
        self.idle_note.text = escape(idle_note(report))
        count = len(report.rows)
        noun = BY_LABELS.get(report.by, report.by)
        self._say(f"{SOURCE_TEXT.get(report.source, report.source)} · {_describe(report)} · "
                  f"{count} {noun}{'' if count == 1 else 's'} · updated {datetime.now().strftime('%H:%M:%S')}")

    def _say(self, text: str, error: bool = False) -> None:
        line = escape(text.splitlines()[0] if text else "")
        self.status.text = f'<span style="color:{ERROR_COLOR}">{line}</span>' if error else line


def _describe(report: Report) -> str:
    label = report.range.label
    if label in RANGE_LABELS and label != CUSTOM:
        return RANGE_LABELS[label].lower()
    start = datetime.fromtimestamp(report.range.start_s).strftime("%Y-%m-%d %H:%M")
    end = datetime.fromtimestamp(report.range.end_s).strftime("%Y-%m-%d %H:%M")
    return f"{start} to {end} (whole hours)" if label == CUSTOM else f"last {label}"


def build(doc: Document, ctx: AppContext) -> None:
    """The controls, the table and the waste summary, filled now and refreshed every :data:`REFRESH_MS`; only a
    note when the server keeps no accounting."""
    dark = apply_theme(doc)
    if ctx.accounting is None:
        note = _line(dark)
        note.text = NO_ACCOUNTING
        add_page(doc, TITLE, note, dark=dark)
        return
    view = AccountingView(doc, ctx, ctx.accounting, dark)
    add_page(doc, TITLE, *view.parts(), dark=dark)
    view.refresh()
    doc.add_periodic_callback(view.tick, REFRESH_MS)
    hidden_flag(doc).on_change("disabled", lambda _attr, _old, hidden: None if hidden else view.tick())
