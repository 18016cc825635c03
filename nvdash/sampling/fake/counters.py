"""The simulated counters that count since the driver loaded: PCIe bytes and energy, with wraps and reloads.

nvml.h says the PCIe byte counters (``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES``) "can be wrapped"; the energy
counter (``nvmlDeviceGetTotalEnergyConsumption``) counts mJ "since the driver was last reloaded". By default both
count from a boot value and never wrap (64-bit counters). A wrap makes the PCIe counters count modulo ``2**bits``,
passing zero at a chosen time (the hardware counter behind the field is 32 bits wide on some GPUs); a driver
reload makes both start over from zero at a chosen time.
"""

from __future__ import annotations

import math
from typing import Literal

from .workload import Workload

PcieSeries = Literal["pcie_tx", "pcie_rx"]


class LoadCounters:
    """The value each GPU's since-load counters answer at a time, under the wrap and reload applied."""

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self._wrap: tuple[float, int] | None = None
        self._reload_s: float | None = None

    def wrap_pcie(self, at_s: float, bits: int = 32) -> None:
        """Count PCIe bytes modulo ``2**bits``, passing zero (wrapping) at ``at_s`` s after start on every GPU."""
        if not 8 <= bits <= 64:
            raise ValueError(f"bits must be 8..64, got {bits}")
        self._wrap = (at_s, bits)

    def reload(self, at_s: float) -> None:
        """The driver reloads at ``at_s`` s after start: every GPU's counters start over from zero."""
        self._reload_s = at_s

    def _reloaded(self, t: float) -> float | None:
        return self._reload_s if self._reload_s is not None and t >= self._reload_s else None

    def pcie_bytes(self, gpu: int, series: PcieSeries, t: float) -> int:
        """PCIe bytes counted at ``t`` s after start."""
        workload = self._workload
        if self._wrap is not None:
            at_s, bits = self._wrap
            since = workload.transferred_bytes(gpu, series, t) - workload.transferred_bytes(gpu, series, at_s)
            return math.floor(since) % (1 << bits)
        reloaded = self._reloaded(t)
        if reloaded is not None:
            return math.floor(
                workload.transferred_bytes(gpu, series, t) - workload.transferred_bytes(gpu, series, reloaded)
            )
        return workload.pcie_counter_bytes(gpu, series, t)

    def energy_mj(self, gpu: int, t: float) -> int:
        """Energy counted at ``t`` s after start (mJ)."""
        reloaded = self._reloaded(t)
        energy = self._workload.energy_mj(gpu, t)
        return energy if reloaded is None else energy - self._workload.energy_mj(gpu, reloaded)
