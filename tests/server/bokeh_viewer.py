"""Reading what a viewer of a dashboard receives, through bokeh.client."""

from __future__ import annotations

import math
from typing import Any

from bokeh.client import ClientSession, pull_session
from bokeh.models import ColumnDataSource


def open_session(url: str, route: str) -> ClientSession:
    """A client session on ``route``, as a browser tab would open it."""
    return pull_session(url=url + route)


def source_data(session: ClientSession) -> list[dict[str, list[Any]]]:
    """Every ColumnDataSource of the session's document, columns as plain lists, in a stable order."""
    sources = sorted(session.document.select({"type": ColumnDataSource}), key=lambda s: s.id)
    return [{name: list(values) for name, values in source.data.items()} for source in sources]


def fingerprint(data: list[dict[str, list[Any]]]) -> str:
    """A comparable text of the data with NaN made equal to itself."""

    def norm(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        return value

    return repr([{k: [norm(v) for v in vs] for k, vs in sorted(d.items())} for d in data])


def numeric_columns(data: list[dict[str, list[Any]]]) -> dict[str, list[float]]:
    """All numeric columns of all sources, keyed ``"<source index>.<column>"``."""
    out: dict[str, list[float]] = {}
    for i, columns in enumerate(data):
        for name, values in columns.items():
            if values and all(isinstance(v, (int, float)) for v in values):
                out[f"{i}.{name}"] = [float(v) for v in values]
    return out
