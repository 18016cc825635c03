"""GPU Details: one GPU in depth. Temperature against its thresholds, power against its enforced and requested
limits, clocks against their maxima, the clock event reasons as a band under them, the video engines, and GPM
activity (SM, tensor, DRAM, the FP64/FP32/FP16 pipes) where the GPU has it. The header adds the share of the last
minute each of NVML's performance policies held the clocks back (from its violation-time counters).

One GPU at a time (chosen with the selector or ``?gpu=N``) keeps the page as cheap as one GPU's lines, whatever
the number of GPUs; switching refills the same renderers from the store (or, for a past range, the history).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np
from bokeh.document import Document
from bokeh.layouts import row
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
from nvdash.apps.rows import FloatArray, gpu_reading, gpu_value, nan_if_none
from nvdash.apps.theme import apply_theme, request_arguments
from nvdash.apps.throughput import recent_rows
from nvdash.apps.time_range import TimeRangeControl
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
    timeline_data,
)
from nvdash.health.clock_events import REASONS, SW_POWER_CAP, ClockEventReason, describe_reasons
from nvdash.history.query import HistoryResult
from nvdash.live.follow import Follower, follow, pause_toggle, refresh_batch, streamable
from nvdash.live.stages import Stage, StagedGrid, run_in_stages
from nvdash.live.ticks import TickCache, opening_columns
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
REQUESTED_LIMIT_COLOR = "#8c564b"
GPM_NOT_AVAILABLE = "GPM activity (SM active, tensor, DRAM, FP64/FP32/FP16 pipes) is not available on this GPU."
REASONS_TITLE = "Clock event reasons"
REASONS_METRIC = "clock_event_reasons"
GPM_TITLE = "GPM activity"
VIDEO_TITLE = "Video engines"
HELD_BACK_WINDOW_S = 60.0
"""The header's share of time the clocks were held back covers at most this many seconds of readings."""
NS_PER_S = 1e9

VIOLATION_POLICIES: tuple[tuple[str, Callable[[GpuSample], int | None]], ...] = (
    ("power cap", lambda s: s.violation_power_ns),
    ("thermal", lambda s: s.violation_thermal_ns),
    ("sync boost", lambda s: s.violation_sync_boost_ns),
    ("board limit", lambda s: s.violation_board_limit_ns),
    ("low utilization", lambda s: s.violation_low_utilization_ns),
    ("reliability", lambda s: s.violation_reliability_ns),
)
"""NVML's performance policies (``nvmlPerfPolicyType_t``) and the violation-time counter of each."""


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


def reason_key(reason: ClockEventReason) -> str:
    """The source column of one reason's row in the band."""
    return f"reason/{reason.bit:#x}"


def reason_rows(masks: FloatArray, bit: int, row_index: int) -> FloatArray:
    """The band's y for one reason over past buckets: its row where the bucket's OR has the bit, else NaN."""
    known = np.isfinite(masks)
    bits = np.where(known, masks, 0).astype(np.int64)
    return np.where(known & (bits & bit != 0), float(row_index), np.nan)


def detail_constants(info: GpuInfo) -> dict[str, float | None]:
    """The GPU's fixed limits drawn as dashed lines, by column."""
    return {"slowdown": info.temperature_slowdown_c, "shutdown": info.temperature_shutdown_c,
            "sm_max": info.clock_sm_max_mhz, "mem_max": info.clock_memory_max_mhz}


def _reason_color(reason: ClockEventReason) -> str:
    if reason.benign:
        return BENIGN_COLOR
    return POWER_CAP_COLOR if reason.bit == SW_POWER_CAP else THROTTLE_COLOR


def _line(key: str, legend: str, color: str, value: Callable[[Snapshot], float | None], dash: str = "solid") -> Series:
    return Series(key, legend, legend, color, value, dash=dash)


def detail_panels(info: GpuInfo) -> tuple[Panel, ...]:
    """The timeline panels of one GPU; the column names are the same for every GPU, so switching refills them."""
    i = info.index
    limits = detail_constants(info)

    def line(key: str, legend: str, color: str, read: Callable[[GpuSample], float | None], metric: str, *,
             dash: str = "solid") -> Series:
        return Series(key, legend, legend, color, gpu_value(i, read), i, dash, metric)

    def limit(key: str, legend: str, color: str) -> Series:
        return _line(key, legend, color, _constant(limits[key]), "dashed")

    return (
        Panel("Temperature", "temperature", Unit.CELSIUS, (
            line("temp", "GPU", GPU_COLOR, lambda s: s.temperature_c, "temperature_c"),
            line("mem_temp", "memory", MEMORY_COLOR, lambda s: s.memory_temperature_c, "memory_temperature_c"),
            limit("slowdown", "slowdown", LIMIT_COLOR),
            limit("shutdown", "shutdown", SHUTDOWN_COLOR),
        ), what="series", value="temperature"),
        Panel("Power", "power", Unit.WATTS, (
            line("power", "power draw", GPU_COLOR, lambda s: s.power_w, "power_w"),
            line("power_limit", "enforced limit", LIMIT_COLOR, lambda s: s.power_limit_w, "power_limit_w",
                 dash="dashed"),
            line("power_requested", "requested limit", REQUESTED_LIMIT_COLOR, lambda s: s.power_management_limit_w,
                 "power_management_limit_w", dash="dotted"),
        ), what="series", value="power"),
        Panel("Clocks", "clock", Unit.MHZ, (
            line("sm_clock", "SM", GPU_COLOR, lambda s: s.clock_sm_mhz, "clock_sm_mhz"),
            line("mem_clock", "memory", MEMORY_COLOR, lambda s: s.clock_memory_mhz, "clock_memory_mhz"),
            limit("sm_max", "SM max", GPU_COLOR),
            limit("mem_max", "memory max", MEMORY_COLOR),
        ), what="series", value="clock"),
        Panel(REASONS_TITLE, "", Unit.PCT, tuple(
            Series(reason_key(reason), reason.name, reason.name, _reason_color(reason),
                   _reason_row(i, reason.bit, row_index), i, metric=REASONS_METRIC)
            for row_index, reason in enumerate(REASONS)
        )),
        Panel(GPM_TITLE, "activity", Unit.PCT, (
            line("gpm_sm", "SM active", GPU_COLOR, lambda s: s.gpm_sm_active_pct, "gpm_sm_active_pct"),
            line("gpm_occupancy", "SM occupancy", "#17becf", lambda s: s.gpm_sm_occupancy_pct,
                 "gpm_sm_occupancy_pct"),
            line("gpm_tensor", "tensor active", "#2ca02c", lambda s: s.gpm_tensor_active_pct, "gpm_tensor_active_pct"),
            line("gpm_dram", "DRAM active", MEMORY_COLOR, lambda s: s.gpm_dram_active_pct, "gpm_dram_active_pct"),
            line("gpm_fp64", "FP64", "#d62728", lambda s: s.gpm_fp64_active_pct, "gpm_fp64_active_pct",
                 dash="dashed"),
            line("gpm_fp32", "FP32", "#ff7f0e", lambda s: s.gpm_fp32_active_pct, "gpm_fp32_active_pct",
                 dash="dashed"),
            line("gpm_fp16", "FP16", "#e377c2", lambda s: s.gpm_fp16_active_pct, "gpm_fp16_active_pct",
                 dash="dashed"),
        ), 100.0, what="series", value="activity"),
        Panel(VIDEO_TITLE, "busy", Unit.PCT, (
            line("encoder", "encoder", GPU_COLOR, lambda s: s.encoder_utilization_pct, "encoder_utilization_pct"),
            line("decoder", "decoder", MEMORY_COLOR, lambda s: s.decoder_utilization_pct, "decoder_utilization_pct"),
        ), 100.0, what="engine", value="busy"),
    )


def _number(value: float | None, unit: str, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} {unit}"


def held_back_shares(rows: Sequence[Snapshot], index: int) -> tuple[float, list[tuple[str, float]]]:
    """How long the readings ``rows`` span for GPU ``index`` (seconds), and for each performance policy with two
    readings in them, the share of that time (0-100 %) it held the clocks below the requested ones: the rise of its
    violation-time counter over the time between its oldest and newest reading. A counter that fell (the driver
    was reloaded) is left out."""
    span = 0.0
    shares: list[tuple[str, float]] = []
    samples = [(row.time_s, sample) for row in rows if (sample := gpu_reading(row, index)[0]) is not None]
    for name, read in VIOLATION_POLICIES:
        oldest = next(((t, value) for t, sample in samples if (value := read(sample)) is not None), None)
        newest = next(((t, value) for t, sample in reversed(samples) if (value := read(sample)) is not None), None)
        if oldest is None or newest is None:
            continue
        (first_s, first), (last_s, last) = oldest, newest
        if last_s <= first_s or last < first:
            continue
        span = max(span, last_s - first_s)
        shares.append((name, min(100.0, 100.0 * (last - first) / ((last_s - first_s) * NS_PER_S))))
    return span, shares


def held_back_text(span_s: float, shares: Sequence[tuple[str, float]]) -> str:
    """``clocks held back in the last 60 s: power cap 25 % · thermal 3 %`` (the policies that did, rounded to
    whole percent), ``... never`` when none did, or empty when no counter was read twice."""
    if not shares:
        return ""
    shown = [f"{name} {format_pct(share, 0)}" for name, share in shares if round(share) > 0]
    return f"clocks held back in the last {span_s:.0f} s: {' · '.join(shown) if shown else 'never'}"


def header_html(info: GpuInfo, sample: GpuSample | None, lost: bool, held_back: str = "") -> str:
    """The selected GPU's identity, its newest readings, and its video engines and held-back clocks (``held_back``,
    from :func:`held_back_text`), in one line each."""
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
    limit = "" if sample.power_limit_w is None else f" of {sample.power_limit_w:.0f} W enforced"
    if sample.power_management_limit_w is not None:
        limit += f" ({sample.power_management_limit_w:.0f} W requested)"
    fan = "" if sample.fan_speed_pct is None else f" · fan {format_pct(sample.fan_speed_pct, 0)}"
    readings = (f"{pstate} · {_number(sample.temperature_c, '°C')} · {_number(sample.power_w, 'W')}{limit}"
                f" · SM {_number(sample.clock_sm_mhz, 'MHz')} · memory {_number(sample.clock_memory_mhz, 'MHz')}"
                f"{fan} · clock events: {escape(describe_reasons(sample.clock_event_reasons))}")
    more = []
    if sample.encoder_utilization_pct is not None or sample.decoder_utilization_pct is not None:
        more.append(f"video encoder {format_pct(sample.encoder_utilization_pct, 0)}"
                    f" · decoder {format_pct(sample.decoder_utilization_pct, 0)}")
    if held_back:
        more.append(escape(held_back))
    return f"{identity}<br>{readings}" + (f"<br>{' · '.join(more)}" if more else "")


def selected_index(arguments: Any, gpus: Sequence[GpuInfo]) -> int | None:
    """The GPU asked for with ``?gpu=N`` when there is one with that index, else the first GPU."""
    values = (arguments or {}).get("gpu") or []
    if values:
        last = values[-1]
        text = last.decode("utf-8", "replace") if isinstance(last, bytes) else str(last)
        if text.strip().isdecimal() and any(gpu.index == int(text) for gpu in gpus):
            return int(text)
    return gpus[0].index if gpus else None


def _reasons_figure(fig: figure, panel: Panel, source: ColumnDataSource, interval_ms: float) -> list[Rect]:
    """Turn a timeline figure into the band: one row per reason, a block for each reading with its bit set.

    Returns the blocks' glyphs, whose width a past range sets to its step.
    """
    fig.y_range = Range1d(start=-0.6, end=len(panel.series) - 0.4)
    fig.yaxis.ticker = FixedTicker(ticks=list(range(len(panel.series))))
    fig.yaxis.formatter = BasicTickFormatter()
    fig.yaxis.major_label_overrides = {float(i): series.legend for i, series in enumerate(panel.series)}
    fig.yaxis.axis_label = None
    fig.ygrid.grid_line_color = None
    glyphs = [Rect(x="time", y=series.key, width=interval_ms, height=0.7, fill_color=series.color, line_color=None)
              for series in panel.series]
    renderers: list[DataRenderer] = [
        fig.add_glyph(source, glyph, name=series.legend, nonselection_glyph=None, muted_glyph=None)
        for series, glyph in zip(panel.series, glyphs, strict=True)
    ]
    meanings = {reason.name: f"{reason.name}: {reason.meaning}" for reason in REASONS}
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("reason", "$name{meaning}")],
                            formatters={"$name": CustomJSHover(args={"meanings": meanings},
                                                               code="return meanings[value] ?? value;")}))
    return glyphs


def _header_now(info: GpuInfo, store: Store, interval_s: float, snapshot: Snapshot | None) -> str:
    """:func:`header_html` of ``snapshot``, with the held-back clocks of the store's last minute (computed once per
    snapshot for every page showing the GPU: see :meth:`DetailsView.show`)."""
    sample, lost = gpu_reading(snapshot, info.index)
    held_back = ""
    if sample is not None:
        rows, _seq = recent_rows(store, interval_s, HELD_BACK_WINDOW_S)
        held_back = held_back_text(*held_back_shares(rows, info.index))
    return header_html(info, sample, lost, held_back)


class DetailsView:
    """The page's source, figures and selector for the GPU shown; ``switch`` refills them for another GPU.

    Live, it streams the store's rows; for a past range (its ``control``) it shows the history's buckets. The
    figures are made one at a time (:meth:`make_figure`), so a page built in stages sends one per turn.
    """

    def __init__(self, store: Store, info: GpuInfo, interval_s: float, dark: bool,
                 ticks: TickCache | None = None) -> None:
        self.store = store
        self.interval_s = interval_s
        self.ticks = ticks if ticks is not None else TickCache(capacity=4)
        self.info = info
        self.panels = detail_panels(info)
        panels = self.panels  # the GPU's own, even if another is chosen while the steps run
        data, self.seq, self.warming = opening_columns(self.ticks, self._store_name(), store,
                                                       lambda rows: timeline_data(rows, panels)) \
            if ticks is not None else (*self.store_data(), [])
        # warming: on a cold cache, the steps that compute the GPU's store columns a slice at a time (the page
        # runs them, then show_live).
        self.source = ColumnDataSource(data=data)
        self.header = Div(text="", sizing_mode="stretch_width", styles={"color": text_color(dark)})
        self.gpm_note = Div(text=GPM_NOT_AVAILABLE, sizing_mode="stretch_width", styles={"color": text_color(dark)})
        self.x_range = timeline_range()
        self.block_ms = interval_s * 1000.0 * BLOCK_WIDTH
        self.figures: list[figure] = []
        self.blocks: list[Rect] = []
        self.layers = HistoryLayers()
        self.gpm_figure: figure | None = None
        self.video_figure: figure | None = None
        self.follower: Follower | None = None
        self.control: TimeRangeControl | None = None
        self.show(store.latest())

    def make_figure(self, panel: Panel) -> figure:
        """``panel``'s plot, made whole (lines, legend, hover, history bands) before it joins a page: changes to
        a model outside a shown document cost nothing, inside it a walk over all its models each."""
        fig = timeline_figure(panel.title, panel.y_label, panel.unit, self.x_range, panel.y_max)
        show_dates_on_long_ranges(fig)
        if panel.title == REASONS_TITLE:
            self.blocks = _reasons_figure(fig, panel, self.source, self.block_ms)
        else:
            lines = add_series_lines(fig, self.source, panel.series)
            add_legend_above(fig, [legend_item(series.legend, line) for series, line in
                                   zip(panel.series, lines, strict=True)])
            add_timeline_hover(fig, lines, {series.key: series.legend for series in panel.series},
                               what=panel.what, value=panel.value, unit=panel.unit)
            self.layers.add(fig, panel.series, lines)
        if panel.title == GPM_TITLE:
            self.gpm_figure = fig
            fig.visible = self.info.gpm_supported
        if panel.title == VIDEO_TITLE:
            self.video_figure = fig
            fig.visible = self._has_video(self.store.latest())
        self.figures.append(fig)
        return fig

    def store_data(self) -> tuple[DataDict, int]:
        """The columns of every row the store holds for the GPU shown (shared by its pages), and the newest
        row's number."""
        panels = self.panels
        return self.ticks.store_columns(self._store_name(), self.store, lambda rows: timeline_data(rows, panels))

    def _store_name(self) -> tuple[str, str]:
        return ("GPU details", self.info.uuid)

    @property
    def following(self) -> bool:
        """Whether new rows are streamed (not while a past range is shown)."""
        return self.control is None or self.control.live

    def data(self, rows: Sequence[Snapshot]) -> DataDict:
        """The columns of ``rows`` for the GPU shown."""
        return timeline_data(rows, self.panels)

    def _has_video(self, snapshot: Snapshot | None) -> bool:
        """Whether the GPU's newest reading has an encoder or decoder figure (the plot is hidden otherwise)."""
        sample, _lost = gpu_reading(snapshot, self.info.index)
        return sample is not None and (sample.encoder_utilization_pct is not None
                                       or sample.decoder_utilization_pct is not None)

    def show(self, snapshot: Snapshot | None) -> None:
        """Refresh the header from the newest snapshot (and the store's last minute, for the held-back clocks), the
        GPM part from the GPU's capability and the video plot from whether the GPU reports its engines."""
        info, store, interval_s = self.info, self.store, self.interval_s
        text = self.ticks.latest(("GPU details header", info.uuid), snapshot,
                                 lambda newest: _header_now(info, store, interval_s, newest))
        if text != self.header.text:
            self.header.text = text
        if self.gpm_figure is not None and self.gpm_figure.visible != self.info.gpm_supported:
            self.gpm_figure.visible = self.info.gpm_supported
        if self.video_figure is not None:
            video = self._has_video(snapshot)
            if video != self.video_figure.visible:
                self.video_figure.visible = video
        if self.gpm_note.visible == self.info.gpm_supported:
            self.gpm_note.visible = not self.info.gpm_supported

    def on_rows(self, rows: Sequence[Snapshot]) -> None:
        """Stream the new rows (Live only), keeping as many as the store does; the header always follows."""
        if self.following:
            data = self.ticks.rows(("GPU details", self.info.uuid), rows, lambda new: streamable(self.data(new)))
            self.source.stream(data, rollover=self.store.capacity)
        self.show(rows[-1])

    def switch(self, info: GpuInfo) -> None:
        """Show ``info``'s GPU: same renderers, its own readers and thresholds, refilled for the range shown."""
        self.info = info
        self.panels = detail_panels(info)
        self.show(self.store.latest())
        if self.following:
            self.show_live()
        elif self.control is not None:
            self.control.reload()

    def history_request(self) -> tuple[list[str], list[int] | None]:
        return history_metrics(all_series(self.panels)), [self.info.index]

    def show_live(self) -> None:
        data, seq = self.store_data()
        if self.follower is not None:
            self.follower.seq = seq
        self.source.data = data
        self._set_block_width(self.block_ms)
        self.layers.clear()

    def prepare_history(self) -> None:
        """Make the band layers now (see :meth:`HistoryLayers.prepare`)."""
        self.layers.prepare()

    def show_history(self, result: HistoryResult) -> None:
        """Bucket means and bands; the limits across the whole range; a reason's block where a bucket's OR has it."""
        times, aligned = align(result, all_series(self.panels), edges=True)
        data = history_data(times, aligned, self.panels)
        for key, limit in detail_constants(self.info).items():
            data[key] = np.full(len(times), nan_if_none(limit))
        for row_index, reason in enumerate(REASONS):
            key = reason_key(reason)
            data[key] = reason_rows(np.asarray(data[key], dtype=np.float64), reason.bit, row_index)
        self.source.data = data
        self._set_block_width(result.step_s * 1000.0)
        self.layers.show(times, aligned, result)

    def _set_block_width(self, width_ms: float) -> None:
        for glyph in self.blocks:
            glyph.width = width_ms


def _no_gpu(doc: Document, ctx: AppContext, dark: bool) -> None:
    detail = (ctx.store.inventory.nvml_error or "").strip()
    note = Div(text=f"No NVIDIA GPU was found{': ' + escape(detail) if detail else '.'}",
               styles={"color": text_color(dark)})
    follow(doc, ctx, ctx.store.last_seq, lambda _rows: None)
    add_page(doc, TITLE, note, dark=dark)


def build(doc: Document, ctx: AppContext) -> None:
    """The selected GPU's timelines: Live (backfilled from the store, then streamed) or a past range."""
    dark = apply_theme(doc)
    gpus = ctx.store.inventory.gpus
    index = selected_index(request_arguments(doc), gpus)
    if index is None:
        _no_gpu(doc, ctx, dark)
        return
    by_index = {gpu.index: gpu for gpu in gpus}
    view = DetailsView(ctx.store, by_index[index], ctx.interval_s, dark, ctx.ticks)
    if ctx.history is not None:
        view.prepare_history()  # with the page: adding renderers to a shown page costs the browser a second
    options: list[str | tuple[Any, str]] = [(str(gpu.index), f"GPU {gpu.index}: {gpu.name}") for gpu in gpus]
    select = Select(value=str(index), options=options, width=260, height=30, sizing_mode="fixed")

    def selected(_attr: str, _old: Any, new: Any) -> None:
        if str(new).isdecimal() and int(new) in by_index:
            view.switch(by_index[int(new)])

    select.on_change("value", selected)
    pause = pause_toggle()
    view.control = TimeRangeControl(doc, ctx, view, view.x_range, pause=pause, dark=dark)
    # Redrawn about once a second, as the classic timelines are (see live.REFRESH_S): half the messages.
    view.follower = follow(doc, ctx, view.seq, view.on_rows, pause, batch=refresh_batch(ctx))
    grid = StagedGrid()
    controls = row(select, *view.control.widgets(), sizing_mode="stretch_width")
    add_page(doc, TITLE, controls, view.header, view.gpm_note, grid.plot, dark=dark)

    made: list[figure] = []

    def make_plot(panel: Panel) -> None:  # outside the page: no walk over the page's models (see timelines)
        made.append(view.make_figure(panel))

    def join_page() -> None:
        grid.add(made.pop(0))

    def open_control() -> None:
        if view.control is not None:
            view.control.open()

    stages: list[Stage] = [stage for panel in view.panels for stage in (partial(make_plot, panel), join_page)]
    filled: list[Stage] = [*view.warming, view.show_live] if view.warming else []
    run_in_stages(doc, [*filled, *stages, grid.finish, open_control], staging=ctx.staging)
