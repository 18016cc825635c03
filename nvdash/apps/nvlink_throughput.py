"""NVLink Throughput: each NVLink GPU's TX and RX against its own NVLink maximum."""

from __future__ import annotations

from bokeh.document import Document

from nvdash.apps.context import AppContext
from nvdash.apps.throughput import build_throughput

TITLE = "NVLink Throughput"


def build(doc: Document, ctx: AppContext) -> None:
    """Grouped TX/RX bars for the GPUs that have NVLink."""
    build_throughput(doc, ctx, TITLE, [gpu for gpu in ctx.store.inventory.gpus if gpu.has_nvlink],
                     maximum=lambda gpu: gpu.nvlink_max_bytes_per_s,
                     tx=lambda s: s.nvlink_tx_bytes_per_s, rx=lambda s: s.nvlink_rx_bytes_per_s,
                     partial=lambda s: s.nvlink_partial)
