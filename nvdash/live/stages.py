"""Building a heavy page in stages, so opening it never holds the server's event loop for long.

Bokeh builds a session's document and serializes it for the browser on the event loop, where every other open
pane's updates wait meanwhile. A page of many plots (GPU Resources: four plots of eight lines) took 150-330 ms
there (``benchmarks/open_stall.py``). Built in stages, the page's frame (title, controls, the data source) goes
out first, then one plot per turn of the event loop, each sent to the browser as a patch of its own models.

The stages start once the viewer has the document (the browser says so with ``DocumentReady``): run earlier,
they would all be in the one document the browser pulls, serialized in one piece, or reach the browser as a patch
of models it already has. Without a server (tests, benchmarks) they run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from bokeh.core.enums import SizingModeType
from bokeh.document import Document
from bokeh.events import DocumentReady
from bokeh.layouts import group_tools
from bokeh.models import (
    Column,
    CopyTool,
    ExamineTool,
    FullscreenTool,
    GridPlot,
    Plot,
    SaveTool,
    Spacer,
    Tool,
    Toolbar,
    ToolProxy,
)
from bokeh.models.ui import UIElement

Stage = Callable[[], None]
TurnGuard = Callable[[], AbstractContextManager[object]]
"""What a page-building turn runs under (the server's garbage-collection policy, see
:func:`nvdash.live.gc_policy.building`)."""


@dataclass(frozen=True)
class Staging:
    """How a server builds pages: heavy ones in stages, each stage (and the page's frame) under ``guard``."""

    guard: TurnGuard = nullcontext

CONNECTION_POLL_MS = 20
"""How often a page waits for its viewer before its stages start."""
CONNECTED_WAIT_POLLS = 50
"""A viewer that says nothing once connected (``bokeh.client`` sends no ``DocumentReady``) gets the stages after
this many polls (1 s) from its connection: it has pulled the document by then."""
UNCONNECTED_WAIT_POLLS = 250
"""After this many polls (5 s) without a viewer the stages run anyway."""


def _connected(doc: Document) -> bool | None:
    """Whether a viewer's websocket is subscribed to ``doc``'s session; ``None`` when that cannot be told."""
    context = doc.session_context
    session = getattr(context, "session", None)
    if session is None:
        return False if context is not None else None
    count = getattr(session, "connection_count", None)
    return None if count is None else count > 0


def run_in_stages(doc: Document, stages: Sequence[Stage], *, staging: Staging | None) -> None:
    """Run ``stages`` in order: all now without ``staging``; else one per event-loop turn, under its guard, once
    the viewer has the document (the browser's ``DocumentReady``), so that each stage reaches it as a patch of its
    own."""
    if staging is None or doc.session_context is None:
        for stage in stages:
            stage()
        return
    pending = list(stages)
    started = [False]
    polls = [0, 0]
    """Polls in all, and polls since a viewer connected."""

    def next_stage() -> None:
        if pending:
            # Not under ``doc.models.freeze()``: the patches of a shown document are made as its models change,
            # and a patch made before the document knows its new models refers to models the viewer never gets.
            with staging.guard():
                pending.pop(0)()
        if pending:
            doc.add_next_tick_callback(next_stage)

    def start() -> None:
        if not started[0]:
            started[0] = True
            doc.add_next_tick_callback(next_stage)

    def wait_for_viewer() -> None:
        if started[0]:
            return
        polls[0] += 1
        connected = _connected(doc)
        if connected:
            polls[1] += 1
        if connected is None or polls[1] >= CONNECTED_WAIT_POLLS or polls[0] >= UNCONNECTED_WAIT_POLLS:
            start()
        else:
            doc.add_timeout_callback(wait_for_viewer, CONNECTION_POLL_MS)

    def ready(event: object) -> None:
        start()

    doc.on_event(DocumentReady, ready)
    doc.add_timeout_callback(wait_for_viewer, CONNECTION_POLL_MS)


def _merge(cls: type[Tool], group: list[Tool]) -> Tool | ToolProxy | None:
    """As ``bokeh.layouts.gridplot`` merges: one fresh tool for those that act on the whole grid."""
    if issubclass(cls, (SaveTool, CopyTool, ExamineTool, FullscreenTool)):
        return cls()
    return None


class StagedGrid:
    """A one-column grid of plots under one merged toolbar, like ``gridplot(..., merge_tools=True)``, whose plots
    are added one at a time; :meth:`finish` merges their tools once all are in."""

    def __init__(self) -> None:
        self.figures: list[Plot] = []
        self.plot = GridPlot(children=[], toolbar=Toolbar(logo=None), toolbar_location="right",
                             sizing_mode="stretch_both")

    def add(self, fig: Plot) -> None:
        """Append ``fig`` as the grid's next row (its own tools work meanwhile; its toolbar is not shown)."""
        fig.toolbar_location = None
        self.plot.children = [*self.plot.children, (fig, len(self.figures), 0)]
        self.figures.append(fig)

    def finish(self) -> None:
        """The plots' tools merged into the grid's toolbar (a proxy per kind acts on every plot)."""
        tools: list[Tool | ToolProxy] = [tool for fig in self.figures for tool in fig.toolbar.tools]
        merged = group_tools(tools, merge=_merge)
        drag = self.figures[0].toolbar.active_drag if self.figures else None
        if isinstance(drag, Tool):
            for proxy in merged:
                if isinstance(proxy, ToolProxy) and drag in proxy.tools:
                    self.plot.toolbar.active_drag = proxy
        self.plot.toolbar.tools = merged


PLACEHOLDER_NAME = "nvdash-later"
"""The name of the column a :class:`Later` part holds its place with."""
PENDING_NAME = "nvdash-later-pending"
"""The name of the empty spacer a place holds until its part is made (an empty column would make Bokeh log an
``EMPTY_LAYOUT`` warning for every page opened)."""


def placeholder(sizing_mode: SizingModeType, name: str | None = None) -> Column:
    """A column that holds only an empty, zero-sized spacer until a part is put in it."""
    return Column(children=[Spacer(width=0, height=0, name=PENDING_NAME)], sizing_mode=sizing_mode, name=name)


class Later:
    """A part of a page made after the page's frame: :func:`~nvdash.apps.figures.add_page` puts a
    :func:`placeholder` in its place, and its :meth:`stages` make it (outside the page) and then put it there,
    each in a turn of the event loop of its own. Making a figure costs Bokeh 10-20 ms and sending it as much
    again, which a page made in one piece spends in one turn while every other viewer's update waits
    (``benchmarks/open_stall.py``)."""

    def __init__(self, make: Callable[[], UIElement], *, sizing_mode: SizingModeType = "stretch_both") -> None:
        self.make = make
        self.place = placeholder(sizing_mode, PLACEHOLDER_NAME)
        self.made: UIElement | None = None

    def _make(self) -> None:
        self.made = self.make()

    def _show(self) -> None:
        if self.made is not None:
            self.place.children = [self.made]

    def stages(self) -> list[Stage]:
        """Make the part, then show it."""
        return [self._make, self._show]
