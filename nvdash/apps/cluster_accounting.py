"""Cluster Accounting: who used the GPUs of every node over a range (GPU-hours, busy and wasted hours, energy,
efficiency, the time lost to the power cap and to heat), from the nodes' accounting counters in Prometheus
(``nvdash --metrics-accounting`` on each node), grouped by job, pod, user or project, a job that ran on several
nodes being one row; sortable, with a CSV download.

The queries run on the cluster's query threads, off the event loop; the page asks again when a control changes and
every :data:`REFRESH_MS` while it is seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime
from html import escape
from typing import Any, cast

from bokeh.document import Document
from bokeh.models import ColumnDataSource
from bokeh.models.widgets import DataTable, Div, NumberFormatter, TableColumn

from nvdash.accounting.report import Report
from nvdash.apps.accounting_table import csv_href_at, csv_link_html, row_columns, totals_html
from nvdash.apps.context import AppContext
from nvdash.apps.figures import add_page, data_table, text_color
from nvdash.apps.gpu_processes import table_height
from nvdash.apps.range_controls import CUSTOM, RangeControls
from nvdash.apps.theme import apply_theme
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.accounting_report import cluster_range, cluster_report
from nvdash.history.ranges import RangeError
from nvdash.live.visibility import hidden_flag

log = logging.getLogger(__name__)

TITLE = "Cluster Accounting"
REFRESH_MS = 60_000
CSV_PATH = "api/cluster-accounting.csv"
"""Relative to the page, so it resolves behind any proxy prefix."""
BY_LABELS = {"job": "job", "user": "user", "project": "project", "pod": "pod"}
CUSTOM_HINT = "custom range: type a from time (ISO 8601 or Unix seconds) and press Enter"
NO_CLUSTER = "The cluster accounting reads every node's counters from Prometheus: start nvdash with --prometheus URL."
ERROR_COLOR = "#c62828"
LINE_PX = 26


def csv_href(range_name: str, by: str, start: str = "", end: str = "") -> str:
    """The CSV download's relative URL for the page's choices (``from``/``to`` for a custom range)."""
    return csv_href_at(CSV_PATH, range_name, by, start, end)


def _columns() -> list[TableColumn]:
    def number(field: str, title: str, width: int, format: str) -> TableColumn:
        return TableColumn(field=field, title=title, width=width,
                           formatter=NumberFormatter(format=format, text_align="right", nan_format="-"))

    return [
        TableColumn(field="key", title="owner", width=190),
        TableColumn(field="kinds", title="kind", width=95),
        number("gpu_hours", "GPU-hours", 90, "0,0.00[00]"),
        number("busy_hours", "busy h", 80, "0,0.00[00]"),
        number("wasted_hours", "wasted h", 80, "0,0.00[00]"),
        number("efficiency_pct", "efficiency %", 90, "0.0"),
        number("energy_kwh", "energy kWh", 90, "0,0.000"),
        number("power_cap_pct", "power cap %", 90, "0.0"),
        number("thermal_pct", "thermal %", 80, "0.0"),
    ]


def _line(dark: bool, lines: int = 1) -> Div:
    return Div(text="", sizing_mode="stretch_width", height=LINE_PX * lines,
               styles={"color": text_color(dark), "white-space": "nowrap", "overflow": "hidden",
                       "text-overflow": "ellipsis", "line-height": f"{LINE_PX}px"})


class ClusterAccountingView:
    """The page's widgets; :meth:`refresh` asks Prometheus for what the controls describe and :meth:`show` shows
    it."""

    def __init__(self, doc: Document, cluster: ClusterRuntime, dark: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.doc, self.cluster, self.dark, self.clock = doc, cluster, dark, clock
        self.choices = RangeControls(doc, dark, groupings=BY_LABELS, csv_path=CSV_PATH, on_change=self.refresh)
        self.range, self.start, self.end = self.choices.range, self.choices.start, self.choices.end
        self.by, self.csv, self.controls = self.choices.by, self.choices.csv, self.choices.row
        self.status = _line(dark)
        self.status.name = "status"
        self.totals = _line(dark, lines=2)
        self.totals.name = "totals"
        self.source = ColumnDataSource(data=row_columns([]), name="cluster-accounting")
        self.table: DataTable = data_table(self.source, _columns(), dark, autosize_mode="none",
                                           sizing_mode="stretch_width", height=table_height(0),
                                           name="cluster-accounting-table")
        self.loading = False
        self._generation = 0

    def parts(self) -> list[Any]:
        """The page's parts, top to bottom."""
        return [self.status, self.controls, self.totals, self.table]

    def choice(self) -> tuple[dict[str, str], str, str]:
        """The range arguments, the grouping and the CSV link the controls ask for."""
        return self.choices.choice()

    def refresh(self) -> None:
        """Ask Prometheus, on the cluster's query threads, for the rows the controls describe."""
        arguments, by, href = self.choice()
        self._generation += 1
        if self.range.value == CUSTOM and not arguments["from"]:
            self.loading = False
            self._say(CUSTOM_HINT)
            self.csv.text = ""
            return
        try:
            chosen, by = cluster_range(arguments, by, self.clock())
        except RangeError as error:
            self.loading = False
            self._say(f"bad range: {error}", error=True)
            self.csv.text = ""
            return
        self.csv.text = csv_link_html(href, self.dark)
        self.loading = True
        self._say("asking Prometheus …")
        generation = self._generation

        async def load() -> None:
            try:
                report = await asyncio.get_running_loop().run_in_executor(
                    self.cluster.executor, cluster_report, self.cluster, chosen, by)
            except Exception as error:
                if generation == self._generation:
                    self._failed(error)
                return
            if generation == self._generation:
                self.show(report)

        self.doc.add_next_tick_callback(cast("Callable[[], None]", load))

    def _failed(self, error: Exception) -> None:
        log.warning("reading the cluster accounting failed: %s", error)
        self.loading = False
        self._say(f"asking Prometheus failed: {str(error).splitlines()[0] if str(error) else error!r}", error=True)

    def tick(self) -> None:
        """The periodic refresh: skipped while a query runs or while nobody sees the page."""
        if not self.loading and not hidden_flag(self.doc).disabled:
            self.refresh()

    def show(self, report: Report) -> None:
        """Fill the table and the totals from ``report``."""
        self.loading = False
        data = row_columns(report.rows)
        self.source.data = data
        self.table.height = table_height(len(data["key"]))
        self.totals.text = totals_html(report)
        count = len(report.rows)
        noun = BY_LABELS.get(report.by, report.by)
        start = datetime.fromtimestamp(report.range.start_s).strftime("%Y-%m-%d %H:%M")
        end = datetime.fromtimestamp(report.range.end_s).strftime("%Y-%m-%d %H:%M")
        self._say(f"all nodes, from Prometheus · {start} to {end} · {count} {noun}{'' if count == 1 else 's'} · "
                  f"updated {datetime.now().strftime('%H:%M:%S')}")

    def _say(self, text: str, error: bool = False) -> None:
        line = escape(text.splitlines()[0] if text else "")
        self.status.text = f'<span style="color:{ERROR_COLOR}">{line}</span>' if error else line


def build(doc: Document, ctx: AppContext) -> None:
    """The controls and the table, filled now and refreshed every :data:`REFRESH_MS`."""
    dark = apply_theme(doc)
    if ctx.cluster is None:
        note = _line(dark)
        note.text = NO_CLUSTER
        add_page(doc, TITLE, note, dark=dark)
        return
    view = ClusterAccountingView(doc, ctx.cluster, dark)
    add_page(doc, TITLE, *view.parts(), dark=dark)
    view.refresh()
    doc.add_periodic_callback(view.tick, REFRESH_MS)
    hidden_flag(doc).on_change("disabled", lambda _attr, _old, hidden: None if hidden else view.tick())
