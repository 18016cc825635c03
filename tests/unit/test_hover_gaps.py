"""The timelines' hovers leave out a series where it has no value (NaN), instead of showing "NaN"."""

from __future__ import annotations

from bokeh.models import ColumnDataSource, CustomJS, HoverTool, Range1d

from nvdash.apps.figures import SKIP_GAPS_JS, Unit, add_timeline_hover, skip_gaps, timeline_figure
from nvdash.apps.gpu_health import _history_figure
from nvdash.sampling.records import GpuInfo, HostInfo, Inventory


def _gap_filter(hover: HoverTool) -> CustomJS:
    (field, flt), = hover.filters.items()
    assert field == "$name"
    assert isinstance(flt, CustomJS)
    return flt


def test_the_gap_filter_checks_the_hovered_lines_own_column_at_the_hovered_row() -> None:
    (flt,) = skip_gaps().values()
    assert isinstance(flt, CustomJS)
    assert flt.code == SKIP_GAPS_JS
    # Bokeh shows NaN before any formatter runs, so the row is filtered out: the renderer is named after its
    # column, and only a finite value there gets an entry.
    assert "data_source.get_column(vars.name)" in SKIP_GAPS_JS
    assert "Number.isFinite(column[vars.index])" in SKIP_GAPS_JS
    # A function body: BokehJS would load an ES module from a blob: URL, a fetch the pages must not make.
    assert "export" not in SKIP_GAPS_JS


def test_timeline_hover_leaves_gaps_out() -> None:
    source = ColumnDataSource({"time": [0.0, 1.0, 2.0], "util/0": [1.0, float("nan"), 3.0]})
    fig = timeline_figure("Utilization", "utilization", Unit.PCT, Range1d(0, 2), 100.0)
    line = fig.line("time", "util/0", source=source, name="util/0")
    add_timeline_hover(fig, [line], {"util/0": "GPU 0"}, what="GPU", value="utilization", unit=Unit.PCT)
    hover = fig.select_one(HoverTool)
    assert _gap_filter(hover).code == SKIP_GAPS_JS
    assert hover.renderers == [line]
    assert hover.tooltips == [("GPU", "$name{label}"), ("utilization", "@$name{value}"), ("time", "@time{time}")]


def test_status_strip_hover_leaves_gaps_out() -> None:
    gpus = tuple(GpuInfo(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", 1, 5, 16, 1.0, 0, None) for i in range(2))
    source = ColumnDataSource({"time": [0.0], "status/0": [float("nan")], "status/1": [0.0]})
    fig = _history_figure(Inventory(host=HostInfo("node", 1, 1), gpus=gpus), source, 1.0)
    hover = fig.select_one(HoverTool)
    assert _gap_filter(hover).code == SKIP_GAPS_JS
    assert [renderer.name for renderer in hover.renderers] == ["status/0", "status/1"]
