"""NVLink Throughput: each NVLink GPU's TX and RX against its own NVLink maximum: the usable data rate (H100: 18 links
x 25 GB/s = 450 GB/s per direction), never the signalling rate the driver's speed field gives (478 GB/s), which
no traffic can reach."""

from __future__ import annotations

from bokeh.document import Document

from nvdash.apps.context import AppContext
from nvdash.apps.throughput import LinkMaximum, build_throughput
from nvdash.sampling.records import GpuInfo
from nvdash.units import format_rate

TITLE = "NVLink Throughput"


def _signalling(gpu: GpuInfo) -> str:
    """The signalling rate beside the data rate, where the driver gave it."""
    rate = gpu.nvlink_signalling_max_bytes_per_s
    return "" if rate is None else f"signalling {format_rate(rate)}"


DATA_RATE = LinkMaximum(legend="NVLink data rate", of="data rate", detail=_signalling)
"""NVLink's percentages are of the data rate; the hover adds the signalling rate."""


def build(doc: Document, ctx: AppContext) -> None:
    """Grouped TX/RX bars for the GPUs that have NVLink."""
    build_throughput(doc, ctx, TITLE, [gpu for gpu in ctx.store.inventory.gpus if gpu.has_nvlink],
                     maximum=lambda gpu: gpu.nvlink_max_bytes_per_s,
                     tx=lambda s: s.nvlink_tx_bytes_per_s, rx=lambda s: s.nvlink_rx_bytes_per_s,
                     partial=lambda s: s.nvlink_partial, named=DATA_RATE)
