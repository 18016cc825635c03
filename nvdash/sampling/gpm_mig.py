"""GPM activity of each MIG GPU instance (Hopper and later): graphics engine, SM activity and SM occupancy.

``nvmlGpmMigSampleGet(device, gpuInstanceId, sample)`` takes a GPM sample of one GPU instance; NVML computes the
metrics over the interval between two samples of the same instance. Each usage reading takes one sample per GPU
instance and asks for the metrics since the previous reading's, so the interval is the usage cadence. Compute
instances inside one GPU instance share its activity: GPM samples GPU instances, not compute instances.

Runs on the usage path (a read-pool thread), never on the event loop.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

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


@dataclass
class _Slot:
    buffers: list[Any]
    previous: Any = None


class MigGpmReader:
    """Keeps the previous sample of each (GPU, GPU instance) and turns the next one into :class:`MigActivity`."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._nvml = caller.nvml
        self._slots: dict[tuple[int, int], _Slot] = {}
        self._lock = threading.Lock()
        """Guards ``_slots`` and ``_closed``: GPUs are read on several pool threads while ``close`` may run."""
        self._closed = False

    def read(self, device: Device, gpu_instance_ids: set[int]) -> dict[int, MigActivity]:
        """The activity of each GPU instance of ``device`` since the previous reading (none on the first reading of
        an instance, or when the GPU has no GPM). Samples of instances no longer listed are freed."""
        self._forget(device.index, gpu_instance_ids)
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
        nvml = self._nvml
        slot = self._slot(device.index, gpu_instance_id)
        if slot is None:
            return None
        current = slot.buffers[0] if slot.previous is not slot.buffers[0] else slot.buffers[1]
        try:
            self._caller.call(nvml.nvmlGpmMigSampleGet, device.handle, gpu_instance_id, current)
            previous, slot.previous = slot.previous, current
            if previous is None:
                return None
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_METRICS)
            request.sample1 = previous
            request.sample2 = current
            for index, metric_id in enumerate(_METRICS):
                request.metrics[index].metricId = metric_id
            answer = self._caller.call(nvml.nvmlGpmMetricsGet, request)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add(UNSUPPORTED)
            return None
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            slot.previous = None
            return None
        values: list[float | None] = []
        for index in range(len(_METRICS)):
            metric = answer.metrics[index]
            ok = metric.nvmlReturn == nvml.NVML_SUCCESS
            values.append(min(max(float(metric.value), 0.0), 100.0) if ok else None)
        return MigActivity(*values)

    def _slot(self, gpu: int, gpu_instance_id: int) -> _Slot | None:
        """The instance's two sample buffers, allocated on first use; ``None`` once closed."""
        key = (gpu, gpu_instance_id)
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None or self._closed:
                return slot
        made: list[Any] = []
        try:
            for _ in range(2):
                made.append(self._caller.call(self._nvml.nvmlGpmSampleAlloc))
        except BaseException:
            self._free(made)
            raise
        with self._lock:
            if not self._closed:
                return self._slots.setdefault(key, _Slot(made))
        self._free(made)
        return None

    def _forget(self, gpu: int, keep: set[int]) -> None:
        with self._lock:
            gone = [key for key in self._slots if key[0] == gpu and key[1] not in keep]
            slots = [self._slots.pop(key) for key in gone]
        for slot in slots:
            self._free(slot.buffers)

    def _free(self, buffers: list[Any]) -> None:
        nvml = self._nvml
        for buffer in buffers:
            with contextlib.suppress(nvml.NVMLError):
                self._caller.call(nvml.nvmlGpmSampleFree, buffer)

    def close(self) -> None:
        """Free every sample buffer (errors ignored: NVML may already be shut down); later reads allocate none."""
        with self._lock:
            held, self._slots, self._closed = list(self._slots.values()), {}, True
        for slot in held:
            self._free(slot.buffers)
