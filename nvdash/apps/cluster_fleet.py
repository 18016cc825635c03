"""Fleet Health: how many nodes and GPUs are OK, warning, critical, lost or not reporting, each node's XIDs over the
last day and the nodes that lost GPUs since a day ago, one row per node, worst first, each linking to its node page.

The tallies come from the cluster poller's newest state (the same per-GPU judgement as Cluster Nodes); the day's
columns from the fleet poller's slower round. The page only reads both.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from bokeh.document import Document
from bokeh.models import ColumnDataSource
from bokeh.models.widgets import Div, HTMLTemplateFormatter, TableColumn

from nvdash.apps.cluster_view import (
    ERROR_COLOR,
    POLL_MS,
    clock_text,
    group_menu,
    in_chosen_group,
    status_div,
    status_html,
)
from nvdash.apps.context import AppContext
from nvdash.apps.figures import STATUS_COLORS, add_page, data_table, text_color
from nvdash.apps.theme import apply_theme, request_arguments
from nvdash.apps.time_range import query_values
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.fleet import DAY, FleetDay, FleetView, fleet_view
from nvdash.cluster.fleet_poller import FleetPoller
from nvdash.cluster.model import ClusterState, GpuClass

if TYPE_CHECKING:
    from bokeh.models.sources import DataDict

TITLE = "Fleet Health"
NODE_PAGE = "Cluster-Nodes"
"""Relative to the page (``<prefix>/Cluster-Fleet``), so a link resolves to ``<prefix>/Cluster-Nodes`` behind any
proxy."""
CLASS_COLORS = {GpuClass.OK: STATUS_COLORS["ok"], GpuClass.WARNING: STATUS_COLORS["warning"],
                GpuClass.NOT_REPORTING: "#9e9e9e", GpuClass.CRITICAL: STATUS_COLORS["critical"],
                GpuClass.LOST: "#6a1b9a"}
SHOWN = (GpuClass.OK, GpuClass.WARNING, GpuClass.CRITICAL, GpuClass.LOST, GpuClass.NOT_REPORTING)
FIELDS = ("node", "group", "link", "health", "color", "gpus", "ok", "warning", "critical", "lost", "silent", "xids",
          "xid_gpus", "gpus_now", "gpus_day_ago", "dropped", "problems")
XID_NOTE = ("XIDs: nodes export each GPU's last XID code (DCGM_FI_DEV_XID_ERRORS, a gauge labelled with the code, "
            "as dcgm-exporter does; there is no XID counter), so “XIDs 24h” counts the distinct GPU and XID code "
            "pairs seen in the last 24 h and “GPUs w/ XID” the GPUs with any; the same code again on a GPU is not "
            "seen.")


def node_link(node: str) -> str:
    """The node's page, relative to this one."""
    return f"{NODE_PAGE}?node={quote(node, safe='')}"


def table_data(view: FleetView) -> DataDict:
    """One row per node, worst first."""
    data: dict[str, Any] = {name: [] for name in FIELDS}
    for row in view.rows:
        data["node"].append(row.node)
        data["group"].append(row.group)
        data["link"].append(node_link(row.node))
        data["health"].append(row.worst.value)
        data["color"].append(CLASS_COLORS[row.worst])
        data["gpus"].append(row.gpus)
        data["ok"].append(row.counts[GpuClass.OK])
        data["warning"].append(row.counts[GpuClass.WARNING])
        data["critical"].append(row.counts[GpuClass.CRITICAL])
        data["lost"].append(row.counts[GpuClass.LOST])
        data["silent"].append(row.counts[GpuClass.NOT_REPORTING])
        data["xids"].append(row.xids)
        data["xid_gpus"].append(max(row.xid_gpus, row.xid_now))
        data["gpus_now"].append("" if row.gpus_now is None else str(row.gpus_now))
        data["gpus_day_ago"].append("" if row.gpus_day_ago is None else str(row.gpus_day_ago))
        data["dropped"].append(row.dropped)
        data["problems"].append(row.problems)
    return data


def summary_html(view: FleetView, dark: bool) -> str:
    """Two lines of tallies, nodes and GPUs, by class, and the nodes with dropped GPUs or XIDs."""
    def cells(tally: Any) -> str:
        return " · ".join(f'<span style="color:{CLASS_COLORS[kind]}"><b>{tally[kind]}</b></span> {kind.value}'
                          for kind in SHOWN)

    nodes, gpus = sum(view.nodes.values()), sum(view.gpus.values())
    return (f'<div style="color:{text_color(dark)};line-height:1.6em">'
            f"<b>{nodes} nodes</b>: {cells(view.nodes)}<br>"
            f"<b>{gpus} GPUs</b>: {cells(view.gpus)}<br>"
            f"<b>{view.dropped_nodes}</b> nodes with fewer GPUs than a day ago · "
            f"<b>{view.xid_nodes}</b> nodes with an XID in the last {DAY}</div>")


def day_html(fleet: FleetPoller, day: FleetDay) -> str:
    """Where the day's columns stand: when asked, or why not (the last answer kept)."""
    every = f"asked every {fleet.refresh_s:g} s"
    if day.error is not None:
        since = f" · last answer {clock_text(day.ok_time_s)}" if day.ok_time_s is not None else ""
        return (f'<span style="color:{ERROR_COLOR}"><b>XIDs and GPU counts of the last {DAY} not available:</b> '
                f"{escape(day.error)} · {every}{since}</span>")
    if day.ok_time_s is None:
        return f"XIDs and GPU counts of the last {DAY}: waiting for the first answer …"
    source = ("from the recording rules" if day.recorded else
              "from the raw series (load nvdash-recording-rules.yml into Prometheus to make this cheap)")
    return f"XIDs and GPU counts of the last {DAY}: as of {clock_text(day.ok_time_s)} · {every} · {source}"


def _table(dark: bool, group_label: str = "") -> tuple[Any, ColumnDataSource]:
    source = ColumnDataSource(data=table_data(fleet_view(ClusterState(), FleetDay())))
    link = HTMLTemplateFormatter(template='<a href="<%- link %>"><%- value %></a>')
    health = HTMLTemplateFormatter(template='<span style="color:<%- color %>;font-weight:bold"><%- value %></span>')
    columns = [
        TableColumn(field="node", title="node", width=150, formatter=link),
        *([TableColumn(field="group", title=group_label, width=90)] if group_label else []),
        TableColumn(field="health", title="worst GPU", width=90, formatter=health),
        TableColumn(field="gpus", title="GPUs", width=50),
        TableColumn(field="ok", title="OK", width=40),
        TableColumn(field="warning", title="warn", width=40),
        TableColumn(field="critical", title="crit", width=40),
        TableColumn(field="lost", title="lost", width=40),
        TableColumn(field="silent", title="silent", width=50),
        TableColumn(field="xids", title=f"XIDs {DAY}", width=70),
        TableColumn(field="xid_gpus", title="GPUs w/ XID", width=80),
        TableColumn(field="gpus_day_ago", title="GPUs 1 d ago", width=80),
        TableColumn(field="gpus_now", title="GPUs now", width=70),
        TableColumn(field="dropped", title="dropped", width=60),
        TableColumn(field="problems", title="why", width=500),
    ]
    return data_table(source, columns, dark, sizing_mode="stretch_both", min_height=300), source


def build(doc: Document, ctx: AppContext) -> None:
    """The tallies, the day's status and the node table, redrawn when either poller has a newer answer."""
    cluster = ctx.cluster
    if cluster is None or cluster.fleet is None:
        raise RuntimeError("the cluster pages need --prometheus")
    _FleetPage(doc, cluster, cluster.fleet).open()


class _FleetPage:
    def __init__(self, doc: Document, cluster: ClusterRuntime, fleet: FleetPoller) -> None:
        self.doc = doc
        self.cluster = cluster
        self.fleet = fleet
        self.dark = apply_theme(doc)
        self.status = status_div(self.dark)
        self.day_status = status_div(self.dark)
        self.summary = Div(text="", sizing_mode="stretch_width")
        self.table, self.rows = _table(self.dark, cluster.scope.group_label)
        note = Div(text=escape(XID_NOTE), sizing_mode="stretch_width", styles={"color": text_color(self.dark),
                                                                               "font-size": "0.85em"})
        self.seen = (-1, -1)
        self.group = group_menu(query_values(request_arguments(doc)).get("group", ""))
        self.group.on_change("value", self._group_picked)
        grouping = [self.group] if cluster.scope.group_label else []
        add_page(doc, TITLE, self.status, self.day_status, *grouping, self.summary, self.table, note, dark=self.dark)

    def open(self) -> None:
        self._poll()
        self.doc.add_periodic_callback(self._poll, POLL_MS)

    def _group_picked(self, _attr: str, _old: Any, _new: Any) -> None:
        self.seen = (-1, -1)
        self._poll()

    def _poll(self) -> None:
        self.cluster.poller.want()
        self.fleet.want()
        every, day = self.cluster.poller.state(), self.fleet.day()
        if (every.generation, day.generation) == self.seen:
            return
        self.seen = (every.generation, day.generation)
        state = in_chosen_group(self.group, every) if self.cluster.scope.group_label else every
        # A node silent for over an hour (known only from a day ago) has no group: listed under every group only.
        view = fleet_view(state, day, silent_nodes=state is every)
        self.status.text = status_html(self.cluster, state, f"{len(view.rows)} nodes, {state.gpu_count} GPUs")
        self.day_status.text = day_html(self.fleet, day)
        if state.ok_time_s is None and day.ok_time_s is None:
            return
        self.summary.text = summary_html(view, self.dark)
        self.rows.data = table_data(view)
