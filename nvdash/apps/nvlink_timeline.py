"""NVLink Timeline: each NVLink GPU's transmit and receive rates over time."""

from __future__ import annotations

from bokeh.document import Document

from nvdash.apps.context import AppContext
from nvdash.apps.figures import Unit
from nvdash.apps.rows import largest
from nvdash.apps.timelines import Panel, build_timelines, gpu_series

TITLE = "NVLink Timeline"


def build(doc: Document, ctx: AppContext) -> None:
    """Two x-aligned timelines, TX above RX, one line per GPU with NVLink."""
    gpus = [gpu for gpu in ctx.store.inventory.gpus if gpu.has_nvlink]
    maximum = largest(gpu.nvlink_max_bytes_per_s for gpu in gpus)
    build_timelines(doc, ctx, TITLE, [
        Panel("NVLink TX", "TX", Unit.RATE, gpu_series("tx", gpus, lambda s: s.nvlink_tx_bytes_per_s,
                                                        "nvlink_tx_bytes_per_s"),
              maximum, value="TX"),
        Panel("NVLink RX", "RX", Unit.RATE, gpu_series("rx", gpus, lambda s: s.nvlink_rx_bytes_per_s,
                                                      "nvlink_rx_bytes_per_s"),
              maximum, value="RX"),
    ])
