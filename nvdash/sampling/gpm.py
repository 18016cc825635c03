"""GPU performance metrics (GPM, Hopper and later): graphics engine, SM, tensor, FP pipe and DRAM activity.

NVML computes GPM metrics from two samples taken by ``nvmlGpmSampleGet``; each sweep takes one and asks for the
metrics over the interval since the previous sweep's. Two sample buffers per GPU are allocated once and reused.
"""

from __future__ import annotations

from nvdash.sampling.gpm_buffers import BufferPairs, metrics_between, other
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
        self._buffers: BufferPairs[int] = BufferPairs(caller)

    def read(self, device: Device) -> dict[str, float | None]:
        """The GPM metric fields of ``device`` (all ``None`` on the first sweep or when NVML cannot say)."""
        empty: dict[str, float | None] = dict.fromkeys(GPM_METRICS)
        if not self._caller.supported(device, "gpm"):
            return empty
        nvml = self._caller.nvml
        try:
            buffers = self._buffers.get(device.index)
            if buffers is None:
                return empty
            current = other(buffers, device.gpm_previous)
            self._caller.call(nvml.nvmlGpmSampleGet, device.handle, current)
            previous, device.gpm_previous = device.gpm_previous, current
            if previous is None:
                return empty
            values = metrics_between(self._caller, previous, current, list(GPM_METRICS.values()))
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add("gpm")
            return empty
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            device.gpm_previous = None
            return empty
        return dict(zip(GPM_METRICS, values, strict=True))

    def close(self) -> None:
        """Free the sample buffers (errors ignored: NVML may already be shut down); later reads allocate none."""
        self._buffers.close()
