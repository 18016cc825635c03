"""GPU Topology: how each pair of GPUs is connected, as ``nvidia-smi topo -m`` shows it, as a coloured grid.

The matrix is read once at start (``Inventory.topology``), so the page is static: no periodic callback.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

from bokeh.document import Document
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.models.widgets import Div
from bokeh.plotting import figure

from nvdash.apps.context import AppContext
from nvdash.apps.figures import add_page, gpu_label, text_color
from nvdash.apps.theme import apply_theme
from nvdash.live.stages import Later
from nvdash.sampling.records import GpuInfo, Inventory

TITLE = "GPU Topology"

_NVLINK = re.compile(r"^NV(\d+)$")


# (code, colour, meaning), from the closest connection to the farthest.
CODES: tuple[tuple[str, str, str], ...] = (
    ("X", "#bdbdbd", "the GPU itself"),
    ("NV#", "#1a9850", "a bonded set of # NVLinks: the fastest path, no PCIe involved"),
    ("PIX", "#91cf60", "PCIe through at most one PCIe bridge (switch)"),
    ("PXB", "#d9ef8b", "PCIe through several PCIe bridges, without crossing a host bridge"),
    ("PHB", "#fee08b", "PCIe through a PCIe host bridge (typically the CPU)"),
    ("NODE", "#fc8d59", "PCIe plus the interconnect between PCIe host bridges within one NUMA node"),
    ("SYS", "#d73027", "PCIe plus the interconnect between NUMA nodes (e.g. QPI/UPI or Infinity Fabric)"),
)
UNKNOWN_COLOR = "#eeeeee"
_BY_CODE = {code: (color, meaning) for code, color, meaning in CODES}


def describe_code(code: str) -> tuple[str, str]:
    """``(colour, meaning)`` of a topology code; ``NV18`` reads as 18 bonded NVLinks."""
    match = _NVLINK.match(code)
    if match:
        count = int(match.group(1))
        color, _ = _BY_CODE["NV#"]
        return color, f"a bonded set of {count} NVLink{'s' if count != 1 else ''}"
    if code in _BY_CODE:
        return _BY_CODE[code]
    return UNKNOWN_COLOR, "a connection nvdash does not know"


def _gpu_count(inventory: Inventory) -> int:
    return min(len(inventory.gpus), len(inventory.topology))


def cells(inventory: Inventory) -> dict[str, list[Any]]:
    """The grid's source: one cell per GPU pair with its code, colour and a sentence for the tooltip."""
    data: dict[str, list[Any]] = {name: [] for name in ("x", "y", "code", "color", "description")}
    gpus = inventory.gpus[: _gpu_count(inventory)]
    for i, source in enumerate(gpus):
        line = inventory.topology[i]
        for j, target in enumerate(gpus):
            code = line[j] if j < len(line) else "?"
            color, meaning = describe_code(code)
            data["x"].append(gpu_label(target))
            data["y"].append(gpu_label(source))
            data["code"].append(code)
            data["color"].append(color)
            data["description"].append(f"{gpu_label(source)} to {gpu_label(target)}: {code}, {meaning}")
    return data


def gpus_html(gpus: tuple[GpuInfo, ...]) -> str:
    """The GPUs of the grid: index, name, PCI bus id, NVLink."""
    rows = []
    for gpu in gpus:
        nvlink = "none" if not gpu.has_nvlink else f"{gpu.nvlink_links} links" + (
            f", NVLink {escape(gpu.nvlink_version)}" if gpu.nvlink_version else "")
        rows.append(f"<tr><td><b>{escape(gpu_label(gpu))}</b></td><td>{escape(gpu.name)}</td>"
                    f"<td><code>{escape(gpu.pci_bus_id) or 'n/a'}</code></td><td>{nvlink}</td></tr>")
    head = "<tr><th align=left>GPU</th><th align=left>name</th><th align=left>PCI bus id</th>" \
           "<th align=left>NVLink</th></tr>"
    return f'<table style="border-spacing:10px 2px">{head}{"".join(rows)}</table>'


def legend_html() -> str:
    """Every code with its colour and meaning, closest connection first."""
    items = "".join(
        f'<tr><td style="white-space:nowrap"><span style="display:inline-block;width:1.1em;height:1.1em;'
        f'background:{color};vertical-align:middle;border-radius:2px"></span> <b>{escape(code)}</b></td>'
        f"<td>{escape(meaning)}</td></tr>"
        for code, color, meaning in CODES
    )
    return f'<table style="border-spacing:8px 2px">{items}</table>'


def _grid(inventory: Inventory) -> figure:
    labels = [gpu_label(gpu) for gpu in inventory.gpus[: _gpu_count(inventory)]]
    source = ColumnDataSource(data=cells(inventory))
    fig = figure(title="How each GPU reaches each other GPU (as nvidia-smi topo -m)",
                 x_range=FactorRange(factors=labels), y_range=FactorRange(factors=list(reversed(labels))),
                 x_axis_location="above", tools="save", sizing_mode="stretch_both", min_width=300, min_height=300,
                 match_aspect=True)
    fig.toolbar.logo = None
    fig.grid.grid_line_color = None
    fig.axis.axis_line_color = None
    fig.axis.major_tick_line_color = None
    cells_renderer = fig.rect(x="x", y="y", width=0.94, height=0.94, source=source, fill_color="color",
                              line_color=None)
    fig.text(x="x", y="y", text="code", source=source, text_align="center", text_baseline="middle",
             text_color="#111111", text_font_style="bold")
    fig.add_tools(HoverTool(renderers=[cells_renderer], tooltips=[("", "@description")]))
    return fig


def build(doc: Document, ctx: AppContext) -> None:
    """The coloured matrix, the GPUs' names and bus ids, and a legend of the codes; nothing updates."""
    dark = apply_theme(doc)
    inventory = ctx.store.inventory
    style: dict[str, str | None] = {"color": text_color(dark)}
    if _gpu_count(inventory) < 2:
        note = ("NVML did not say how the GPUs are connected." if len(inventory.gpus) >= 2
                else "The topology needs at least two GPUs.")
        add_page(doc, TITLE, Div(text=note, styles=style), dark=dark)
        return
    side = Div(text=f"{gpus_html(inventory.gpus[: _gpu_count(inventory)])}<br>{legend_html()}", styles=style,
               sizing_mode="stretch_height", width=560)
    add_page(doc, TITLE, Later(lambda: row(_grid(inventory), side, sizing_mode="stretch_both")), dark=dark,
             staging=ctx.staging)
