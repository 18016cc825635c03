"""Noticing that a GPU changed mode, so that what was learnt about it is learnt again.

A reading found unsupported is not asked again (a failing call every sweep would be waste), which holds while the
GPU stays as it was. Two signals that NVML gives say it did not:

- the current MIG mode (``nvmlDeviceGetMigMode``): turning MIG on makes whole-GPU readings such as utilization
  unsupported, turning it off makes them answer again;
- the energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ "since the driver was last reloaded") going
  backwards: the driver was reloaded or the GPU reset, so its counters restarted and its support may differ.

Not used as signals: a lost GPU (``NVML_ERROR_GPU_IS_LOST``) stays lost, since its handle is void and only a new
``nvmlInit`` hands out another; and the driver version cannot change under a process that keeps libnvidia-ml
loaded (a new driver refuses the old library: ``NVML_ERROR_LIB_RM_VERSION_MISMATCH``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nvdash.sampling.nvml_device import Device, NvmlCaller

MIG_MODE = "mig_mode"
"""The reading's name in ``Device.unsupported`` (shared with the usage reader, which reads the mode too)."""
MIG_CHANGED = "MIG mode changed"
ENERGY_WENT_BACK = "energy counter went backwards"
"""The reasons for probing a GPU again, as ``/health`` and the log give them."""


@dataclass(frozen=True, slots=True)
class Reprobe:
    """One GPU probed again: which, why (``MIG_CHANGED`` or ``ENERGY_WENT_BACK``) and when (Unix time)."""

    gpu: int
    reason: str
    at: float


@dataclass
class _Seen:
    mig_current: int | None = None
    energy_mj: int | None = None


class ModeWatch:
    """Remembers each GPU's MIG mode and energy count and says when one of them shows a changed GPU."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._seen: dict[int, _Seen] = {}

    def mig_changed(self, device: Device) -> bool:
        """True when the current MIG mode differs from the one seen last (one NVML call; never on the first)."""
        mode = self._caller.optional(device, MIG_MODE, self._caller.nvml.nvmlDeviceGetMigMode)
        if mode is None:
            return False
        current = int(mode[0])
        seen = self._seen.setdefault(device.index, _Seen())
        changed = seen.mig_current is not None and current != seen.mig_current
        seen.mig_current = current
        return changed

    def energy_went_back(self, device: Device, energy_mj: int | None) -> bool:
        """True when ``energy_mj`` (this sweep's reading) is below the one before: a driver reload or GPU reset."""
        if energy_mj is None:
            return False
        seen = self._seen.setdefault(device.index, _Seen())
        went_back = seen.energy_mj is not None and energy_mj < seen.energy_mj
        seen.energy_mj = energy_mj
        return went_back
