"""The time range control of the timeline pages: Live (streamed from the store) or a past range read from the
history, chosen from a menu or opened from the page's URL (``?range=6h``, ``?from=...&to=...``).

A past range is queried off the event loop (in the history executor) and drawn by the page's view: bucket means
as lines, min-max as bands. Choosing Live refills the view from the store and streams again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any, Protocol, cast

import numpy as np
from bokeh.document import Document
from bokeh.events import Event, MenuItemClick
from bokeh.models import CustomJS, Range
from bokeh.models.ui import UIElement
from bokeh.models.widgets import Button, DatetimePicker, Div, Dropdown, Toggle

from nvdash.apps.context import AppContext
from nvdash.apps.figures import text_color
from nvdash.apps.theme import request_arguments
from nvdash.history.query import HistoryResult
from nvdash.history.ranges import LATEST_S, LIVE, PRESETS, RangeError, TimeRange, parse_duration, resolve

log = logging.getLogger(__name__)

CUSTOM = "custom"
REPLAY_DEFAULT = "1h"
"""The range a recording opens on: it has no live readings."""
HISTORY_OFF = "history is off (--no-history)"
BAND_NOTE = "band: min\u2013max"
RANGE_ARGUMENTS = ("range", "from", "to")

REPLACE_URL_JS = """
const url = new URL(window.location.href);
for (const name of names) {
  url.searchParams.delete(name);
}
for (const [name, value] of cb_obj.tags) {
  url.searchParams.set(name, value);
}
window.history.replaceState(window.history.state, "", url.toString());
"""
"""Sets the page's URL arguments ``names`` to the ``(name, value)`` pairs in the widget's tags (others stay)."""
URL_JS = REPLACE_URL_JS + "x_range.reset();\n"
"""Keeps the page's URL on the shown range (other arguments stay) and lets the x axis follow the new data."""

APPLY_JS = """
const ms = (value) => value == null ? NaN : (typeof value === "number" ? value : new Date(value).getTime());
button.tags = [ms(start.value), ms(end.value), Date.now()];
"""
"""The pickers hold local times as text: the browser turns them into epoch milliseconds for the server."""


class RangeView(Protocol):
    """What a page gives the control: the metrics it draws and how it shows Live or a past range."""

    def history_request(self) -> tuple[list[str], list[int] | None]:
        """The metrics to query and the GPUs (``None``: all)."""
        ...

    def show_live(self) -> None:
        """Refill from the store and stream again."""
        ...

    def show_history(self, result: HistoryResult) -> None:
        """Draw a past range's buckets."""
        ...


def query_values(arguments: Mapping[str, Sequence[bytes | str]] | None) -> dict[str, str]:
    """The last value of each query argument, as text."""
    values: dict[str, str] = {}
    for name, given in (arguments or {}).items():
        if given:
            last = given[-1]
            values[name] = last.decode("utf-8", "replace") if isinstance(last, bytes) else str(last)
    return values


def describe_seconds(seconds: float) -> str:
    """A length in its largest unit, to one decimal: ``7 min``, ``4.5 h``, ``2 d``, ``1.2 s``."""
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{round(seconds / size, 1):g} {unit}"
    return f"{round(seconds, 1):g} s"


_UNIT_NAMES = {"s": "s", "m": "min", "h": "h", "d": "d", "w": "w"}


def preset_label(name: str) -> str:
    """``6h`` as the menu shows it: ``Last 6 h`` (``30m``: ``Last 30 min``)."""
    parse_duration(name)
    text = name.strip()
    return f"Last {text[:-1].strip()} {_UNIT_NAMES[text[-1]]}"


def describe_range(time_range: TimeRange) -> str:
    """``last 6 h`` for a preset, ``custom range (4 h)`` for from/to."""
    if time_range.label == CUSTOM:
        return f"custom range ({describe_seconds(time_range.seconds)})"
    return preset_label(time_range.label).lower()


def iso_utc(time_s: float) -> str:
    """``2026-11-21T08:00:00Z``: a readable, exact ``from``/``to`` value."""
    return datetime.fromtimestamp(round(time_s), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def range_query(time_range: TimeRange | None) -> list[list[str]]:
    """The query arguments that reopen ``time_range``: none for Live."""
    if time_range is None:
        return []
    if time_range.label == CUSTOM:
        return [["from", iso_utc(time_range.start_s)], ["to", iso_utc(time_range.end_s)]]
    return [["range", time_range.label]]


def has_readings(result: HistoryResult) -> bool:
    """Whether any series of ``result`` holds a known value."""
    return any(bool(np.isfinite(series.mean).any()) for by_gpu in result.series.values()
               for series in by_gpu.values())


class TimeRangeControl:
    """The range menu, the custom from/to pickers and a status line; switches its view between Live and the past.

    ``fetch`` (a blocking query) and ``apply`` (drawing its result) are the two halves of a load; choosing a range
    runs them through a next-tick callback that awaits ``fetch`` in the history executor.
    """

    def __init__(self, doc: Document, ctx: AppContext, view: RangeView, x_range: Range, *,
                 pause: Toggle | None = None, dark: bool = False) -> None:
        self.doc = doc
        self.ctx = ctx
        self.view = view
        self.pause = pause
        self.time_range: TimeRange | None = None
        self.note: str | None = None
        self._generation = 0
        self.choices = self._choices()
        self.menu = Dropdown(label="Live", menu=[(self._label(name), name) for name in self.choices],
                             width=150, height=30, sizing_mode="fixed", disabled=len(self.choices) < 2)
        self.menu.on_event(MenuItemClick, self._clicked)
        self.menu.js_on_change("tags", CustomJS(args={"names": list(RANGE_ARGUMENTS), "x_range": x_range},
                                                code=URL_JS))
        self.start = DatetimePicker(width=170, height=30, sizing_mode="fixed", visible=False)
        self.end = DatetimePicker(width=170, height=30, sizing_mode="fixed", visible=False)
        self.apply_button = Button(label="Apply", width=70, height=30, sizing_mode="fixed", visible=False)
        self.apply_button.js_on_click(CustomJS(args={"start": self.start, "end": self.end,
                                                     "button": self.apply_button}, code=APPLY_JS))
        self.apply_button.on_change("tags", self._picked)
        # One line of fixed height: a status whose height followed its text made pages in narrow panes relayout
        # without end (a scrollbar appearing and going with each new height).
        self.status = Div(text="live", sizing_mode="stretch_width", height=30,
                          styles={"color": text_color(dark), "white-space": "nowrap", "overflow": "hidden",
                                  "text-overflow": "ellipsis", "line-height": "30px"})

    @property
    def live(self) -> bool:
        """True while the view streams from the store."""
        return self.time_range is None and self.ctx.live_readings

    def widgets(self) -> list[UIElement]:
        """The control's widgets in a row's order, the page's pause button after the menu."""
        pause: list[UIElement] = [self.pause] if self.pause is not None else []
        return [self.menu, *pause, self.start, self.end, self.apply_button, self.status]

    def _choices(self) -> list[str]:
        if self.ctx.history is None:
            return [LIVE]
        live = [LIVE] if self.ctx.live_readings else []
        return [*live, *PRESETS, CUSTOM]

    @staticmethod
    def _label(name: str) -> str:
        if name == LIVE:
            return "Live"
        return "Custom…" if name == CUSTOM else preset_label(name)

    def open(self) -> None:
        """Show the range the page's URL asks for (Live, or 1 h for a recording, when it asks none)."""
        arguments = query_values(request_arguments(self.doc))
        if self.ctx.history is None:
            self._show_state(None)
            self.status.text = HISTORY_OFF
            return
        default = None if self.ctx.live_readings else REPLAY_DEFAULT
        now = self.ctx.clock()
        try:
            time_range = resolve(arguments, now, default)
            if time_range is None and not self.ctx.live_readings:
                raise RangeError("a recording has no live readings" if self.ctx.replay else "no live readings here")
        except RangeError as error:
            time_range = resolve({}, now, default)
            fallback = "live" if time_range is None else describe_range(time_range)
            self.note = f"{error} (showing {fallback})"
        if time_range is None:
            self._show_state(None)
            self.status.text = escape(self.note or "live")
        else:
            self._enter(time_range)

    def choose(self, name: str) -> None:
        """Act on a menu choice: Live, a preset (ending now), or show the custom pickers."""
        if name not in self.choices:
            return
        self.note = None
        if name == CUSTOM:
            self._offer_custom()
        elif name == LIVE:
            self.show(None)
        else:
            self.show(resolve({"range": name}, self.ctx.clock()))

    def apply_custom(self, start_s: float, end_s: float) -> None:
        """Show ``[start_s, end_s]``; a bad pick only says why in the status line."""
        self.note = None
        if not (math.isfinite(start_s) and math.isfinite(end_s)):
            self.status.text = "pick both from and to"
        elif start_s >= end_s:
            self.status.text = "from must be before to"
        elif start_s < 0 or end_s > LATEST_S:
            self.status.text = "pick times between 1970 and 9999"
        else:
            self.show(TimeRange(start_s, end_s, CUSTOM))

    def show(self, time_range: TimeRange | None) -> None:
        """Switch to ``time_range`` (``None``: Live) and keep the URL on it."""
        if time_range is None and not self.ctx.live_readings:
            return
        if time_range is None:
            self._show_state(None)
            self.status.text = "live"
            self.view.show_live()
        else:
            self._enter(time_range)

    def reload(self) -> None:
        """Query the shown past range again (the view's series changed); nothing in Live."""
        if self.time_range is not None:
            self._enter(self.time_range)

    def fetch(self, time_range: TimeRange) -> HistoryResult:
        """The view's metrics over ``time_range`` (blocking: run it off the event loop)."""
        if self.ctx.history is None:
            raise RangeError(HISTORY_OFF)
        metrics, gpus = self.view.history_request()
        result = self.ctx.history.query(metrics, time_range.start_s, time_range.end_s, gpus=gpus)
        wanted = getattr(self.view, "events_wanted", 0)
        if wanted:
            events = self.ctx.history.events(time_range.start_s, time_range.end_s, wanted)
            result = dataclasses.replace(result, events=tuple(events))
        return result

    def apply(self, result: HistoryResult) -> None:
        """Draw ``result`` and say what is shown."""
        self.view.show_history(result)
        shown = describe_range(self.time_range) if self.time_range is not None else "past range"
        band = getattr(self.view, "band_note", BAND_NOTE)
        text = f"{shown} · {describe_seconds(result.step_s)} buckets" + (f" · {band}" if band else "")
        if not has_readings(result):
            text += " · no readings in this range"
        self._say(text)

    def _say(self, text: str) -> None:
        self.status.text = escape(f"{self.note} · {text}" if self.note else text)

    def _enter(self, time_range: TimeRange) -> None:
        prepare = getattr(self.view, "prepare_history", None)
        if prepare is not None:
            prepare()
        self._show_state(time_range)
        self._say(f"loading {describe_range(time_range)} …")
        generation = self._generation

        async def load() -> None:
            try:
                result = await asyncio.get_running_loop().run_in_executor(
                    self.ctx.history_executor, self.fetch, time_range)
            except Exception as error:
                log.warning("reading the history for %s failed: %s", describe_range(time_range), error)
                if generation == self._generation:
                    self._say(f"reading the history failed: {error}")
                return
            if generation == self._generation:
                self.apply(result)

        # Bokeh awaits a coroutine callback; its annotation only names plain ones.
        self.doc.add_next_tick_callback(cast("Callable[[], None]", load))

    def _show_state(self, time_range: TimeRange | None) -> None:
        """The widgets for ``time_range``; a query still running for an earlier choice will be dropped."""
        self._generation += 1
        self.time_range = time_range
        if time_range is None:
            self.menu.label = "Live"
        else:
            self.menu.label = "Custom" if time_range.label == CUSTOM else preset_label(time_range.label)
        self.menu.tags = list(range_query(time_range))
        for widget in (self.start, self.end, self.apply_button):
            widget.visible = False
        if self.pause is not None:
            self.pause.visible = self.live

    def _offer_custom(self) -> None:
        now = self.ctx.clock()
        shown = self.time_range or TimeRange(now - 3600.0, now, CUSTOM)
        # Epoch milliseconds, which the browser shows in its local time (Bokeh would cut a datetime to its date).
        self.start.update(value=shown.start_s * 1000.0)
        self.end.update(value=shown.end_s * 1000.0)
        for widget in (self.start, self.end, self.apply_button):
            widget.visible = True
        self.status.text = "pick from and to, then Apply"

    def _clicked(self, event: Event) -> None:
        if isinstance(event, MenuItemClick) and isinstance(event.item, str):
            self.choose(event.item)

    def _picked(self, _attr: str, _old: Any, new: Any) -> None:
        """The Apply button's tags: ``[from_ms, to_ms, nonce]`` from the browser."""
        try:
            start_ms, end_ms = float(new[0]), float(new[1])
        except (TypeError, ValueError, IndexError):
            return
        self.apply_custom(start_ms / 1000.0, end_ms / 1000.0)
