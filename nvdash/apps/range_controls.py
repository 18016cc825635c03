"""An accounting page's controls: the range (today, 7 d, 30 d or a custom from/to), the grouping and the CSV link,
opened from the page's URL query (``range``, ``from``, ``to``, ``by``) and written back as the CSV's query."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from bokeh.document import Document
from bokeh.layouts import row
from bokeh.models import InlineStyleSheet
from bokeh.models.widgets import Div, Select, TextInput

from nvdash.accounting.report import DEFAULT_RANGE, RANGES
from nvdash.apps.accounting_table import csv_href_at
from nvdash.apps.figures import text_color
from nvdash.apps.theme import request_arguments
from nvdash.apps.time_range import query_values

CUSTOM = "custom"
RANGE_LABELS = {"today": "Today", "7d": "Last 7 days", "30d": "Last 30 days", CUSTOM: "Custom…"}


def _options(labels: Mapping[str, str]) -> list[str | tuple[Any, str]]:
    return list(labels.items())


class RangeControls:
    """The widgets, in one row that wraps in a narrow pane; ``on_change`` runs after any of them changed."""

    def __init__(self, doc: Document, dark: bool, *, groupings: Mapping[str, str], csv_path: str,
                 on_change: Callable[[], None], valid: Collection[str] | None = None, by_width: int = 140,
                 placeholders: bool = False) -> None:
        arguments = query_values(request_arguments(doc))
        start, end = arguments.get("from", ""), arguments.get("to", "")
        chosen = CUSTOM if start else arguments.get("range", DEFAULT_RANGE)
        by = arguments.get("by", "job")
        self._valid = valid if valid is not None else groupings
        self._csv_path = csv_path
        self._on_change = on_change
        labelled: list[Any] = [InlineStyleSheet(css=f"label {{ color: {text_color(dark)}; }}")]
        self.range = Select(title="range", value=chosen if chosen in RANGE_LABELS else DEFAULT_RANGE,
                            options=_options(RANGE_LABELS), width=150, name="range", stylesheets=labelled)
        self.start = TextInput(title="from (ISO 8601 or Unix s)", value=start, width=200, name="from",
                               placeholder="2026-11-21T08:00" if placeholders else "", stylesheets=labelled)
        self.end = TextInput(title="to (empty: now)", value=end, width=200, name="to",
                             placeholder="now" if placeholders else "", stylesheets=labelled)
        self.by = Select(title="group by", value=by if by in groupings else "job", options=_options(groupings),
                         width=by_width, name="by", stylesheets=labelled)
        self.csv = Div(text="", width=140, name="csv", styles={"margin-top": "1.9em"})
        self.row = row(self.range, self.start, self.end, self.by, self.csv, sizing_mode="stretch_width",
                       name="controls", styles={"flex-wrap": "wrap"})
        for widget in (self.range, self.by, self.start, self.end):
            widget.on_change("value", self._changed)
        self.show_custom()

    @property
    def custom(self) -> bool:
        """Whether the range is a custom from/to."""
        return bool(self.range.value == CUSTOM)

    def show_custom(self) -> None:
        """The from/to fields are shown for a custom range only."""
        for field in (self.start, self.end):
            if field.visible != self.custom:
                field.visible = self.custom

    def choice(self) -> tuple[dict[str, str], str, str]:
        """The range arguments, the grouping and the CSV link the controls ask for."""
        by = self.by.value if self.by.value in self._valid else "job"
        if self.custom:
            start, end = self.start.value.strip(), self.end.value.strip()
            return {"from": start, "to": end}, by, csv_href_at(self._csv_path, CUSTOM, by, start, end)
        name = self.range.value if self.range.value in RANGES else DEFAULT_RANGE
        return {"range": name}, by, csv_href_at(self._csv_path, name, by)

    def _changed(self, _attr: str, _old: Any, _new: Any) -> None:
        self.show_custom()
        self._on_change()
