"""One pod's timelines (SM share in devices-worth, memory) over a past range, behind the time range control.

The control speaks :class:`~nvdash.history.query.HistoryBackend`; :class:`PodRangeBackend` answers it for the pod
chosen on the page from a :class:`PodSource` (Prometheus across the cluster, or this node's history file), so the
range menu, the custom pickers and the URL's ``range``/``from``/``to`` work as on every other timeline page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from bokeh.layouts import gridplot
from bokeh.models import BasicTickFormatter, ColumnDataSource, HoverTool, Range

from nvdash.apps.figures import Unit, timeline_figure
from nvdash.apps.timelines import show_dates_on_long_ranges
from nvdash.history.query import HistoryResult, Series
from nvdash.history.share_table import PodTimeline
from nvdash.sampling.records import GpuEvent

SM_METRIC = "sm_gpus"
MEMORY_METRIC = "memory_bytes"
SM_COLOR = "#1f77b4"
MEMORY_COLOR = "#2ca02c"


class PodSource(Protocol):
    """Where a pod's past shares come from (blocking)."""

    def timeline(self, namespace: str, pod: str, start_s: float, end_s: float) -> PodTimeline: ...

    def describe(self) -> str: ...


class PodRangeBackend:
    """The chosen pod's timelines as a history backend: metric ``sm_gpus`` (its SM share, in GPUs) and
    ``memory_bytes``, one host-like series each (key ``None``); the page sets ``namespace`` and ``pod``."""

    def __init__(self, source: PodSource) -> None:
        self.source = source
        self.namespace = ""
        self.pod = ""

    def query(self, metrics: Sequence[str], start_s: float, end_s: float,
              gpus: Sequence[int] | None = None, step_s: float | None = None) -> HistoryResult:
        """The pod's timeline over ``[start_s, end_s]`` (the source chooses the step)."""
        if not self.pod:
            return HistoryResult(start_s, end_s, 60.0, "no pod chosen", {})
        found = self.source.timeline(self.namespace, self.pod, start_s, end_s)
        columns = {SM_METRIC: found.sm_gpus, MEMORY_METRIC: found.memory_bytes}
        series: dict[str, dict[int | None, Series]] = {
            name: {None: Series(found.time_s, values, values, values)} for name, values in columns.items()
            if name in metrics}
        return HistoryResult(start_s, end_s, found.step_s, self.source.describe(), series)

    def extent(self) -> tuple[float, float] | None:
        return None

    def events(self, start_s: float, end_s: float, limit: int) -> list[GpuEvent]:
        return []

    def describe(self) -> str:
        return self.source.describe()


def timeline_data(timeline: PodTimeline | None = None) -> dict[str, Any]:
    """The plots' columns: time in ms, SM share in GPUs, memory in bytes."""
    if timeline is None:
        return {"time": np.zeros(0), SM_METRIC: np.zeros(0), MEMORY_METRIC: np.zeros(0)}
    return {"time": timeline.time_s * 1000.0, SM_METRIC: timeline.sm_gpus, MEMORY_METRIC: timeline.memory_bytes}


class PodTimelines:
    """The two plots of the chosen pod: the range control's view."""

    band_note = ""
    """Lines only: a step's mean, no min-max band."""

    def __init__(self, x_range: Range) -> None:
        self.on_shown: Callable[[float, float], None] | None = None
        """Told each range drawn (the page lists the pods recorded over it)."""
        self.source = ColumnDataSource(data=timeline_data(), name="pod-timeline")
        self.sm = timeline_figure("SM share (1 = one of its GPUs or MIG instances fully busy; summed over them)",
                                  "devices", Unit.PCT, x_range, None)
        self.sm.yaxis.formatter = BasicTickFormatter()
        self.memory = timeline_figure("GPU memory held", "memory", Unit.BYTES, x_range, None)
        for fig, column, color, text in ((self.sm, SM_METRIC, SM_COLOR, "@sm_gpus{0.00} GPU"),
                                         (self.memory, MEMORY_METRIC, MEMORY_COLOR, "@memory_bytes{0.0 b}")):
            show_dates_on_long_ranges(fig)
            line = fig.line(x="time", y=column, source=self.source, color=color, line_width=2, name=column)
            fig.add_tools(HoverTool(renderers=[line], mode="vline",
                                    tooltips=[("value", text), ("time", "@time{%F %H:%M}")],
                                    formatters={"@time": "datetime"}))
        self.layout = gridplot([[self.sm], [self.memory]], sizing_mode="stretch_both", merge_tools=True,
                               toolbar_location="right")

    def history_request(self) -> tuple[list[str], list[int] | None]:
        return [SM_METRIC, MEMORY_METRIC], None

    def show_live(self) -> None:
        """Never: a pod's shares are read for past ranges only."""

    def show_history(self, result: HistoryResult) -> None:
        sm = result.series.get(SM_METRIC, {}).get(None)
        memory = result.series.get(MEMORY_METRIC, {}).get(None)
        if sm is None or memory is None:
            self.source.data = timeline_data()
        else:
            self.source.data = timeline_data(PodTimeline(sm.time_s, sm.mean, memory.mean, result.step_s))
        if self.on_shown is not None:
            self.on_shown(result.start_s, result.end_s)
