"""GPU performance metrics (GPM, Hopper and later): graphics engine, SM, tensor, FP pipe and DRAM activity.

NVML computes GPM metrics from two samples taken by ``nvmlGpmSampleGet``; each sweep takes one and asks for the
metrics over the interval since the previous sweep's. Two sample buffers per GPU are allocated once and reused.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from nvdash.sampling.nvml_device import Device, GpuLost, NvmlCaller

GPM_METRICS = {
    "gpm_graphics_active_pct": 1,  # NVML_GPM_METRIC_GRAPHICS_UTIL
    "gpm_sm_active_pct": 2,  # NVML_GPM_METRIC_SM_UTIL
    "gpm_sm_occupancy_pct": 3,  # NVML_GPM_METRIC_SM_OCCUPANCY
    "gpm_tensor_active_pct": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "gpm_dram_active_pct": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
    "gpm_fp64_active_pct": 11,  # NVML_GPM_METRIC_FP64_UTIL
    "gpm_fp32_active_pct": 12,  # NVML_GPM_METRIC_FP32_UTIL
    "gpm_fp16_active_pct": 13,  # NVML_GPM_METRIC_FP16_UTIL
}
"""Sample field -> ``nvmlGpmMetricId_t``; each metric is a percentage, 0.0-100.0."""


class GpmReader:
    """Takes a GPM sample per sweep and returns the metrics since the previous one."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._nvml = caller.nvml
        self._buffers: dict[int, list[Any]] = {}
        self._lock = threading.Lock()
        """Guards ``_buffers`` and ``_closed``: a read that hung wakes on a pool thread while ``close`` runs."""
        self._closed = False

    def read(self, device: Device) -> dict[str, float | None]:
        """The GPM metric fields of ``device`` (all ``None`` on the first sweep or when NVML cannot say)."""
        empty: dict[str, float | None] = dict.fromkeys(GPM_METRICS)
        if not self._caller.supported(device, "gpm"):
            return empty
        nvml = self._nvml
        try:
            buffers = self._device_buffers(device.index)
            if buffers is None:
                return empty
            current = buffers[0] if device.gpm_previous is not buffers[0] else buffers[1]
            self._caller.call(nvml.nvmlGpmSampleGet, device.handle, current)
            previous, device.gpm_previous = device.gpm_previous, current
            if previous is None:
                return empty
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = previous
            request.sample2 = current
            for slot, metric_id in enumerate(GPM_METRICS.values()):
                request.metrics[slot].metricId = metric_id
            answer = self._caller.call(nvml.nvmlGpmMetricsGet, request)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add("gpm")
            return empty
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            device.gpm_previous = None
            return empty
        result = dict(empty)
        for slot, name in enumerate(GPM_METRICS):
            metric = answer.metrics[slot]
            if metric.nvmlReturn == nvml.NVML_SUCCESS:
                result[name] = min(max(float(metric.value), 0.0), 100.0)
        return result

    def _device_buffers(self, index: int) -> list[Any] | None:
        """The GPU's two sample buffers, allocated on first use; ``None`` once closed (what a read allocated
        while ``close`` ran is freed here, not kept)."""
        with self._lock:
            buffers = self._buffers.get(index)
            if buffers is not None or self._closed:
                return buffers
        made: list[Any] = []
        try:
            for _ in range(2):
                made.append(self._caller.call(self._nvml.nvmlGpmSampleAlloc))
        except BaseException:
            self._free(made)
            raise
        with self._lock:
            if not self._closed:
                return self._buffers.setdefault(index, made)
        self._free(made)
        return None

    def _free(self, buffers: list[Any]) -> None:
        nvml = self._nvml
        for buffer in buffers:
            with contextlib.suppress(nvml.NVMLError):
                self._caller.call(nvml.nvmlGpmSampleFree, buffer)

    def close(self) -> None:
        """Free the sample buffers (errors ignored: NVML may already be shut down); later reads allocate none."""
        with self._lock:
            held, self._buffers, self._closed = list(self._buffers.values()), {}, True
        for buffers in held:
            self._free(buffers)
