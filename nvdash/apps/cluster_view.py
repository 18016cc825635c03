"""What both cluster pages share: following the poller's state and saying where it comes from."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from html import escape

from bokeh.document import Document
from bokeh.models import CustomJS
from bokeh.models.widgets import Div, Select

from nvdash.apps.figures import text_color
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.model import ClusterState

POLL_MS = 1000
"""How often a page looks at the poller's newest state (a read of memory; the poller asks Prometheus)."""
ERROR_COLOR = "#c62828"
ALL_GROUPS = "every group"
GROUP_URL_JS = """
const url = new URL(window.location.href);
if (cb_obj.value === ALL) url.searchParams.delete("group"); else url.searchParams.set("group", cb_obj.value);
window.history.replaceState(window.history.state, "", url.toString());
"""
"""Keeps the page's URL on the chosen group, so a bookmark reopens it."""


def clock_text(time_s: float) -> str:
    """``14:03:07``, local time."""
    return datetime.fromtimestamp(time_s).strftime("%H:%M:%S")


def status_html(cluster: ClusterRuntime, state: ClusterState, what: str) -> str:
    """One line: where the readings come from and how fresh they are, or why Prometheus failed."""
    source = f"Prometheus at {escape(cluster.client.url)}"
    if state.error is not None:
        since = f" · last answer {clock_text(state.ok_time_s)}" if state.ok_time_s is not None else ""
        trouble = "Prometheus refused access" if state.refused else "Prometheus down or slow"
        return (f'<span style="color:{ERROR_COLOR}"><b>{trouble}:</b> {escape(state.error)} · '
                f"retrying every {cluster.poller.refresh_s:g} s{since}</span>")
    if state.ok_time_s is None:
        return f"{source} · waiting for its first answer …"
    cut = " · some series left out (too many)" if state.truncated else ""
    return f"{source} · {escape(what)} · updated {clock_text(state.ok_time_s)}{cut}"


def status_div(dark: bool) -> Div:
    """The status line's Div (one line, fixed height)."""
    return Div(text="", sizing_mode="stretch_width", height=24,
               styles={"color": text_color(dark), "white-space": "nowrap", "overflow": "hidden",
                       "text-overflow": "ellipsis", "line-height": "24px"})


def follow_cluster(doc: Document, cluster: ClusterRuntime, on_state: Callable[[ClusterState], None]) -> None:
    """Call ``on_state`` now and with each newer state while the page is open (keeping the poller awake)."""
    seen = [-1]

    def poll() -> None:
        cluster.poller.want()
        state = cluster.poller.state()
        if state.generation != seen[0]:
            seen[0] = state.generation
            on_state(state)

    poll()
    doc.add_periodic_callback(poll, POLL_MS)


def group_menu(value: str) -> Select:
    """The menu of the nodes' groups (``--prometheus-group-label``), on ``value`` (``?group=``, default every group),
    its choice kept in the page's address."""
    menu = Select(title="", value=value or ALL_GROUPS, options=list[str | None]([ALL_GROUPS]), width=180, height=30,
                  sizing_mode="fixed")
    menu.js_on_change("value", CustomJS(code=GROUP_URL_JS, args={"ALL": ALL_GROUPS}))
    return menu


def in_chosen_group(menu: Select, state: ClusterState) -> ClusterState:
    """``state`` with the nodes of the group ``menu`` shows (every node when none, or one no node has), the menu's
    choices brought up to the state's groups."""
    groups = state.groups()
    choices = list[str | None]([ALL_GROUPS, *groups])
    if list(menu.options) != choices:
        menu.options = choices
    return state.in_group(menu.value) if menu.value in groups else state
