"""No dashboard hands data to the browser as markup: every cell template escapes, no tooltip is ``{safe}``.

Bokeh escapes a tooltip's ``@field`` and builds a plain table cell as text; only an ``HTMLTemplateFormatter``'s
``<%= %>`` and a tooltip's ``{safe}`` put a value in the page as HTML. The browser test
(``tests/browser/test_markup_as_text.py``) feeds markup through each channel; this one checks every page built.
"""

from __future__ import annotations

import re

import pytest
from bokeh.document import Document
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.models.widgets import HTMLTemplateFormatter

from nvdash.apps import APPS, AppSpec, available_apps
from nvdash.apps.gpu_health import _event_table
from tests.unit.test_apps import INVENTORY, make_ctx

_OFFERED = [spec for spec in APPS if spec in available_apps(INVENTORY)]


def _tooltip_texts(tool: HoverTool) -> list[str]:
    tooltips = tool.tooltips
    if isinstance(tooltips, str):
        return [tooltips]
    if isinstance(tooltips, list):
        return [str(value) for _, value in tooltips]
    return [str(tooltips)]


@pytest.mark.parametrize("spec", _OFFERED, ids=[spec.route for spec in _OFFERED])
def test_no_page_puts_a_value_in_the_browser_as_html(spec: AppSpec) -> None:
    doc = Document()
    spec.build(doc, make_ctx())
    built = list(doc.select({"type": HTMLTemplateFormatter})) + list(doc.select({"type": HoverTool}))
    if spec.route in ("/GPU-Health", "/GPU-Processes"):
        assert any(isinstance(model, HTMLTemplateFormatter) for model in built), "the page was built whole"
    for model in built:
        if isinstance(model, HTMLTemplateFormatter):
            assert "<%=" not in model.template, f"{spec.route}: an unescaped cell template: {model.template}"
        elif isinstance(model, HoverTool):
            for text in _tooltip_texts(model):
                assert not re.search(r"\{safe\}", text), f"{spec.route}: a tooltip shows a value as HTML: {text}"


def test_the_event_tables_cells_escape_what_they_show() -> None:
    table = _event_table(ColumnDataSource(), dark=False)
    templates = {column.field: column.formatter.template for column in table.columns
                 if isinstance(column.formatter, HTMLTemplateFormatter)}
    assert set(templates) == {"time", "severity"}
    for template in templates.values():
        assert "<%-" in template
        assert "<%=" not in template
