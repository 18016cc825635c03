"""GPU Resources: utilization, memory, PCIe and (when present) NVLink traffic of every GPU over time."""

from __future__ import annotations

from bokeh.document import Document

from nvdash.apps.context import AppContext
from nvdash.apps.figures import Unit
from nvdash.apps.rows import largest, total
from nvdash.apps.timelines import Panel, build_timelines, gpu_series

TITLE = "GPU Resources"


def build(doc: Document, ctx: AppContext) -> None:
    """Stacked timelines with one line per GPU in the same colour on every plot."""
    gpus = ctx.store.inventory.gpus
    nvlink_gpus = [gpu for gpu in gpus if gpu.has_nvlink]
    panels = [
        Panel("Utilization", "utilization", Unit.PCT,
              gpu_series("util", gpus, lambda s: s.utilization_pct, "utilization_pct"), 100.0, value="utilization"),
        Panel("Memory used", "memory used", Unit.BYTES,
              gpu_series("mem", gpus, lambda s: s.memory_used_bytes, "memory_used_bytes"),
              largest(gpu.memory_total_bytes for gpu in gpus), value="used"),
        Panel("PCIe throughput (TX + RX)", "PCIe TX + RX", Unit.RATE,
              gpu_series("pcie", gpus, lambda s: total(s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s),
                         "pcie_bytes_per_s"),
              largest(None if m is None else 2 * m for m in (gpu.pcie_max_bytes_per_s for gpu in gpus)),
              value="TX + RX"),
    ]
    if nvlink_gpus:
        panels.append(
            Panel("NVLink throughput (TX + RX)", "NVLink TX + RX", Unit.RATE,
                  gpu_series("nvlink", nvlink_gpus,
                             lambda s: total(s.nvlink_tx_bytes_per_s, s.nvlink_rx_bytes_per_s),
                             "nvlink_bytes_per_s"),
                  largest(None if m is None else 2 * m
                          for m in (gpu.nvlink_max_bytes_per_s for gpu in nvlink_gpus)),
                  value="TX + RX")
        )
    build_timelines(doc, ctx, TITLE, panels)
