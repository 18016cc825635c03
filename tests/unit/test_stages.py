"""Pages built in stages end as the whole page would have been built at once."""

from __future__ import annotations

from bokeh.document import Document
from bokeh.layouts import gridplot
from bokeh.models import Tool, ToolProxy
from bokeh.plotting import figure

from nvdash.apps.figures import Unit, timeline_figure, timeline_range
from nvdash.live.stages import StagedGrid, Staging, run_in_stages


def _figures() -> list[figure]:
    x_range = timeline_range()
    return [timeline_figure(f"plot {i}", "value", Unit.PCT, x_range, 100.0) for i in range(3)]


def _shape(tools: list[Tool | ToolProxy]) -> list[tuple[str, int]]:
    return sorted((type(tool.tools[0]).__name__, len(tool.tools)) if isinstance(tool, ToolProxy)
                  else (type(tool).__name__, 1) for tool in tools)


def test_a_staged_grid_merges_tools_as_gridplot_does() -> None:
    staged = StagedGrid()
    for fig in _figures():
        staged.add(fig)
    staged.finish()
    whole = gridplot([[fig] for fig in _figures()], merge_tools=True, toolbar_location="right")
    assert _shape(list(staged.plot.toolbar.tools)) == _shape(list(whole.toolbar.tools))
    assert [(row, col) for _, row, col in staged.plot.children] == [(0, 0), (1, 0), (2, 0)]
    assert all(fig.toolbar_location is None for fig, _, _ in staged.plot.children)
    drag = staged.plot.toolbar.active_drag
    assert isinstance(drag, ToolProxy)
    assert {type(tool).__name__ for tool in drag.tools} == {"PanTool"}
    assert len(drag.tools) == 3


def test_stages_run_at_once_without_a_server() -> None:
    ran: list[int] = []
    run_in_stages(Document(), [lambda: ran.append(1), lambda: ran.append(2)], staging=Staging())
    assert ran == [1, 2]
    run_in_stages(Document(), [lambda: ran.append(3)], staging=None)
    assert ran == [1, 2, 3]
