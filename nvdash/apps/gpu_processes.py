"""GPU Processes: who uses the GPUs. A sortable, filterable table of the processes on each GPU (with their user,
container, pod and MIG instance), a bar per GPU showing which processes fill its memory, the shares of each GPU's
work, power and energy by owner (see ``share_table``), each vGPU or MPS quota against its use (see ``quota_table``),
and the pods that hold a GPU without running anything on it.

Everything comes from the newest snapshot's ``usage`` (refreshed by the sampler every few seconds); the table is
rebuilt only when a new usage reading arrives or a filter changes, and filtering happens here, in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bokeh.document import Document
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, InlineStyleSheet
from bokeh.models.widgets import DataTable, Div, HTMLTemplateFormatter, Select, TableColumn, TextInput
from bokeh.plotting import figure

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    Unit,
    add_bar_hover,
    add_page,
    bar_figure,
    bar_labels,
    data_table,
    text_color,
)
from nvdash.apps.process_bars import bar_categories, refresh, refresh_factors
from nvdash.apps.process_memory import memory_columns
from nvdash.apps.process_notes import IDLE_COLUMNS, idle_columns, idle_note, status_html
from nvdash.apps.process_table import ALL, KEEP_ALL, ProcessFilter, choices, filter_values, table_columns
from nvdash.apps.quota_table import quota_columns, quota_table_columns
from nvdash.apps.share_table import share_columns, share_table_columns
from nvdash.apps.theme import apply_theme
from nvdash.health.quota_judge import store_findings
from nvdash.health.quotas import QuotaFinding, snapshot_findings
from nvdash.live.follow import follow, latest, pause_toggle, refresh_batch
from nvdash.live.stages import Later
from nvdash.live.ticks import TickCache
from nvdash.sampling.records import GpuInfo, Snapshot
from nvdash.sampling.usage_records import Usage

TITLE = "GPU Processes"
BAR_ROW_PX = 30
OPTIONAL_COLUMNS = ("mig", "container", "pod", "namespace")
"""Table columns shown only while some process has a value in them (MIG, containers, pods)."""

_MUTED = "opacity: 0.7;"
_RIGHT = '<div style="text-align:right"><%- {} %></div>'


def columns(usage: Usage | None, keep: ProcessFilter = KEEP_ALL) -> dict[str, list[Any]]:
    """The process table's source for a usage reading, filtered by ``keep`` (see ``process_table``)."""
    return table_columns(usage, keep)


def _table_columns() -> list[TableColumn]:
    def right(field: str, text: str, title: str, width: int) -> TableColumn:
        return TableColumn(field=field, title=title, width=width,
                           formatter=HTMLTemplateFormatter(template=_RIGHT.format(text)))

    def titled(field: str, title: str, width: int, full: str) -> TableColumn:
        return TableColumn(field=field, title=title, width=width, formatter=HTMLTemplateFormatter(
            template=f'<span title="<%- {full} %>"><%- value %></span>'))

    return [
        TableColumn(field="gpu", title="GPU", width=40),
        TableColumn(field="mig", title="MIG instance", width=135),
        TableColumn(field="pid", title="PID", width=70),
        TableColumn(field="user", title="user", width=135),
        titled("container", "container", 185, "container_full"),
        TableColumn(field="pod", title="pod", width=140),
        TableColumn(field="namespace", title="namespace", width=100),
        TableColumn(field="type", title="type", width=120),
        right("memory_bytes", "memory", "GPU memory", 95),
        right("sm_pct", "sm", "SM %", 95),
        right("cpu_pct", "cpu", "host CPU %", 85),
        right("rss_bytes", "rss", "RSS", 75),
        right("runtime_s", "runtime", "runtime", 70),
        titled("command", "command", 640, "command_full"),
    ]


def _table(source: ColumnDataSource, table_columns: list[TableColumn], dark: bool, **size: Any) -> DataTable:
    """A sortable table; columns keep their widths (a narrow pane scrolls sideways rather than cutting text)."""
    return data_table(source, table_columns, dark, autosize_mode="none", **size)


def _memory_figure(rows: list[str], segments: ColumnDataSource, labels: ColumnDataSource, dark: bool) -> figure:
    fig = bar_figure("Who fills each GPU's memory (by process, largest first)", rows,
                     value_label="memory (% of own total)", unit=Unit.PCT, maximum=100.0, vertical=False,
                     headroom=1.0)
    fig.sizing_mode = "stretch_width"
    fig.height = _figure_height(rows)
    bars = fig.hbar(y="row", left="left", right="right", height="height", source=segments, line_color=None,
                    fill_color="color", fill_alpha="alpha", hatch_pattern="hatch", hatch_color="color",
                    hatch_alpha=0.9)
    fig.text(x="left", y="row", text="inside", source=segments, x_offset=4, text_baseline="middle",
             text_font_size="0.8em", text_color="#ffffff")
    fig.add_layout(bar_labels(labels, 100.0, "row", "label", dark=dark, vertical=False))
    add_bar_hover(fig, [bars], [("row", "@row"), ("part", "@part"), ("PID", "@pid"), ("user", "@user"),
                                ("command", "@command"), ("memory", "@memory")])
    return fig


def _figure_height(rows: Sequence[str]) -> int:
    return 90 + BAR_ROW_PX * max(1, len(rows))


def _options(values: Sequence[str]) -> list[str | tuple[Any, str]]:
    return list(values)


def _chosen(value: object) -> str | None:
    """A filter's choice; ``None`` for all. Select's value takes anything a client sends: a non-string is
    no option, so it filters nothing."""
    return value if isinstance(value, str) and value != ALL else None


def _gpu_index(value: str | None) -> int | None:
    """The chosen GPU's index; a value no option has (only a forged message sends one) matches no GPU."""
    if value is None:
        return None
    return int(value) if value.isdecimal() else -1


def _labelled(dark: bool) -> list[Any]:
    """A widget title readable on the page's theme."""
    return [InlineStyleSheet(css=f"label {{ color: {text_color(dark)}; }}")]


def _select(title: str, width: int, dark: bool, options: list[str | tuple[Any, str]] | None = None) -> Select:
    return Select(title=title, value=ALL, options=options or [ALL], width=width, name=f"filter-{title.lower()}",
                  stylesheets=_labelled(dark))


class ProcessesView:
    """The page's widgets and what they last showed; ``on_rows`` follows the store, the filters re-run the table."""

    def __init__(self, gpus: Sequence[GpuInfo], dark: bool, ticks: TickCache | None = None,
                 findings: Callable[[Snapshot | None], tuple[QuotaFinding, ...]] = snapshot_findings) -> None:
        self.gpus = tuple(gpus)
        self.findings = findings
        """The judged quota findings of a snapshot (the store's judge on a server)."""
        self.usage: Usage | None = None
        self.snapshot: Snapshot | None = None
        """The snapshot shown (its usage is :attr:`usage`)."""
        self.ticks = ticks if ticks is not None else TickCache(capacity=8)
        """The bars' and the table's columns, computed once per snapshot for every open page."""
        self._memory_key = ("process memory", tuple(gpu.uuid for gpu in self.gpus))
        style: dict[str, str | None] = {"color": text_color(dark)}
        self.status = Div(text=status_html(None), sizing_mode="stretch_width", styles=style, name="status")
        self.gpu = _select("GPU", 110, dark, [(ALL, ALL), *((str(gpu.index), f"GPU {gpu.index}") for gpu in gpus)])
        self.user, self.namespace, self.pod = (_select(title, width, dark)
                                               for title, width in (("user", 150), ("namespace", 150), ("pod", 200)))
        self.text = TextInput(title="command contains", placeholder="e.g. train.py", width=220,
                              name="filter-command", stylesheets=_labelled(dark))
        for select in (self.gpu, self.user, self.namespace, self.pod):
            select.on_change("value", self._filtered)
        self.text.on_change("value_input", self._filtered)
        self.count = Div(text="", styles={**style, "margin-top": "1.9em"}, name="count")
        self.controls = row(self.gpu, self.user, self.namespace, self.pod, self.text, self.count,
                            sizing_mode="stretch_width", name="filters")
        self.table_source = ColumnDataSource(data=columns(None), name="processes")
        self.table: DataTable | None = None
        """Made after the page's frame (:meth:`make_table`)."""
        self.optional: dict[str, TableColumn] = {}
        segments, labels = memory_columns(gpus, None)
        self.segments = ColumnDataSource(data=segments, name="memory-segments")
        self.labels = ColumnDataSource(data=labels, name="memory-labels")
        self.dark = dark
        self.memory: figure | None = None
        """Made after the page's frame (:meth:`make_memory`)."""
        self.share_title = Div(text="<b>Shares</b> "
                               f'<span style="{_MUTED}">each GPU\'s SM time, memory, power and energy by owner; '
                               "what no owner explains is unattributed</span>",
                               sizing_mode="stretch_width", styles=style, name="share-title", visible=False)
        self.share_source = ColumnDataSource(data=share_columns((), None), name="shares")
        self.share_table = _table(self.share_source, share_table_columns(), dark, sizing_mode="stretch_width",
                                  height=table_height(0), name="share-table", visible=False)
        self.quota_title = Div(text="<b>Quotas</b> "
                               f'<span style="{_MUTED}">each vGPU or MPS quota against its use; '
                               "a finding is flagged</span>",
                               sizing_mode="stretch_width", styles=style, name="quota-title", visible=False)
        self.quota_source = ColumnDataSource(data=quota_columns(None, (), ()), name="quotas")
        self.quota_table = _table(self.quota_source, quota_table_columns(), dark, sizing_mode="stretch_width",
                                  height=table_height(0), name="quota-table", visible=False)
        self.idle_title = Div(text="<b>Allocated, idle</b> "
                              f'<span style="{_MUTED}">GPUs given to a pod that runs nothing on them</span>',
                              sizing_mode="stretch_width", styles=style)
        self.idle_source = ColumnDataSource(data=idle_columns(None), name="idle")
        self.idle = _table(self.idle_source, [TableColumn(field=name, title=title, width=width)
                                              for name, (title, width) in IDLE_COLUMNS.items()],
                           dark, sizing_mode="stretch_width", height=120, name="idle-table")
        self.idle_note = Div(text="", sizing_mode="stretch_width", styles={**style, "opacity": "0.7"},
                             name="idle-note")
        self._show_usage(None)

    def make_table(self) -> DataTable:
        """The process table, showing what the view shows now."""
        self.table = _table(self.table_source, _table_columns(), self.dark, sizing_mode="stretch_width",
                            height=table_height(len(self.table_source.data["pid"])), name="process-table",
                            visible=self.usage is not None)
        self.optional = {column.field: column for column in self.table.columns if column.field in OPTIONAL_COLUMNS}
        self._show_columns(columns(self.usage))
        return self.table

    def _show_columns(self, everything: dict[str, list[Any]]) -> None:
        """Only the optional columns that some process has a value in."""
        for field, column in self.optional.items():
            _set(column, "visible", any(everything[field]))

    def make_memory(self) -> figure:
        """The memory bars, with the rows they show now."""
        self.memory = _memory_figure(list(self.labels.data["row"]), self.segments, self.labels, self.dark)
        return self.memory

    def filter(self) -> ProcessFilter:
        """What the filter widgets say now."""
        return ProcessFilter(gpu=_gpu_index(_chosen(self.gpu.value)), user=_chosen(self.user.value),
                             namespace=_chosen(self.namespace.value), pod=_chosen(self.pod.value),
                             text=self.text.value_input or "")

    def on_rows(self, rows: Sequence[Snapshot]) -> None:
        """Show the newest of the rows that arrived."""
        self.show(rows[-1])

    def show(self, snapshot: Snapshot | None) -> None:
        """Redraw the memory bars from ``snapshot``; the rest only when its usage reading is new."""
        gpus = self.gpus
        segments, labels = self.ticks.latest(self._memory_key, snapshot,
                                             lambda newest: memory_columns(gpus, newest))
        self.snapshot = snapshot
        if self.memory is not None:
            refresh_factors(bar_categories(self.memory), labels["row"])
            _set(self.memory, "height", _figure_height(labels["row"]))
        refresh(self.segments, segments)
        refresh(self.labels, labels)
        self._show_shares(snapshot)
        self._show_quotas(snapshot)
        usage = None if snapshot is None else snapshot.usage
        if usage is not self.usage:
            self.usage = usage
            self._show_usage(usage)

    def _show_shares(self, snapshot: Snapshot | None) -> None:
        """The shares table of ``snapshot`` (computed once per snapshot for every open page); sent only when it
        changed (energy grows with every snapshot while a GPU draws power)."""
        data = self.ticks.latest(("shares",), snapshot, lambda newest: share_columns(
            () if newest is None else newest.shares, None if newest is None else newest.usage))
        if data != self.share_source.data:
            self.share_source.data = {name: list(values) for name, values in data.items()}
        rows = len(data["owner"])
        for part in (self.share_title, self.share_table):
            _set(part, "visible", rows > 0)
        _set(self.share_table, "height", table_height(rows))

    def _show_quotas(self, snapshot: Snapshot | None) -> None:
        """The quotas table of ``snapshot`` (once per snapshot for every open page); sent only when it changed,
        hidden while there is no grant and no finding."""
        findings = self.findings
        data = self.ticks.latest(("quotas",), snapshot, lambda newest: quota_columns(
            None if newest is None else newest.usage, () if newest is None else newest.shares, findings(newest)))
        if data != self.quota_source.data:
            self.quota_source.data = {name: list(values) for name, values in data.items()}
        rows = len(data["owner"])
        for part in (self.quota_title, self.quota_table):
            _set(part, "visible", rows > 0)
        _set(self.quota_table, "height", table_height(rows))

    def _show_usage(self, usage: Usage | None) -> None:
        _set(self.status, "text", status_html(usage))
        for part in (self.controls, self.table, self.idle_title):
            if part is not None:
                _set(part, "visible", usage is not None)
        for select, values in ((self.user, "user"), (self.namespace, "namespace"), (self.pod, "pod")):
            _set(select, "options", _options(choices(filter_values(usage)[values], _chosen(select.value) or ALL)))
        self._show_columns(self._columns(KEEP_ALL))
        idle = idle_columns(usage)
        self.idle_source.data = idle  # DataTables redraw on new data, not on patches (BokehJS 3.9)
        _set(self.idle, "visible", bool(idle["pod"]))
        _set(self.idle, "height", table_height(len(idle["pod"])))
        _set(self.idle_note, "text", idle_note(usage, bool(idle["pod"])))
        self.show_table()

    def show_table(self) -> None:
        """Rebuild the table from the last usage reading with the current filters."""
        data = {name: list(values) for name, values in self._columns(self.filter()).items()}
        self.table_source.data = data
        if self.table is not None:
            _set(self.table, "height", table_height(len(data["pid"])))
        total = 0 if self.usage is None else len(self.usage.processes)
        _set(self.count, "text", "" if self.usage is None else f"showing {len(data['pid'])} of {total}")

    def _columns(self, keep: ProcessFilter) -> dict[str, list[Any]]:
        """:func:`columns` of the usage shown: every page with the same filters shows the same rows, computed
        once per snapshot (not to be changed: a page hands its source copies)."""
        usage, snapshot = self.usage, self.snapshot
        if snapshot is None or snapshot.usage is not usage:
            return columns(usage, keep)
        return self.ticks.latest(("process table", keep), snapshot, lambda _newest: columns(usage, keep))

    def _filtered(self, _attr: str, _old: Any, _new: Any) -> None:
        self.show_table()


TABLE_ROW_PX = 25
TABLE_MAX_ROWS = 16


def table_height(rows: int) -> int:
    """Pixels for a table of ``rows`` rows (header included): no empty band under a short table, and a long
    one scrolls inside 16 rows."""
    return TABLE_ROW_PX * (1 + max(2, min(rows, TABLE_MAX_ROWS))) + 8


def _set(model: Any, name: str, value: Any) -> None:
    """Set a property only when it changes (an unchanged value would still be sent to the browser)."""
    if getattr(model, name) != value:
        setattr(model, name, value)


def build(doc: Document, ctx: AppContext) -> None:
    """The status, the filters and the table, the memory bars, the idle allocations; one periodic callback."""
    dark = apply_theme(doc)
    store = ctx.store
    view = ProcessesView(store.inventory.gpus, dark, ctx.ticks, lambda snapshot: store_findings(store, snapshot))
    snapshot, seq = latest(ctx.store)
    view.show(snapshot)
    pause = pause_toggle()
    # The bars are redrawn about once a second, as the classic pages are (see live.REFRESH_S).
    follow(doc, ctx, seq, view.on_rows, pause, batch=refresh_batch(ctx))
    add_page(doc, TITLE, row(view.status, pause, sizing_mode="stretch_width"), view.controls,
             Later(view.make_table, sizing_mode="stretch_width"),
             Later(view.make_memory, sizing_mode="stretch_width"),
             view.share_title, view.share_table, view.quota_title, view.quota_table,
             view.idle_title, view.idle, view.idle_note, dark=dark,
             staging=ctx.staging)
