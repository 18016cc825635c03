"""The GPU's temperature through NVML's current entry point, with the deprecated one for older drivers.

``nvmlDeviceGetTemperature`` is deprecated since NVML 13 (pynvml: "will be removed in CUDA 14.0") in favour of
``nvmlDeviceGetTemperatureV`` (an ``nvmlTemperature_v1_t`` with version, sensor type and a signed temperature),
which drivers before R565 lack. The new call is asked first; a driver without it (function not found), one that
does not support it, or one that wants another struct version, is remembered per device and asked the old way.
"""

from __future__ import annotations

from nvdash.sampling.nvml_device import Device, GpuLost, NvmlCaller

TEMPERATURE_GPU = 0
"""``NVML_TEMPERATURE_GPU``: the GPU die sensor."""
TEMPERATURE_V = "temperature_v"
"""The name under which a device remembers that ``nvmlDeviceGetTemperatureV`` does not answer it."""


def gpu_temperature(caller: NvmlCaller, device: Device) -> float | None:
    """The GPU die temperature in °C, or ``None`` when unsupported or failing this time."""
    nvml = caller.nvml
    new = getattr(nvml, "nvmlDeviceGetTemperatureV", None)
    if new is not None and TEMPERATURE_V not in device.unsupported:
        try:
            return float(caller.call(new, device.handle, TEMPERATURE_GPU))
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, nvml.NVMLError_ArgumentVersionMismatch):
            device.unsupported.add(TEMPERATURE_V)
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            return None
    else:
        device.unsupported.add(TEMPERATURE_V)
    old = caller.optional(device, "temperature", nvml.nvmlDeviceGetTemperature, TEMPERATURE_GPU)
    return None if old is None else float(old)
