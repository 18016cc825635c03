"""A heavy page reaches its viewer in stages: the frame first, then a plot per turn of the event loop."""

from __future__ import annotations

from bokeh.client import pull_session
from bokeh.models import ColumnDataSource, GridPlot, Plot, ToolProxy

from nvdash.live.stages import PENDING_NAME, PLACEHOLDER_NAME
from tests.conftest import nvdash_server, wait_for
from tests.server.bokeh_viewer import receive_for

TITLES = ["Utilization", "Memory used", "PCIe throughput (TX + RX)", "NVLink throughput (TX + RX)"]


def test_gpu_resources_arrives_whole_with_one_merged_toolbar() -> None:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.5", "--no-history"]) as server:
        wait_for(lambda: server.health()["store"]["rows"], lambda rows: rows >= 1)
        session = pull_session(url=server.url + "/GPU-Resources")  # not waiting for the stages
        try:
            (grid,) = session.document.select({"type": GridPlot})

            def state() -> tuple[list[str], int]:
                receive_for(session, 0.2)
                plots = [child[0] for child in grid.children]
                titles = [plot.title.text for plot in plots if isinstance(plot, Plot)]
                return titles, len(grid.toolbar.tools)

            wait_for(state, lambda found: found[0] == TITLES and found[1] > 0, timeout_s=60)
            plots = [child[0] for child in grid.children]
            (source,) = [s for s in session.document.select({"type": ColumnDataSource}) if "util/0" in s.data]
            assert len(source.data["time"]) >= 1  # the store's rows came with the first plot
            assert [row for _, row, _ in grid.children] == [0, 1, 2, 3]
            assert all(plot.toolbar_location is None for plot in plots)
            # The pan that is active from the start acts on every plot at once: one proxy holds each plot's.
            drag = grid.toolbar.active_drag
            assert isinstance(drag, ToolProxy)
            assert len(drag.tools) == len(plots)
            for plot in plots:
                lines = [r for r in plot.renderers if getattr(r, "name", "") and "/" in r.name
                         and not r.name.endswith("band")]
                assert len(lines) == 8, plot.title.text
        finally:
            session.close()


def test_a_bar_page_arrives_as_its_frame_then_its_figure() -> None:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.5", "--no-history"]) as server:
        wait_for(lambda: server.health()["store"]["rows"], lambda rows: rows >= 1)
        session = pull_session(url=server.url + "/GPU-Utilization")
        try:
            (place,) = session.document.select({"name": PLACEHOLDER_NAME})
            # the pulled document: the page's frame, its place holding an empty spacer, no figure yet
            assert [child.name for child in place.children] == [PENDING_NAME]
            assert not list(session.document.select({"type": Plot}))

            def figures() -> list[Plot]:
                receive_for(session, 0.2)
                return list(place.children)

            (fig,) = wait_for(figures, lambda found: len(found) == 1 and isinstance(found[0], Plot), timeout_s=60)
            assert fig.title.text == "GPU utilization"
            (source,) = {renderer.data_source for renderer in fig.renderers}  # the bars' source came with it
            assert len(source.data["gpu"]) == 8
            assert list(fig.x_range.factors) == [f"GPU {index}" for index in range(8)]
        finally:
            session.close()
