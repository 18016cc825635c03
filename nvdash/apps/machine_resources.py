"""Machine Resources: the host's CPU, memory, disk and network over time."""

from __future__ import annotations

from collections.abc import Callable

from bokeh.document import Document

from nvdash.apps.context import AppContext
from nvdash.apps.figures import RX_COLOR, TX_COLOR, Unit
from nvdash.apps.timelines import Panel, Series, build_timelines
from nvdash.sampling.records import HostSample, Snapshot

TITLE = "Machine Resources"
CPU_COLOR = "#17becf"
MEMORY_COLOR = "#2ca02c"
DISK_READ_COLOR = "#9467bd"
DISK_WRITE_COLOR = "#8c564b"
"""Disk traffic has colours of its own: blue and orange mean sent and received (TX and RX) on every page."""


def _host(key: str, legend: str, color: str, read: Callable[[HostSample], float | None], metric: str) -> Series:
    """A host line: ``read`` live, history ``metric`` for a past range."""

    def value(snapshot: Snapshot) -> float | None:
        return read(snapshot.host)

    return Series(key, legend, legend, color, value, metric=metric)


def build(doc: Document, ctx: AppContext) -> None:
    """Four x-aligned timelines; memory is drawn against the host's own total."""
    host = ctx.store.inventory.host
    build_timelines(doc, ctx, TITLE, [
        Panel(f"CPU ({host.cpu_count} logical cores)", "CPU", Unit.PCT,
              (_host("cpu", "CPU", CPU_COLOR, lambda h: h.cpu_pct, "host_cpu_pct"),), 100.0,
              what="series", value="busy"),
        Panel("Memory used", "memory used", Unit.BYTES,
              (_host("memory", "used", MEMORY_COLOR, lambda h: h.memory_used_bytes, "host_memory_used_bytes"),),
              float(host.memory_total_bytes), what="series", value="used"),
        Panel("Disk", "disk rate", Unit.RATE,
              (_host("disk_read", "read", DISK_READ_COLOR, lambda h: h.disk_read_bytes_per_s,
                     "host_disk_read_bytes_per_s"),
               _host("disk_write", "write", DISK_WRITE_COLOR, lambda h: h.disk_write_bytes_per_s,
                     "host_disk_write_bytes_per_s")),
              what="series", value="rate"),
        Panel("Network", "network rate", Unit.RATE,
              (_host("net_sent", "sent (TX)", TX_COLOR, lambda h: h.net_sent_bytes_per_s, "host_net_sent_bytes_per_s"),
               _host("net_recv", "received (RX)", RX_COLOR, lambda h: h.net_recv_bytes_per_s,
                     "host_net_recv_bytes_per_s")),
              what="series", value="rate"),
    ])
