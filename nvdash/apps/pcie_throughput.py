"""PCIe Throughput: each GPU's PCIe TX and RX against its own link maximum."""

from __future__ import annotations

from bokeh.document import Document

from nvdash.apps.context import AppContext
from nvdash.apps.throughput import build_throughput

TITLE = "PCIe Throughput"


def build(doc: Document, ctx: AppContext) -> None:
    """Grouped TX/RX bars for every GPU."""
    build_throughput(doc, ctx, TITLE, ctx.store.inventory.gpus,
                     maximum=lambda gpu: gpu.pcie_max_bytes_per_s,
                     tx=lambda s: s.pcie_tx_bytes_per_s, rx=lambda s: s.pcie_rx_bytes_per_s)
