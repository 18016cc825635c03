"""Cluster Nodes: every node's GPUs at a glance (utilization, memory, health) from Prometheus, and for the node
chosen its GPUs' timelines over a past range (30 min to 7 days, or custom).

The overview comes from the cluster poller's newest state (one set of queries per refresh, whatever the number of
pages); the timelines are range queries run off the event loop by the time range control.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from bokeh.document import Document
from bokeh.layouts import column, gridplot, row
from bokeh.models import ColumnDataSource, CustomJS, FactorRange, HoverTool, Range1d
from bokeh.models.annotations import Title
from bokeh.models.renderers import GlyphRenderer
from bokeh.models.widgets import Div, Select, TableColumn
from bokeh.plotting import figure

from nvdash.apps.cluster_view import follow_cluster, group_menu, in_chosen_group, status_div, status_html
from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    LEVEL_PALETTE,
    LOST_COLOR,
    STATUS_COLORS,
    Unit,
    add_legend_above,
    add_page,
    add_timeline_hover,
    data_table,
    format_bytes_of,
    format_pct,
    gpu_color,
    legend_item,
    text_color,
    timeline_figure,
    timeline_range,
)
from nvdash.apps.theme import apply_theme, request_arguments
from nvdash.apps.time_range import CUSTOM, TimeRangeControl, query_values
from nvdash.apps.timelines import (
    HistoryLayers,
    Panel,
    Series,
    add_series_lines,
    align,
    all_series,
    history_data,
    history_metrics,
    show_dates_on_long_ranges,
)
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.history import PrometheusHistory
from nvdash.cluster.model import ClusterGpu, ClusterNode, ClusterState, GpuClass
from nvdash.history.query import HistoryResult

if TYPE_CHECKING:
    from bokeh.models.sources import DataDict

TITLE = "Cluster Nodes"
ROW_PX = 34
REFRESH_RANGE_MS = 30_000
"""A relative range (last 6 h) is asked again this often, so its end stays "now"."""
NO_NODE = "(no node yet)"
GPU_CELLS_UP_TO = 256
"""The overview shows a cell per GPU up to this many GPUs, and a cell per node above (1,000 nodes x 8 GPUs would
be 8,000 cells, 34,000 px tall)."""
NODE_COLUMNS = 25
"""Node cells to a row in the node overview."""
GPU_TITLE = "GPUs by node: fill = utilization, outline = health"
NODE_TITLE = "Nodes: fill = mean utilization, outline = worst GPU's health (click a node for its GPUs)"
STALE_ALPHA = 0.3
"""The overview's cells fade while Prometheus does not answer: they show its last answer."""
NODE_URL_JS = """
const url = new URL(window.location.href);
url.searchParams.set("node", cb_obj.value);
window.history.replaceState(window.history.state, "", url.toString());
"""
"""Keeps the page's URL on the chosen node, so a bookmark reopens it."""



def node_panels(gpus: Sequence[ClusterGpu]) -> list[Panel]:
    """Utilization, memory, power and temperature, each with a line per GPU of the node (read from Prometheus for
    a past range; nothing live)."""
    def lines(metric: str) -> tuple[Series, ...]:
        return tuple(Series(f"{metric}/{gpu.index}", f"GPU {gpu.index}", f"{gpu.index}: {gpu.model}",
                            gpu_color(gpu.index), lambda _snapshot: None, gpu.index, metric=metric) for gpu in gpus)

    totals = [gpu.memory_total_bytes for gpu in gpus if gpu.memory_total_bytes is not None]
    return [
        Panel("Utilization", "utilization", Unit.PCT, lines("utilization_pct"), 100.0, value="utilization"),
        Panel("Memory used", "memory used", Unit.BYTES, lines("memory_used_bytes"), max(totals) if totals else None,
              value="used"),
        Panel("Power", "power", Unit.WATTS, lines("power_w"), value="power"),
        Panel("Temperature", "temperature", Unit.CELSIUS, lines("temperature_c"), value="temperature"),
    ]


def util_color(util: float | None, reporting: bool) -> str:
    """The cell colour of a GPU: its utilization on the level palette, grey when unknown."""
    if not reporting or util is None or math.isnan(util):
        return LOST_COLOR
    return LEVEL_PALETTE[min(len(LEVEL_PALETTE) - 1, max(0, int(util / 100.0 * (len(LEVEL_PALETTE) - 1))))]


def by_node_above(state: ClusterState, gpu_cells_up_to: int = GPU_CELLS_UP_TO) -> bool:
    """Whether the overview shows one cell per node: more GPUs than ``gpu_cells_up_to``."""
    return state.fleet or state.gpu_count > gpu_cells_up_to


def overview_data(state: ClusterState, gpu_cells_up_to: int = GPU_CELLS_UP_TO) -> DataDict:
    """The overview's cells: one per GPU (row: its node, x: its index), or one per node above ``gpu_cells_up_to``
    GPUs (see :func:`node_cells`); colour by utilization, outline by health, tooltips."""
    if by_node_above(state, gpu_cells_up_to):
        return cast("DataDict", node_cells(state))
    gpus = state.gpus
    return {
        "row": [gpu.hostname for gpu in gpus],
        "node": [gpu.hostname for gpu in gpus],
        "x": [float(gpu.index) for gpu in gpus],
        "gpu": [f"GPU {gpu.index}" for gpu in gpus],
        "model": [gpu.model for gpu in gpus],
        "fill": [util_color(gpu.utilization_pct, gpu.reporting) for gpu in gpus],
        "outline": [STATUS_COLORS[gpu.health.status.value] for gpu in gpus],
        "label": [_cell_label(gpu) for gpu in gpus],
        "label_color": ["#ffffff" if (gpu.utilization_pct or 0) < 60 and gpu.reporting else "#000000"
                        for gpu in gpus],
        "util": [format_pct(gpu.utilization_pct, 0) for gpu in gpus],
        "memory": [format_bytes_of(gpu.memory_used_bytes, gpu.memory_total_bytes) for gpu in gpus],
        "health": [_health_text(gpu) for gpu in gpus],
        "group": [gpu.group for gpu in gpus],
    }


def node_cells(state: ClusterState) -> dict[str, list[Any]]:
    """One cell per node, :data:`NODE_COLUMNS` to a row (the row named by its first node): fill by the node's mean
    utilization, outline by its worst GPU's health, the tooltip counting the GPUs not OK and naming the first
    problem. Clicking a cell shows that node's GPUs below (as ``?node=NAME`` does)."""
    data: dict[str, list[Any]] = {name: [] for name in (
        "row", "node", "x", "gpu", "model", "fill", "outline", "label", "label_color", "util", "memory", "health",
        "group")}
    for node, row_name, column_number in _node_places(state.nodes):
        mean = node.utilization_pct
        troubled = node.gpus - node.counts[GpuClass.OK]
        health = node.status.label
        if troubled:
            why = f"; {node.problems[0]}" if node.problems else ""
            health += f" ({troubled} of {node.gpus} GPUs not OK{why})"
        data["row"].append(row_name)
        data["node"].append(node.hostname)
        data["x"].append(float(column_number))
        data["gpu"].append(f"{node.gpus} GPUs")
        data["model"].append(", ".join(node.models))
        data["fill"].append(util_color(mean, mean is not None))
        data["outline"].append(STATUS_COLORS[node.status.value])
        data["label"].append(format_pct(mean, 0) if mean is not None else "no data")
        data["label_color"].append("#ffffff" if mean is not None and mean < 60 else "#000000")
        data["util"].append(format_pct(mean, 0) if mean is not None else "n/a")
        data["memory"].append(_node_memory(node))
        data["health"].append(health)
        data["group"].append(node.group)
    return data


NO_GROUP = "(none)"
"""The row name of the nodes without a group, when the others have one."""


def _node_places(nodes: Sequence[ClusterNode]) -> list[tuple[ClusterNode, str, int]]:
    """Each node's row and column: :data:`NODE_COLUMNS` to a row, each row named by its first node; with groups
    (``--prometheus-group-label``), each group's nodes on rows of their own named by the group (``rack-3``, then
    ``rack-3 (2)``...)."""
    if not any(node.group for node in nodes):
        return [(node, nodes[number - number % NODE_COLUMNS].hostname, number % NODE_COLUMNS)
                for number, node in enumerate(nodes)]
    by_group: dict[str, list[ClusterNode]] = {}
    for node in nodes:
        by_group.setdefault(node.group or NO_GROUP, []).append(node)
    places = []
    for group in sorted(by_group):
        for number, node in enumerate(by_group[group]):
            part = number // NODE_COLUMNS
            places.append((node, group if part == 0 else f"{group} ({part + 1})", number % NODE_COLUMNS))
    return places


def _node_memory(node: ClusterNode) -> str:
    if not node.memory_total_bytes:
        return "n/a"
    return format_bytes_of(node.memory_used_bytes or 0.0, node.memory_total_bytes)


def _cell_label(gpu: ClusterGpu) -> str:
    if not gpu.reporting:
        return "no data"
    if gpu.value("nvdash_gpu_lost") == 1.0:
        return "lost"
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    memory = "" if used is None or not total else f"\nmem {100.0 * used / total:.0f} %"
    return f"{format_pct(gpu.utilization_pct, 0)}{memory}"


def _health_text(gpu: ClusterGpu) -> str:
    findings = "; ".join(finding.text for finding in gpu.health.findings)
    return gpu.health.status.label + (f": {findings}" if findings else "")


def node_rows(state: ClusterState) -> dict[str, list[Any]]:
    """One row per node: GPUs, models, mean utilization, memory, the worst health and its reasons."""
    columns: dict[str, list[Any]] = {name: [] for name in (
        "node", "group", "gpus", "models", "util", "memory", "health", "color", "problems")}
    for node in state.nodes:
        columns["node"].append(node.hostname)
        columns["group"].append(node.group)
        columns["gpus"].append(node.gpus)
        columns["models"].append(", ".join(node.models))
        columns["util"].append(format_pct(node.utilization_pct, 0) if node.utilization_pct is not None else "n/a")
        columns["memory"].append(_node_memory(node))
        columns["health"].append(node.status.label)
        columns["color"].append(STATUS_COLORS[node.status.value])
        columns["problems"].append("; ".join(node.problems))
    return columns


class NodeTimelines:
    """The chosen node's timelines, rebuilt when the node (or its GPUs) change; the range control's view."""

    def __init__(self, history: PrometheusHistory, holder: Any, x_range: Range1d | Any) -> None:
        self.history = history
        self.holder = holder
        self.x_range = x_range
        self.gpus: tuple[tuple[int, str], ...] = ()
        self.panels: list[Panel] = []
        self.source = ColumnDataSource(data={"time": np.zeros(0)})
        self.layers = HistoryLayers([])

    def set_node(self, hostname: str, gpus: Sequence[ClusterGpu]) -> bool:
        """Show ``hostname``'s GPUs; returns whether anything changed (the caller then queries again)."""
        shape = tuple((gpu.index, gpu.model) for gpu in gpus)
        if hostname == self.history.hostname and shape == self.gpus:
            return False
        self.history.hostname = hostname
        self.gpus = shape
        self.holder.children = [self._build(gpus)]
        return True

    def waiting(self, hostname: str) -> None:
        """At fleet size a node's GPUs are read once a page chooses it: say so until the next refresh brings them."""
        self.history.hostname = hostname
        self.gpus = ()
        self.holder.children = [Div(text=f"Reading the GPUs of {escape(hostname)} from Prometheus …")]

    def _build(self, gpus: Sequence[ClusterGpu]) -> Any:
        self.panels = node_panels(gpus)
        self.source = ColumnDataSource(data=history_data(np.zeros(0), {}, self.panels))
        plots = []
        for number, panel in enumerate(self.panels):
            fig = timeline_figure(panel.title, panel.y_label, panel.unit, self.x_range, panel.y_max)
            show_dates_on_long_ranges(fig)
            lines = add_series_lines(fig, self.source, panel.series)
            if number == 0:
                add_legend_above(fig, [legend_item(item.legend, line)
                                       for item, line in zip(panel.series, lines, strict=True)])
            add_timeline_hover(fig, lines, {item.key: item.description for item in panel.series}, what="GPU",
                               value=panel.value, unit=panel.unit)
            plots.append((fig, panel.series, lines))
        self.layers = HistoryLayers(plots)
        self.layers.prepare()
        return gridplot([[fig] for fig, _series, _lines in plots], sizing_mode="stretch_both", merge_tools=True,
                        toolbar_location="right")

    def history_request(self) -> tuple[list[str], list[int] | None]:
        return history_metrics(all_series(self.panels)), None

    def show_live(self) -> None:
        """Never: the cluster's readings are all past ones."""

    def prepare_history(self) -> None:
        self.layers.prepare()

    def show_history(self, result: HistoryResult) -> None:
        times, aligned = align(result, all_series(self.panels), edges=True)
        self.source.data = history_data(times, aligned, self.panels)
        self.layers.show(times, aligned, result)


@dataclasses.dataclass
class _Overview:
    fig: figure
    title: Title
    source: ColumnDataSource
    nodes: FactorRange
    gpus: Range1d
    cells: GlyphRenderer[Any]


def _overview_figure(dark: bool) -> _Overview:
    source = ColumnDataSource(data=overview_data(ClusterState()))
    nodes = FactorRange()
    gpus = Range1d(start=-0.5, end=7.5)
    title = Title(text=GPU_TITLE)
    fig = figure(title=title, y_range=nodes, x_range=gpus,
                 height=ROW_PX * 2 + 60, sizing_mode="stretch_width", tools="save,tap", toolbar_location=None,
                 min_border_left=120)
    cells = fig.rect(x="x", y="row", width=0.92, height=0.84, source=source, fill_color="fill",
                     line_color="outline", line_width=3)
    cells.nonselection_glyph = cells.glyph  # a click picks a node; it fades no cell
    labels = fig.text(x="x", y="row", text="label", source=source, text_align="center", text_baseline="middle",
                      text_font_size="0.8em", text_color="label_color", text_line_height=1.1)
    labels.nonselection_glyph = labels.glyph
    fig.xaxis.axis_label = "GPU"
    fig.xgrid.visible = False
    fig.ygrid.visible = False
    fig.yaxis.major_label_text_color = text_color(dark)
    fig.add_tools(HoverTool(renderers=[cells], tooltips=[
        ("node", "@node"), ("GPUs", "@gpu · @model"), ("utilization", "@util"), ("memory", "@memory"),
        ("health", "@health")]))
    return _Overview(fig, title, source, nodes, gpus, cells)


def _node_table(dark: bool, group_label: str = "") -> tuple[Any, ColumnDataSource]:
    source = ColumnDataSource(data=node_rows(ClusterState()))
    health = TableColumn(field="health", title="health", width=80)
    grouped = [TableColumn(field="group", title=group_label, width=100)] if group_label else []
    columns = [
        TableColumn(field="node", title="node", width=160),
        *grouped,
        TableColumn(field="gpus", title="GPUs", width=50),
        TableColumn(field="models", title="model", width=200),
        TableColumn(field="util", title="mean util", width=80),
        TableColumn(field="memory", title="memory used", width=150),
        health,
        TableColumn(field="problems", title="why", width=500),
    ]
    table = data_table(source, columns, dark, height=160, sizing_mode="stretch_width")
    return table, source


def build(doc: Document, ctx: AppContext) -> None:
    """The overview, the node table, and the chosen node's timelines with a time range control."""
    cluster = ctx.cluster
    if cluster is None:
        raise RuntimeError("the cluster pages need --prometheus")
    _NodesPage(doc, ctx, cluster).open()


class _NodesPage:
    def __init__(self, doc: Document, ctx: AppContext, cluster: ClusterRuntime) -> None:
        self.doc = doc
        self.cluster = cluster
        self.dark = apply_theme(doc)
        arguments = query_values(request_arguments(doc))
        self.wanted_node = arguments.get("node", "")
        self.group_label = cluster.scope.group_label
        self.status = status_div(self.dark)
        self.overview = _overview_figure(self.dark)
        self.table, self.rows = _node_table(self.dark, self.group_label)
        self.group = group_menu(arguments.get("group", ""))
        self.group.on_change("value", self._group_picked)
        grouping = [self.group] if self.group_label else []
        self.select = Select(title="", value=NO_NODE, options=list[str | None]([NO_NODE]), width=220, height=30,
                             sizing_mode="fixed")
        self.select.on_change("value", self._picked)
        self.select.js_on_change("value", CustomJS(code=NODE_URL_JS))
        self.rows.selected.on_change("indices", self._row_picked)
        self.overview.source.selected.on_change("indices", self._cell_picked)
        self.holder = column(Div(text=""), sizing_mode="stretch_both", min_height=400)
        x_range = timeline_range()
        history = cluster.history()
        self.timelines = NodeTimelines(history, self.holder, x_range)
        page_ctx = dataclasses.replace(ctx, history=history, history_executor=cluster.executor, past_only=True,
                                       clock=time.time)
        self.control = TimeRangeControl(doc, page_ctx, self.timelines, x_range, dark=self.dark)
        self.state = ClusterState()
        add_page(doc, TITLE, self.status, *grouping, self.overview.fig, self.table,
                 row(self.select, *self.control.widgets(), sizing_mode="stretch_width"), self.holder, dark=self.dark)
        self.all_state = self.state

    def open(self) -> None:
        follow_cluster(self.doc, self.cluster, self._on_state)
        self.doc.add_periodic_callback(self._refresh_range, REFRESH_RANGE_MS)

    def _group_picked(self, _attr: str, _old: Any, _new: Any) -> None:
        self._on_state(self.all_state)

    def _on_state(self, every: ClusterState) -> None:
        self.all_state = every
        state = in_chosen_group(self.group, every) if self.group_label else every
        if every.fleet and state is not every and state.gpu_count <= GPU_CELLS_UP_TO:
            for node in state.nodes:  # a small group at fleet size: read its GPUs, for a cell each
                self.cluster.poller.want_node(node.hostname)
        self.state = state
        hosts = state.hostnames
        self.status.text = status_html(self.cluster, state, f"{len(hosts)} nodes, {state.gpu_count} GPUs")
        self.overview.cells.glyph.fill_alpha = STALE_ALPHA if state.error is not None else 1.0
        if state.ok_time_s is None:
            return
        data = overview_data(state)
        self.overview.source.data = data
        nodes = by_node_above(state)
        self.overview.title.text = NODE_TITLE if nodes else GPU_TITLE
        self.overview.fig.xaxis.axis_label = "node" if nodes else "GPU"
        factors = list(reversed(dict.fromkeys(data["row"])))
        if list(self.overview.nodes.factors) != factors:
            self.overview.nodes.factors = factors
            self.overview.fig.height = ROW_PX * max(2, len(factors)) + 60
        widest = max(data["x"], default=7.0)
        self.overview.gpus.end = max(7.0, widest) + 0.5
        self.rows.data = node_rows(state)
        options = list[str | None](hosts or [NO_NODE])
        if list(self.select.options) != options:
            self.select.options = options
        chosen = self.select.value
        if chosen not in hosts:
            chosen = self.wanted_node if self.wanted_node in hosts else (hosts[0] if hosts else NO_NODE)
        if chosen != self.select.value:
            self.select.value = chosen  # _picked shows it
        else:
            self._show_node(chosen)

    def _picked(self, _attr: str, _old: Any, new: Any) -> None:
        self._show_node(str(new))

    def _row_picked(self, _attr: str, _old: Any, new: Any) -> None:
        nodes = self.rows.data["node"]
        if new and 0 <= new[0] < len(nodes):
            self.select.value = nodes[new[0]]

    def _cell_picked(self, _attr: str, _old: Any, new: Any) -> None:
        nodes = self.overview.source.data["node"]
        if new and 0 <= new[0] < len(nodes):
            self.select.value = nodes[new[0]]

    def _show_node(self, hostname: str) -> None:
        if hostname == NO_NODE:
            return
        self.cluster.poller.want_node(hostname)
        gpus = self.state.node(hostname)
        if not gpus:
            if self.state.fleet and self.timelines.history.hostname != hostname:
                self.timelines.waiting(hostname)
            return
        if self.timelines.set_node(hostname, gpus):
            if self.control.time_range is None:
                self.control.open()
            else:
                self.control.reload()

    def _refresh_range(self) -> None:
        shown = self.control.time_range
        if shown is not None and shown.label != CUSTOM and self.timelines.gpus:
            self.control.choose(shown.label)
