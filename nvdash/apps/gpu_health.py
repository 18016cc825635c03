"""GPU Health: each GPU's status with its reasons, a strip of each GPU's status over time, bottleneck hints
with their evidence, and the event log.

Everything comes from the store (the newest snapshot, the recent rows, the events) and the accounting (the
allocations idle for long enough, a warning on their GPU); nothing here reads the hardware. One periodic callback
re-evaluates only when a new row or a new event arrived.
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np
from bokeh.document import Document
from bokeh.layouts import row
from bokeh.models import (
    BasicTickFormatter,
    ColumnDataSource,
    CustomJSHover,
    DataRange1d,
    FixedTicker,
    HoverTool,
    Range1d,
    Rect,
)
from bokeh.models.renderers import GlyphRenderer
from bokeh.models.widgets import DataTable, Div, HTMLTemplateFormatter, TableColumn, Toggle
from bokeh.transform import linear_cmap

from nvdash.apps.context import AppContext
from nvdash.apps.figures import (
    BLOCK_WIDTH,
    STATUS_COLORS,
    Unit,
    add_page,
    data_table,
    gpu_label,
    skip_gaps,
    text_color,
    timeline_figure,
    timeline_range,
)
from nvdash.apps.rows import FloatArray, gpu_sample, time_ms
from nvdash.apps.theme import apply_theme
from nvdash.apps.time_range import TimeRangeControl
from nvdash.health.hints import Hint, bottleneck_hints
from nvdash.health.quota_judge import store_findings
from nvdash.health.quotas import QuotaFinding
from nvdash.health.status import GpuHealth, Status, evaluate, evaluate_gpu
from nvdash.health.xid import xid_info
from nvdash.history.query import HistoryResult, Series
from nvdash.live.backpressure import viewers_ready
from nvdash.live.follow import period_ms, refresh_batch, streamable
from nvdash.live.stages import placeholder, run_in_stages
from nvdash.live.ticks import TickCache, opening_columns
from nvdash.live.visibility import hidden_flag
from nvdash.sampling.records import GpuEvent, GpuSample, Inventory, Snapshot
from nvdash.store import Store

if TYPE_CHECKING:
    from bokeh.models.renderers import DataRenderer
    from bokeh.models.sources import DataDict
    from bokeh.plotting import figure

    from nvdash.accounting.report import AccountingBook

log = logging.getLogger(__name__)

TITLE = "GPU Health"
EVENT_ROWS = 200
"""The newest events shown."""
AGE_STEP_S = 10.0
"""The status is judged again at least this often without new readings (``format_age`` counts in tens of seconds)."""
HINT_PERIOD_S = 5.0
"""Hints average over a minute or more: recomputing them more often than this shows nothing new."""

_MUTED = "opacity: 0.7;"


def status_html(inventory: Inventory, healths: Sequence[GpuHealth], quotas: Sequence[QuotaFinding] = ()) -> str:
    """One row per GPU: its coloured status, its name and bus id, and each reason with what to do; a quota finding
    (:mod:`nvdash.health.quotas`) is a flag on its GPU's row, or below the table when its GPU is not known."""
    if not inventory.gpus:
        detail = (inventory.nvml_error or "").strip()
        return f"<p>No NVIDIA GPU was found{': ' + escape(detail) if detail else '.'}</p>"
    by_index = {health.index: health for health in healths}
    rows = []
    for info in inventory.gpus:
        health = by_index.get(info.index)
        status = Status.OK if health is None else health.status
        color = STATUS_COLORS[status.value]
        badge = (f'<span style="display:inline-block;min-width:5.5em;text-align:center;padding:1px 6px;'
                 f'border-radius:4px;color:#fff;background:{color};font-weight:600">{status.label}</span>')
        flags = [_quota_item(found) for found in quotas if found.gpu_uuid == info.uuid]
        if (health is None or not health.findings) and not flags:
            reasons = f'<span style="{_MUTED}">no problem found</span>'
        else:
            items = list(flags)
            for finding in health.findings if health is not None else ():
                action = f' <span style="{_MUTED}">({escape(finding.action)})</span>' if finding.action else ""
                items.append(f'<li><span style="color:{STATUS_COLORS[finding.status.value]}">&#9679;</span> '
                             f"{escape(finding.text)}{action}</li>")
            reasons = f'<ul style="margin:0;padding-left:1em;list-style:none">{"".join(items)}</ul>'
        bus = f' <span style="{_MUTED}">{escape(info.pci_bus_id)}</span>' if info.pci_bus_id else ""
        rows.append(f'<tr data-status="{status.value}"><td style="padding:4px 8px;vertical-align:top">{badge}</td>'
                    f'<td style="padding:4px 8px;vertical-align:top;white-space:nowrap"><b>GPU {info.index}</b> '
                    f"{escape(info.name)}{bus}</td>"
                    f'<td style="padding:4px 8px;vertical-align:top">{reasons}</td></tr>')
    known = {info.uuid for info in inventory.gpus}
    others = "".join(_quota_item(found) for found in quotas if found.gpu_uuid not in known)
    more = f'<ul style="margin:0;padding-left:1em;list-style:none">{others}</ul>' if others else ""
    return f'<table style="border-collapse:collapse;width:100%">{"".join(rows)}</table>{more}'


def _quota_item(found: QuotaFinding) -> str:
    """A quota finding as a flagged reason: ``Quota: <its sentence>``."""
    color = STATUS_COLORS[Status.WARNING.value]
    return (f'<li data-quota="{escape(found.kind)}"><span style="color:{color}">&#9873;</span> '
            f"Quota: {escape(found.text)}</li>")


@dataclass
class _SharedHints:
    """The hints last computed for one store, with the snapshot time they were asked for at, and the computation
    under way (``None``: none)."""

    at_s: float
    html: str
    pending: Future[str] | None = None


_SHARED_HINTS: weakref.WeakKeyDictionary[Store, _SharedHints] = weakref.WeakKeyDictionary()

HINTS_PENDING = f'<p style="{_MUTED}">Looking at the recent readings for bottlenecks...</p>'
"""Shown until the first hints computed off the event loop are in."""


def _compute_hints(inventory: Inventory, rows: Sequence[Snapshot]) -> str:
    return hints_html(bottleneck_hints(inventory, rows))


def shared_hints_html(store: Store, now_s: float, executor: Executor | None = None) -> str:
    """The hints for ``store`` as HTML, computed at most once per ``HINT_PERIOD_S`` for every open page.

    Fitting trends over the whole store takes about 50 ms (1,200 rows of 8 GPUs); every session of the page shows
    the same result, so they share one computation. With an ``executor`` it runs there, off the event loop (it
    would stall every viewer of every page for as long), and the pages show the previous hints until it is done.
    """
    shared = _SHARED_HINTS.get(store)
    if shared is not None and shared.pending is not None and shared.pending.done():
        try:
            shared.html = shared.pending.result()
        except Exception:  # a rule that fails costs the hints of this round, not the page
            log.exception("computing the bottleneck hints failed")
        shared.pending = None
    if shared is None or now_s - shared.at_s >= HINT_PERIOD_S or now_s < shared.at_s:
        rows, _ = store.since(0)
        if executor is None:
            shared = _SHARED_HINTS[store] = _SharedHints(now_s, _compute_hints(store.inventory, rows))
        else:
            if shared is None:
                shared = _SHARED_HINTS[store] = _SharedHints(now_s, HINTS_PENDING)
            if shared.pending is None:
                shared.at_s = now_s
                shared.pending = executor.submit(_compute_hints, store.inventory, rows)
    return shared.html


def hints_html(hints: Sequence[Hint]) -> str:
    """Each hint with its evidence; a plain sentence when there is none."""
    if not hints:
        return f'<p style="{_MUTED}">No bottleneck stands out in the recent readings.</p>'
    items = "".join(f"<li><b>{escape(hint.text)}</b><br><span style=\"{_MUTED}\">{escape(hint.evidence)}</span></li>"
                    for hint in hints)
    return f'<ul style="margin:0;padding-left:1.2em">{items}</ul>'


def _event_text(event: GpuEvent) -> tuple[str, str, str]:
    """``(severity, message, action)``; an XID is described from the catalog."""
    if event.kind != "xid":
        return event.severity, event.message, ""
    info = xid_info(event.code)
    return info.severity, f"XID {event.code}: {info.meaning}", info.action


def event_columns(events: Sequence[GpuEvent], limit: int = EVENT_ROWS, *, info: bool = True) -> dict[str, list[Any]]:
    """The event table's source: the newest ``limit`` events (without ``info`` ones unless asked), newest first.

    Events come from two threads (the sampler, the XID watcher), so they are ordered by their time here.
    """
    data: dict[str, list[Any]] = {name: [] for name in (
        "time", "gpu", "severity", "color", "kind", "message", "action")}
    shown: list[tuple[GpuEvent, str, str, str]] = []
    for event in sorted(events, key=lambda event: event.time_s, reverse=True):
        if len(shown) >= limit:
            break
        severity, message, action = _event_text(event)
        if info or severity != "info":
            shown.append((event, severity, message, action))
    for event, severity, message, action in shown:
        data["time"].append(event.time_s * 1000.0)
        data["gpu"].append("all" if event.gpu_index is None else f"GPU {event.gpu_index}")
        data["severity"].append(severity)
        data["color"].append(STATUS_COLORS.get(severity, STATUS_COLORS["info"]))
        data["kind"].append(event.kind)
        data["message"].append(message)
        data["action"].append(action)
    return data


def _event_table(source: ColumnDataSource, dark: bool) -> DataTable:
    # <%- %> escapes: a severity comes from the events of a history file too, and must arrive as text.
    time_format = HTMLTemplateFormatter(template="<%- new Date(value).toLocaleString() %>")
    severity_format = HTMLTemplateFormatter(
        template='<span style="color:<%- color %>;font-weight:600"><%- value %></span>')
    return data_table(
        source,
        [
            TableColumn(field="time", title="time", formatter=time_format, width=150),
            TableColumn(field="gpu", title="GPU", width=55),
            TableColumn(field="severity", title="severity", formatter=severity_format, width=65),
            TableColumn(field="kind", title="kind", width=60),
            TableColumn(field="message", title="what happened", width=380),
            TableColumn(field="action", title="what to do", width=380),
        ],
        dark,
        sizing_mode="stretch_both",
        min_height=160,
    )


def history_columns(inventory: Inventory, rows: Sequence[Snapshot]) -> DataDict:
    """The status strip's source: ``time`` and, per GPU, its status rank from that row's readings (0 OK,
    1 Warning, 2 Critical; NaN where the GPU has no reading). Recent events are left out: this is what the
    readings said at each moment."""
    data: DataDict = {"time": time_ms(rows)}
    for info in inventory.gpus:
        ranks: FloatArray = np.full(len(rows), np.nan)
        for i, snapshot in enumerate(rows):
            sample = gpu_sample(snapshot, info.index)
            if sample is not None:
                ranks[i] = evaluate_gpu(info, sample, (), snapshot.time_s).status.rank
        data[f"status/{info.index}"] = ranks
    return data


HEALTH_METRICS = ("lost", "utilization_pct", "temperature_c", "memory_temperature_c", "clock_event_reasons",
                  "ecc_uncorrected_volatile", "remap_pending", "remap_failure", "retired_pages_pending",
                  "pcie_generation_current", "pcie_width_current")
"""What the status rules read that the history keeps (per-link NVLink states are not in its buckets)."""
_WORST_IS_LOWEST = frozenset({"pcie_generation_current", "pcie_width_current"})
_INTEGRAL = frozenset({"clock_event_reasons", "ecc_uncorrected_volatile", "pcie_generation_current",
                       "pcie_width_current"})
_FLAGS = frozenset({"lost", "remap_pending", "remap_failure", "retired_pages_pending"})


def _worst(name: str, series: Series, k: int) -> float | int | bool | None:
    value = float((series.minimum if name in _WORST_IS_LOWEST else series.maximum)[k])
    if math.isnan(value):
        return None
    if name in _FLAGS:
        return bool(value)
    return int(value) if name in _INTEGRAL else value


def bucket_samples(result: HistoryResult, index: int) -> list[tuple[float, GpuSample | None]]:
    """Per bucket of GPU ``index``: its start time and a sample of the worst each reading reached in it (the
    highest temperature, every flag and clock event seen, the lowest link generation), ``None`` in a gap."""
    columns = {name: result.series.get(name, {}).get(index) for name in HEALTH_METRICS}
    reference = columns["temperature_c"] or next((series for series in columns.values() if series is not None), None)
    if reference is None:
        return []
    buckets: list[tuple[float, GpuSample | None]] = []
    for k, time_s in enumerate(reference.time_s.tolist()):
        values = {name: _worst(name, series, k) for name, series in columns.items() if series is not None}
        if all(value is None for value in values.values()):
            buckets.append((time_s, None))
            continue
        values["lost"] = bool(values.get("lost"))
        buckets.append((time_s, GpuSample(index=index, **values)))  # type: ignore[arg-type]
    return buckets


def history_columns_of(inventory: Inventory, result: HistoryResult) -> DataDict:
    """The status strip's source for a past range: per bucket (at its centre) each GPU's worst status in it."""
    by_gpu = {info.index: dict(bucket_samples(result, info.index)) for info in inventory.gpus}
    times = sorted({time_s for buckets in by_gpu.values() for time_s in buckets})
    data: DataDict = {"time": np.array([(t + result.step_s / 2) * 1000.0 for t in times], dtype=np.float64)}
    for info in inventory.gpus:
        ranks: FloatArray = np.full(len(times), np.nan)
        buckets = by_gpu[info.index]
        for i, time_s in enumerate(times):
            sample = buckets.get(time_s)
            if sample is not None:
                ranks[i] = evaluate_gpu(info, sample, (), time_s).status.rank
        data[f"status/{info.index}"] = ranks
    return data


def _history_figure(inventory: Inventory, source: ColumnDataSource, interval_s: float,
                    x_range: DataRange1d | None = None) -> figure:
    """One row per GPU (the first on top), a block per reading coloured by its status."""
    count = len(inventory.gpus)
    fig = timeline_figure("Status over time (from the readings)", "", Unit.PCT, x_range or timeline_range(), None)
    fig.sizing_mode = "stretch_width"
    fig.height = 60 + 22 * max(count, 1)
    fig.y_range = Range1d(start=-0.6, end=max(count, 1) - 0.4)
    fig.yaxis.ticker = FixedTicker(ticks=list(range(count)))
    fig.yaxis.formatter = BasicTickFormatter()
    fig.yaxis.major_label_overrides = {float(count - 1 - n): gpu_label(info) for n, info in enumerate(inventory.gpus)}
    fig.yaxis.axis_label = None
    fig.ygrid.grid_line_color = None
    palette = [STATUS_COLORS["ok"], STATUS_COLORS["warning"], STATUS_COLORS["critical"]]
    renderers: list[DataRenderer] = []
    for n, info in enumerate(inventory.gpus):
        column = f"status/{info.index}"
        fill = linear_cmap(column, palette, -0.5, 2.5, nan_color="rgba(0,0,0,0)")
        block = Rect(x="time", y=float(count - 1 - n), width=interval_s * 1000.0 * BLOCK_WIDTH, height=0.7,
                     fill_color=fill, line_color=None)
        renderers.append(fig.add_glyph(source, block, name=column, nonselection_glyph=None, muted_glyph=None))
    labels = {f"status/{info.index}": gpu_label(info) for info in inventory.gpus}
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("GPU", "$name{label}"), ("status", "@$name{status}")],
                            filters=skip_gaps(),
                            formatters={
                                "$name": CustomJSHover(args={"labels": labels}, code="return labels[value] ?? value;"),
                                "@$name": CustomJSHover(code='return ["OK", "Warning", "Critical"][value] ?? "n/a";'),
                            }))
    return fig


STRIP = "health strip"
"""The name of the strip's whole-store columns in the route's :class:`TickCache`."""


class HealthView:
    """The page's live parts and what it last showed; ``poll`` is the document's one periodic callback."""

    def __init__(self, store: Store, dark: bool, interval_s: float = 1.0, ticks: TickCache | None = None,
                 accounting: AccountingBook | None = None, *, clock: Callable[[], float] = time.time,
                 batch: int = 1, executor: Executor | None = None) -> None:
        self.store = store
        self.clock = clock
        """"Now" for the status (the server's one clock, as the index page and the snapshot API judge by)."""
        self.executor = executor
        """Where the hints are computed (``None``: here, on the caller's thread)."""
        self.batch = max(1, batch)
        """The strip takes new rows ``batch`` at a time, up to a sequence number that is a multiple of it (as
        :class:`~nvdash.live.follow.Follower` hands them on): every page of the route streams the same rows."""
        self.accounting = accounting
        """Where the allocations idle now are read (``None``: not kept)."""
        self.ticks = ticks if ticks is not None else TickCache(capacity=4)
        """The strip's new columns and the status, computed once per tick for every open page."""
        style: dict[str, str | None] = {"color": text_color(dark)}
        strip, self.history_seq, self.warming = opening_columns(self.ticks, STRIP, store, self._strip_columns) \
            if ticks is not None else (*self.strip_data(), [])
        # warming: on a cold cache, the steps that compute the strip's columns a slice at a time (the page runs
        # them, then show_live).
        self.history = ColumnDataSource(data=strip)
        self.x_range = timeline_range()
        self.strip = placeholder("stretch_width")
        """Where the strip goes: made in a stage of its own on a server (see :meth:`make_strip`)."""
        self.strip_figure: figure | None = None
        self.status = Div(text="", sizing_mode="stretch_width", styles=style, name="status")
        self.hints = Div(text="", sizing_mode="stretch_width", styles=style, name="hints")
        self.events = ColumnDataSource(data=event_columns([]))
        self.table = _event_table(self.events, dark)
        self.hide_info = Toggle(label="Hide info events", active=False, width=140, height=30, sizing_mode="fixed")
        self.hide_info.on_change("active", lambda _attr, _old, _new: self.show_events())
        self.row_seq = -1
        self.event_seq = -1
        self.age_step = -1
        """``now`` in :data:`AGE_STEP_S` steps at the last evaluation: the status is judged again as time passes even
        when no reading arrives (a recent XID ages out; a stuck sampler's page agrees with the index page)."""
        self.interval_s = interval_s
        self.block_s = interval_s
        """The strip's block width: the sampling interval in Live, a past range's step."""
        self.blocks: list[Rect] = []
        self.control: TimeRangeControl | None = None
        self.past_events: list[GpuEvent] | None = None
        """The shown past range's events; ``None`` while Live."""

    def make_strip(self) -> None:
        """Make the status strip (outside the page: see :meth:`show_strip`)."""
        fig = _history_figure(self.store.inventory, self.history, self.interval_s, self.x_range)
        self.blocks = [renderer.glyph for renderer in fig.renderers
                       if isinstance(renderer, GlyphRenderer) and isinstance(renderer.glyph, Rect)]
        self._block_width(self.block_s)
        self.strip_figure = fig

    def show_strip(self) -> None:
        """Put the strip made by :meth:`make_strip` in its place on the page (in a later turn of the event loop
        on a server: each of the two holds the others up for a while)."""
        if self.strip_figure is not None:
            self.strip.children = [self.strip_figure]

    events_wanted = 1000
    """Events read with a past range (the log shows the newest ``EVENT_ROWS`` of them)."""

    def history_request(self) -> tuple[list[str], list[int] | None]:
        """What the status rules need, for every GPU."""
        return list(HEALTH_METRICS), None

    def strip_data(self) -> tuple[DataDict, int]:
        """The strip's columns for every row the store holds (shared by every open page) and the newest row's
        number."""
        return self.ticks.store_columns(STRIP, self.store, self._strip_columns)

    def _strip_columns(self, rows: Sequence[Snapshot]) -> DataDict:
        return history_columns(self.store.inventory, rows)

    def show_live(self) -> None:
        """The strip and the event log from the store again, streaming."""
        self.past_events = None
        self._block_width(self.interval_s)
        self.history.data, self.history_seq = self.strip_data()
        self.show_events()

    def show_history(self, result: HistoryResult) -> None:
        """Each bucket's worst status, and the range's events."""
        self.past_events = list(result.events)
        self._block_width(result.step_s)
        self.history.data = history_columns_of(self.store.inventory, result)
        self.show_events(self.past_events)

    def _block_width(self, seconds: float) -> None:
        self.block_s = seconds
        for block in self.blocks:
            block.width = seconds * 1000.0 * BLOCK_WIDTH

    def poll(self) -> None:
        """Re-evaluate when a row or an event is new; recompute hints at most every ``HINT_PERIOD_S``.

        While a past range is shown the strip and the log stay on it; the status and hints stay current."""
        store = self.store
        event_seq = store.event_seq
        last = store.last_seq
        row_seq = last - last % self.batch
        now = self.clock()
        age_step = int(now // AGE_STEP_S)
        if row_seq <= self.row_seq and event_seq == self.event_seq and age_step == self.age_step:
            return
        inventory = store.inventory
        if row_seq > self.history_seq:
            new_rows, seq = store.since(self.history_seq)
            beyond = max(0, seq - row_seq)  # rows of the batch not yet whole: the next whole batch brings them
            new_rows = new_rows[:max(0, len(new_rows) - beyond)]
            self.history_seq = seq - beyond
            if new_rows and self.past_events is None:
                strip = self.ticks.rows(STRIP, new_rows, lambda rows: streamable(history_columns(inventory, rows)))
                self.history.stream(strip, rollover=store.capacity)
        latest = store.latest()
        events = store.events()
        idle = tuple(self.accounting.idle()[1]) if self.accounting is not None else ()
        text = self.ticks.latest(("health status", event_seq, idle, age_step), latest, lambda newest: status_html(
            inventory, evaluate(inventory, newest, events, now, idle=idle), store_findings(store, newest)))
        if text != self.status.text:
            self.status.text = text
        if event_seq != self.event_seq and self.past_events is None:
            self.show_events()
        text = shared_hints_html(store, now, self.executor)
        if text != self.hints.text:
            self.hints.text = text
        self.row_seq, self.event_seq, self.age_step = max(self.row_seq, row_seq), event_seq, age_step

    def show_events(self, events: Sequence[GpuEvent] | None = None) -> None:
        """Refill the event table (from the store unless ``events`` are given: the store's are computed once per
        new event for every open page, each page getting lists of its own)."""
        info = not self.hide_info.active
        if events is None:
            events = self.past_events
        if events is None:
            store = self.store
            data = self.ticks.latest(("health events", store.event_seq, info), None,
                                     lambda _none: event_columns(store.events(), info=info))
        else:
            data = event_columns(events, info=info)
        self.events.data = {name: list(values) for name, values in data.items()}


def _heading(text: str, dark: bool, width: int | None = None) -> Div:
    styles: dict[str, str | None] = {"color": text_color(dark), "font-size": "1.1em"}
    if width is None:
        return Div(text=f"<b>{escape(text)}</b>", sizing_mode="stretch_width", styles=styles)
    return Div(text=f"<b>{escape(text)}</b>", width=width, height=30, styles=styles)


def build(doc: Document, ctx: AppContext) -> None:
    """Status, hints and events, filled now and refreshed by one periodic callback."""
    dark = apply_theme(doc)
    # The strip is redrawn about once a second, as the classic timelines are (see live.REFRESH_S); the status and
    # the events follow every new event at once.
    view = HealthView(ctx.store, dark, ctx.interval_s, ctx.ticks, ctx.accounting, clock=ctx.clock,
                      batch=refresh_batch(ctx), executor=ctx.history_executor)
    view.poll()

    def poll() -> None:
        # As live.Follower: nothing while no viewer takes updates or nobody can see the page; the next tick it
        # takes catches up from the store.
        if viewers_ready(doc) and not hidden_flag(doc).disabled:
            view.poll()

    def seen(_attr: str, _old: Any, hidden: Any) -> None:
        if not hidden:
            poll()

    doc.add_periodic_callback(poll, period_ms(ctx))
    hidden_flag(doc).on_change("disabled", seen)
    view.control = TimeRangeControl(doc, ctx, view, view.x_range, dark=dark)
    add_page(doc, TITLE, _heading("Status (now)", dark), view.status,
             row(*view.control.widgets(), sizing_mode="stretch_width"), view.strip,
             _heading("Bottleneck hints", dark), view.hints,
             row(_heading("Events (newest first)", dark, width=200), view.hide_info), view.table,
             dark=dark)

    def finish() -> None:
        if view.control is not None:
            view.control.open()

    filled = [*view.warming, view.show_live] if view.warming else []
    run_in_stages(doc, [*filled, view.make_strip, view.show_strip, finish], staging=ctx.staging)
