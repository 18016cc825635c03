"""Sources whose rows come and go (processes, MIG instances): patched in place while the rows stay the same,
replaced when they change, with a bar chart's categories following them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bokeh.models import ColumnDataSource, FactorRange
from bokeh.plotting import figure

from nvdash.live.follow import patch_changed


def same_shape(source: ColumnDataSource, data: dict[str, list[Any]]) -> bool:
    """True when ``data`` has the source's columns and row count (so a patch can carry it)."""
    current = source.data
    if set(current) != set(data):
        return False
    lengths = {len(values) for values in current.values()} | {len(values) for values in data.values()}
    return len(lengths) <= 1


def refresh(source: ColumnDataSource, data: dict[str, list[Any]]) -> None:
    """Patch the changed columns when the rows are the same in number, else replace the data (with lists of the
    source's own: ``data`` may be shared by every page, and a later patch changes a source's lists in place)."""
    if same_shape(source, data):
        patch_changed(source, data)
    else:
        source.data = {name: list(values) for name, values in data.items()}


def refresh_factors(categories: FactorRange, factors: Sequence[str]) -> None:
    """Set a horizontal bar chart's rows, the first on top, when they changed."""
    wanted = list(reversed(factors))
    if list(categories.factors) != wanted:
        categories.factors = wanted


def bar_categories(fig: figure) -> FactorRange:
    """The category range of a horizontal bar chart made by ``figures.bar_figure``."""
    categories = fig.y_range
    if not isinstance(categories, FactorRange):
        raise TypeError("a horizontal bar chart has categories on its y axis")
    return categories
