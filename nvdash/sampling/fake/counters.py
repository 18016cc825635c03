"""The simulated PCIe byte counters (``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES``), with their wrap and reset.

nvml.h says these counters "can be wrapped". By default they count from a large boot value and never wrap (a
64-bit counter); a wrap fault makes them count modulo ``2**bits`` from zero at a chosen time (the hardware counter
behind the field on some GPUs is 32 bits wide), a reset fault makes them start over from zero (a driver reload).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .workload import Workload

PcieSeries = Literal["pcie_tx", "pcie_rx"]


@dataclass(frozen=True)
class _Rule:
    kind: Literal["wrap", "reset"]
    at_s: float
    bits: int = 64


class PcieCounters:
    """The value each GPU's PCIe byte counters answer at a time, under the wrap or reset applied last."""

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self._rule: _Rule | None = None

    def wrap(self, at_s: float, bits: int = 32) -> None:
        """Count modulo ``2**bits``, passing zero (wrapping) at ``at_s`` s after start on every GPU."""
        if not 8 <= bits <= 64:
            raise ValueError(f"bits must be 8..64, got {bits}")
        self._rule = _Rule("wrap", at_s, bits)

    def reset(self, at_s: float) -> None:
        """Start over from zero at ``at_s`` s after start on every GPU."""
        self._rule = _Rule("reset", at_s)

    def value(self, gpu: int, series: PcieSeries, t: float) -> int:
        """Bytes counted at ``t`` s after start: the workload's transfers since boot, as the rule has it."""
        rule = self._rule
        if rule is None or (rule.kind == "reset" and t < rule.at_s):
            return self._workload.pcie_counter_bytes(gpu, series, t)
        since = self._workload.transferred_bytes(gpu, series, t) - self._workload.transferred_bytes(
            gpu, series, rule.at_s
        )
        return math.floor(since) % (1 << rule.bits)
