"""GPM activity of each MIG GPU instance (Hopper and later): graphics engine, SM activity and SM occupancy.

``nvmlGpmMigSampleGet(device, gpuInstanceId, sample)`` takes a GPM sample of one GPU instance; NVML computes the
metrics over the interval between two samples of the same instance. Each usage reading takes one sample per GPU
instance and asks for the metrics since the previous reading's, so the interval is the usage cadence. Compute
instances inside one GPU instance share its activity: GPM samples GPU instances, not compute instances.

Runs on the usage path (a read-pool thread), never on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvdash.sampling.gpm_buffers import BufferPairs, metrics_between, other
from nvdash.sampling.nvml_device import Device, GpuLost, NvmlCaller

GRAPHICS_UTIL = 1
"""``NVML_GPM_METRIC_GRAPHICS_UTIL``: graphics engine activity (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``)."""
SM_UTIL = 2
"""``NVML_GPM_METRIC_SM_UTIL``: SM activity (``DCGM_FI_PROF_SM_ACTIVE``)."""
SM_OCCUPANCY = 3
"""``NVML_GPM_METRIC_SM_OCCUPANCY``: resident warps over the maximum (``DCGM_FI_PROF_SM_OCCUPANCY``)."""
_METRICS = (GRAPHICS_UTIL, SM_UTIL, SM_OCCUPANCY)
UNSUPPORTED = "gpm_mig"
"""The name under which a GPU remembers that it answers no per-instance GPM sample."""


@dataclass(frozen=True, slots=True)
class MigActivity:
    """One GPU instance's GPM metrics over the interval between two readings, each 0-100 % (``None``: not said)."""

    graphics_active_pct: float | None
    sm_active_pct: float | None
    sm_occupancy_pct: float | None


class MigGpmReader:
    """Keeps the previous sample of each (GPU, GPU instance) and turns the next one into :class:`MigActivity`."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._buffers: BufferPairs[tuple[int, int]] = BufferPairs(caller)
        self._previous: dict[tuple[int, int], Any] = {}
        """The buffer holding each instance's previous sample (only the thread reading its GPU touches its keys)."""

    def read(self, device: Device, gpu_instance_ids: set[int]) -> dict[int, MigActivity]:
        """The activity of each GPU instance of ``device`` since the previous reading (none on the first reading of
        an instance, or when the GPU has no GPM). Samples of instances no longer listed are freed."""
        for key in self._buffers.forget(lambda key: key[0] == device.index and key[1] not in gpu_instance_ids):
            self._previous.pop(key, None)
        if not gpu_instance_ids or not self._caller.supported(device, "gpm"):
            return {}
        if not self._caller.supported(device, UNSUPPORTED):
            return {}
        found: dict[int, MigActivity] = {}
        for gpu_instance_id in sorted(gpu_instance_ids):
            activity = self._read_one(device, gpu_instance_id)
            if UNSUPPORTED in device.unsupported:
                return {}
            if activity is not None:
                found[gpu_instance_id] = activity
        return found

    def _read_one(self, device: Device, gpu_instance_id: int) -> MigActivity | None:
        nvml = self._caller.nvml
        key = (device.index, gpu_instance_id)
        buffers = self._buffers.get(key)
        if buffers is None:
            return None
        current = other(buffers, self._previous.get(key))
        try:
            self._caller.call(nvml.nvmlGpmMigSampleGet, device.handle, gpu_instance_id, current)
            previous, self._previous[key] = self._previous.get(key), current
            if previous is None:
                return None
            values = metrics_between(self._caller, previous, current, _METRICS)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add(UNSUPPORTED)
            return None
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            self._previous.pop(key, None)
            return None
        return MigActivity(*values)

    def close(self) -> None:
        """Free every sample buffer (errors ignored: NVML may already be shut down); later reads allocate none."""
        self._buffers.close()
        self._previous.clear()
