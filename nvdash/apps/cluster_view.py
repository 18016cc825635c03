"""What both cluster pages share: following the poller's state and saying where it comes from."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from html import escape

from bokeh.document import Document
from bokeh.models.widgets import Div

from nvdash.apps.figures import text_color
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.model import ClusterState

POLL_MS = 1000
"""How often a page looks at the poller's newest state (a read of memory; the poller asks Prometheus)."""
ERROR_COLOR = "#c62828"


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
