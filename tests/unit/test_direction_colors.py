"""One colour means one direction on every page: TX (sent) in one, RX (received) in another, nothing else in
either of them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from bokeh.core.property.vectorization import Value
from bokeh.document import Document
from bokeh.models.annotations import LegendItem

from nvdash.apps import machine_resources, nvlink_throughput, pcie_throughput
from nvdash.apps.figures import RX_COLOR, TX_COLOR
from tests.unit.test_apps import Build, make_ctx

PAGES: dict[str, Build] = {
    "PCIe Throughput": pcie_throughput.build,
    "NVLink Throughput": nvlink_throughput.build,
    "Machine Resources": machine_resources.build,
}
DIRECTIONS = {"TX": re.compile(r"\b(TX|sent)\b"), "RX": re.compile(r"\b(RX|received)\b")}


def _color(glyph: Any) -> str:
    """The colour a glyph is drawn in: its fill where it has one, else its line."""
    fill = getattr(glyph, "fill_color", None)
    return str(fill if fill is not None else glyph.line_color)


def legend_colors(build: Build) -> dict[str, set[str]]:
    """Each legend entry of the page built by ``build`` and the colours of the renderers it stands for."""
    doc = Document()
    build(doc, make_ctx())
    entries: dict[str, set[str]] = {}
    for item in doc.select({"type": LegendItem}):
        assert isinstance(item, LegendItem)
        assert isinstance(item.label, Value)
        entries.setdefault(str(item.label.value), set()).update(_color(r.glyph) for r in item.renderers)
    return entries


def direction(label: str) -> str | None:
    found = [name for name, pattern in DIRECTIONS.items() if pattern.search(label)]
    assert len(found) <= 1, label
    return found[0] if found else None


def test_tx_and_rx_have_one_colour_each_on_every_page() -> None:
    assert TX_COLOR != RX_COLOR
    seen: dict[str, dict[str, set[str]]] = {"TX": {}, "RX": {}}
    for page, build in PAGES.items():
        for label, colors in legend_colors(build).items():
            way = direction(label)
            if way is None:
                assert not colors & {TX_COLOR, RX_COLOR}, f"{page}: {label!r} is drawn in a direction's colour"
            else:
                seen[way][f"{page}: {label}"] = colors
    assert seen["TX"] == {
        "PCIe Throughput: TX (sent)": {TX_COLOR},
        "NVLink Throughput: TX (sent)": {TX_COLOR},
        "Machine Resources: sent (TX)": {TX_COLOR},
    }
    assert seen["RX"] == {
        "PCIe Throughput: RX (received)": {RX_COLOR},
        "NVLink Throughput: RX (received)": {RX_COLOR},
        "Machine Resources: received (RX)": {RX_COLOR},
    }


@pytest.mark.parametrize(("label", "expected"), [
    ("TX (sent)", "TX"), ("received (RX)", "RX"), ("read", None), ("peak, last 5 s", None), ("link maximum", None),
])
def test_direction_is_read_from_the_legend_text(label: str, expected: str | None) -> None:
    assert direction(label) == expected
