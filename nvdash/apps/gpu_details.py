"""GPU Details: one GPU in depth. Temperature against its thresholds, power against its enforced limit, clocks
against their maxima, the clock event reasons as a band under them, and GPM activity where the GPU has it.

One GPU at a time (chosen with the selector or ``?gpu=N``) keeps the page as cheap as one GPU's lines, whatever
the number of GPUs; switching refills the same renderers from the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from bokeh.document import Document
from bokeh.layouts import gridplot, row
from bokeh.models import BasicTickFormatter, ColumnDataSource, CustomJSHover, FixedTicker, HoverTool, Range1d, Rect
from bokeh.models.renderers import DataRenderer
from bokeh.models.widgets import Div, Select
from bokeh.plotting import figure

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    BLOCK_WIDTH,
    Unit,
    add_legend_above,
    add_page,
    add_timeline_hover,
    legend_item,
    text_color,
    timeline_figure,
    timeline_range,
)
from nvdash.apps.live import Follower, follow, pause_toggle
from nvdash.apps.rows import gpu_reading, gpu_value
from nvdash.apps.theme import apply_theme, request_arguments
from nvdash.apps.timelines import Panel, Series, add_series_lines, timeline_data
from nvdash.health.clock_events import REASONS, SW_POWER_CAP, ClockEventReason, describe_reasons
from nvdash.sampling.records import GpuInfo, GpuSample, Snapshot
from nvdash.store import Store
from nvdash.units import format_pct

if TYPE_CHECKING:
    from bokeh.models.sources import DataDict

TITLE = "GPU Details"

GPU_COLOR = "#1f77b4"
MEMORY_COLOR = "#9467bd"
LIMIT_COLOR = "#ff7f0e"
SHUTDOWN_COLOR = "#d62728"
BENIGN_COLOR = "#9e9e9e"
THROTTLE_COLOR = "#d62728"
POWER_CAP_COLOR = "#ff7f0e"
GPM_NOT_AVAILABLE = "GPM activity (SM active, tensor, DRAM) is not available on this GPU."


def _constant(value: float | None) -> Callable[[Snapshot], float | None]:
    def read(_snapshot: Snapshot) -> float | None:
        return value

    return read


def _reason_row(index: int, bit: int, row_index: int) -> Callable[[Snapshot], float | None]:
    """The band's y for one reason: its row when the bit is set, else unknown (nothing drawn)."""
    read_mask = gpu_value(index, lambda s: s.clock_event_reasons)

    def read(snapshot: Snapshot) -> float | None:
        mask = read_mask(snapshot)
        return None if mask is None or not int(mask) & bit else float(row_index)

    return read


def _reason_color(reason: ClockEventReason) -> str:
    if reason.benign:
        return BENIGN_COLOR
    return POWER_CAP_COLOR if reason.bit == SW_POWER_CAP else THROTTLE_COLOR


def _line(key: str, legend: str, color: str, value: Callable[[Snapshot], float | None], dash: str = "solid") -> Series:
    return Series(key, legend, legend, color, value, dash=dash)


def detail_panels(info: GpuInfo) -> tuple[Panel, ...]:
    """The timeline panels of one GPU; the column names are the same for every GPU, so switching refills them."""
    i = info.index

    def metric(read: Callable[[GpuSample], float | None]) -> Callable[[Snapshot], float | None]:
        return gpu_value(i, read)

    return (
        Panel("Temperature", "temperature", Unit.CELSIUS, (
            _line("temp", "GPU", GPU_COLOR, metric(lambda s: s.temperature_c)),
            _line("mem_temp", "memory", MEMORY_COLOR, metric(lambda s: s.memory_temperature_c)),
            _line("slowdown", "slowdown", LIMIT_COLOR, _constant(info.temperature_slowdown_c), "dashed"),
            _line("shutdown", "shutdown", SHUTDOWN_COLOR, _constant(info.temperature_shutdown_c), "dashed"),
        ), what="series", value="temperature"),
        Panel("Power", "power", Unit.WATTS, (
            _line("power", "power draw", GPU_COLOR, metric(lambda s: s.power_w)),
            _line("power_limit", "enforced limit", LIMIT_COLOR, metric(lambda s: s.power_limit_w), "dashed"),
        ), what="series", value="power"),
        Panel("Clocks", "clock", Unit.MHZ, (
            _line("sm_clock", "SM", GPU_COLOR, metric(lambda s: s.clock_sm_mhz)),
            _line("mem_clock", "memory", MEMORY_COLOR, metric(lambda s: s.clock_memory_mhz)),
            _line("sm_max", "SM max", GPU_COLOR, _constant(info.clock_sm_max_mhz), "dashed"),
            _line("mem_max", "memory max", MEMORY_COLOR, _constant(info.clock_memory_max_mhz), "dashed"),
        ), what="series", value="clock"),
        Panel("Clock event reasons", "", Unit.PCT, tuple(
            _line(f"reason/{reason.bit:#x}", reason.name, _reason_color(reason), _reason_row(i, reason.bit, row_index))
            for row_index, reason in enumerate(REASONS)
        )),
        Panel("GPM activity", "activity", Unit.PCT, (
            _line("gpm_sm", "SM active", GPU_COLOR, metric(lambda s: s.gpm_sm_active_pct)),
            _line("gpm_occupancy", "SM occupancy", "#17becf", metric(lambda s: s.gpm_sm_occupancy_pct)),
            _line("gpm_tensor", "tensor active", "#2ca02c", metric(lambda s: s.gpm_tensor_active_pct)),
            _line("gpm_dram", "DRAM active", MEMORY_COLOR, metric(lambda s: s.gpm_dram_active_pct)),
        ), 100.0, what="series", value="activity"),
    )


def _number(value: float | None, unit: str, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} {unit}"


def header_html(info: GpuInfo, sample: GpuSample | None, lost: bool) -> str:
    """The selected GPU's identity and its newest readings in one line each."""
    identity = f"<b>GPU {info.index}</b> {escape(info.name)}"
    if info.pci_bus_id:
        identity += f" · {escape(info.pci_bus_id)}"
    ecc = "n/a" if info.ecc_enabled is None else "on" if info.ecc_enabled else "off"
    identity += f" · ECC {ecc}"
    if info.memory_error_mechanism:
        identity += f" ({escape(info.memory_error_mechanism)})"
    if lost:
        return f'{identity}<br><b style="color:{SHUTDOWN_COLOR}">lost: the GPU stopped answering</b>'
    if sample is None:
        return f"{identity}<br>no reading yet"
    pstate = "n/a" if sample.pstate is None else f"P{sample.pstate}"
    limit = "" if sample.power_limit_w is None else f" of {sample.power_limit_w:.0f} W"
    fan = "" if sample.fan_speed_pct is None else f" · fan {format_pct(sample.fan_speed_pct, 0)}"
    readings = (f"{pstate} · {_number(sample.temperature_c, '°C')} · {_number(sample.power_w, 'W')}{limit}"
                f" · SM {_number(sample.clock_sm_mhz, 'MHz')} · memory {_number(sample.clock_memory_mhz, 'MHz')}"
                f"{fan} · clock events: {escape(describe_reasons(sample.clock_event_reasons))}")
    return f"{identity}<br>{readings}"


def selected_index(arguments: Any, gpus: Sequence[GpuInfo]) -> int | None:
    """The GPU asked for with ``?gpu=N`` when there is one with that index, else the first GPU."""
    values = (arguments or {}).get("gpu") or []
    if values:
        last = values[-1]
        text = last.decode("utf-8", "replace") if isinstance(last, bytes) else str(last)
        if text.strip().isdigit() and any(gpu.index == int(text) for gpu in gpus):
            return int(text)
    return gpus[0].index if gpus else None


def _reasons_figure(fig: figure, panel: Panel, source: ColumnDataSource, interval_ms: float) -> list[DataRenderer]:
    """Turn a timeline figure into the band: one row per reason, a block for each reading with its bit set."""
    fig.y_range = Range1d(start=-0.6, end=len(panel.series) - 0.4)
    fig.yaxis.ticker = FixedTicker(ticks=list(range(len(panel.series))))
    fig.yaxis.formatter = BasicTickFormatter()
    fig.yaxis.major_label_overrides = {float(i): series.legend for i, series in enumerate(panel.series)}
    fig.yaxis.axis_label = None
    fig.ygrid.grid_line_color = None
    renderers: list[DataRenderer] = [
        fig.add_glyph(source, Rect(x="time", y=series.key, width=interval_ms, height=0.7, fill_color=series.color,
                                   line_color=None), name=series.legend, nonselection_glyph=None, muted_glyph=None)
        for series in panel.series
    ]
    meanings = {reason.name: f"{reason.name}: {reason.meaning}" for reason in REASONS}
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("reason", "$name{meaning}")],
                            formatters={"$name": CustomJSHover(args={"meanings": meanings},
                                                               code="return meanings[value] ?? value;")}))
    return renderers


class DetailsView:
    """The page's source, figures and selector for the GPU shown; ``switch`` refills them for another GPU."""

    def __init__(self, store: Store, info: GpuInfo, interval_s: float, dark: bool) -> None:
        self.store = store
        self.info = info
        self.panels = detail_panels(info)
        rows, self.seq = store.since(0)
        self.source = ColumnDataSource(data=self.data(rows))
        self.header = Div(text="", sizing_mode="stretch_width", styles={"color": text_color(dark)})
        self.gpm_note = Div(text=GPM_NOT_AVAILABLE, sizing_mode="stretch_width", styles={"color": text_color(dark)})
        x_range = timeline_range()
        self.figures: list[figure] = []
        for panel in self.panels:
            fig = timeline_figure(panel.title, panel.y_label, panel.unit, x_range, panel.y_max)
            if panel.title == "Clock event reasons":
                _reasons_figure(fig, panel, self.source, interval_s * 1000.0 * BLOCK_WIDTH)
            else:
                lines = add_series_lines(fig, self.source, panel.series)
                add_legend_above(fig, [legend_item(series.legend, line) for series, line in
                                       zip(panel.series, lines, strict=True)])
                add_timeline_hover(fig, lines, {series.key: series.legend for series in panel.series},
                                   what=panel.what, value=panel.value, unit=panel.unit)
            self.figures.append(fig)
        self.gpm_figure = self.figures[-1]
        self.follower: Follower | None = None
        self.show(rows[-1] if rows else None)

    def data(self, rows: Sequence[Snapshot]) -> DataDict:
        """The columns of ``rows`` for the GPU shown."""
        return timeline_data(rows, self.panels)

    def show(self, snapshot: Snapshot | None) -> None:
        """Refresh the header from the newest snapshot and the GPM part from the GPU's capability."""
        sample, lost = gpu_reading(snapshot, self.info.index)
        text = header_html(self.info, sample, lost)
        if text != self.header.text:
            self.header.text = text
        self.gpm_figure.visible = self.info.gpm_supported
        self.gpm_note.visible = not self.info.gpm_supported

    def on_rows(self, rows: Sequence[Snapshot]) -> None:
        """Stream the new rows, keeping as many as the store does."""
        self.source.stream(self.data(rows), rollover=self.store.capacity)
        self.show(rows[-1])

    def switch(self, info: GpuInfo) -> None:
        """Show ``info``'s GPU: same renderers, its own readers and thresholds, backfilled from the store."""
        self.info = info
        self.panels = detail_panels(info)
        rows, seq = self.store.since(0)
        if self.follower is not None:
            self.follower.seq = seq
        self.source.data = self.data(rows)
        self.show(rows[-1] if rows else None)


def _no_gpu(doc: Document, ctx: AppContext, dark: bool) -> None:
    detail = (ctx.store.inventory.nvml_error or "").strip()
    note = Div(text=f"No NVIDIA GPU was found{': ' + escape(detail) if detail else '.'}",
               styles={"color": text_color(dark)})
    follow(doc, ctx, ctx.store.last_seq, lambda _rows: None)
    add_page(doc, TITLE, note, dark=dark)


def build(doc: Document, ctx: AppContext) -> None:
    """The selected GPU's timelines, backfilled from the store and streamed as new rows arrive."""
    dark = apply_theme(doc)
    gpus = ctx.store.inventory.gpus
    index = selected_index(request_arguments(doc), gpus)
    if index is None:
        _no_gpu(doc, ctx, dark)
        return
    by_index = {gpu.index: gpu for gpu in gpus}
    view = DetailsView(ctx.store, by_index[index], ctx.interval_s, dark)
    options: list[str | tuple[Any, str]] = [(str(gpu.index), f"GPU {gpu.index}: {gpu.name}") for gpu in gpus]
    select = Select(value=str(index), options=options, width=260, height=30, sizing_mode="fixed")

    def selected(_attr: str, _old: Any, new: Any) -> None:
        if str(new).isdigit() and int(new) in by_index:
            view.switch(by_index[int(new)])

    select.on_change("value", selected)
    pause = pause_toggle()
    view.follower = follow(doc, ctx, view.seq, view.on_rows, pause)
    grid = gridplot([[fig] for fig in view.figures], sizing_mode="stretch_both", merge_tools=True,
                    toolbar_location="right")
    controls = row(select, pause, view.header, sizing_mode="stretch_width")
    add_page(doc, TITLE, controls, view.gpm_note, grid, dark=dark)
