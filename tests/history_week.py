"""A week of synthetic history written through nvdash's own writer, for tests that need a long recording."""

from __future__ import annotations

import math
from pathlib import Path

from nvdash.history.writer import HistoryWriter
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.records import GpuSample, HostSample, Inventory, Snapshot

GiB = 1024**3
WEEK_S = 7 * 86_400.0
GAP = (3 * 86_400.0, 3 * 86_400.0 + 6 * 3600.0)
"""Six hours, starting three days into the week, when "nvdash was not running": nothing is written."""


def dgx_inventory() -> Inventory:
    """The simulated DGX H100's inventory (names, memory, limits), as a real server would record it."""
    hardware = open_hardware("dgx-h100", seed=0, faults=None)
    try:
        return hardware.inventory
    finally:
        hardware.close()


def utilization(gpu: int, offset_s: float) -> float:
    """A daily cycle per GPU, phase-shifted by GPU index, 0-100 %."""
    return 50.0 + 45.0 * math.sin(2 * math.pi * offset_s / 86_400.0 + gpu)


def write_week(path: Path, end_s: float, step_s: float = 60.0) -> Inventory:
    """Write ``WEEK_S`` of readings ending at ``end_s`` every ``step_s`` for the DGX's 8 GPUs, minus ``GAP``."""
    inventory = dgx_inventory()
    writer = HistoryWriter(path, inventory, "simulated:dgx-h100", step_s)
    writer.open()
    start = end_s - WEEK_S
    count = int(WEEK_S // step_s)
    try:
        for n in range(count + 1):
            offset = n * step_s
            if GAP[0] <= offset < GAP[1]:
                continue
            gpus = tuple(
                GpuSample(index=gpu.index, utilization_pct=utilization(gpu.index, offset),
                          memory_used_bytes=int((10 + 60 * offset / WEEK_S) * GiB), memory_total_bytes=80 * GiB,
                          pcie_tx_bytes_per_s=1e9 + gpu.index * 1e8, pcie_rx_bytes_per_s=2e9,
                          nvlink_tx_bytes_per_s=5e10, nvlink_rx_bytes_per_s=5e10,
                          temperature_c=40.0 + utilization(gpu.index, offset) / 5, power_w=300.0,
                          power_limit_w=700.0, clock_sm_mhz=1980.0, clock_memory_mhz=2619.0)
                for gpu in inventory.gpus
            )
            host = HostSample(cpu_pct=20.0, memory_used_bytes=100 * GiB, memory_total_bytes=2000 * GiB,
                              disk_read_bytes_per_s=1e6, disk_write_bytes_per_s=2e6, net_sent_bytes_per_s=3e6,
                              net_recv_bytes_per_s=4e6)
            writer.submit(Snapshot(time_s=start + offset, gpus=gpus, host=host))
            if n % 1000 == 0:
                writer.flush()
        writer.flush()
    finally:
        writer.stop()
    return inventory
