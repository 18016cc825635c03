"""Learning a GPU once, at start: identity, link maxima, thresholds, limits and which readings it supports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nvdash.sampling.nvml_device import Device, NvmlCaller, field_number, text_of
from nvdash.sampling.records import GpuInfo

# NVML field ids and enums (nvml.h; pynvml mirrors them).
FI_MEMORY_TEMP = 82
FI_NVLINK_THROUGHPUT_DATA_TX = 138
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_NVLINK_GET_SPEED = 164
FI_PCIE_COUNT_TX_BYTES = 197
FI_PCIE_COUNT_RX_BYTES = 198
NVLINK_MAX_LINKS = 36
NVLINK_DEVICE_TYPE_SWITCH = 2
"""``NVML_NVLINK_DEVICE_TYPE_SWITCH``."""
NVLINK_THROUGHPUT_FIELDS = (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)

# Per lane, per direction, after line encoding (bytes/s).
PCIE_LANE_BYTES_PER_S: dict[int, float] = {
    1: 2.5e9 * 8 / 10 / 8,
    2: 5e9 * 8 / 10 / 8,
    3: 8e9 * 128 / 130 / 8,
    4: 16e9 * 128 / 130 / 8,
    5: 32e9 * 128 / 130 / 8,
    6: 64e9 * 242 / 256 / 8,
}

NVLINK_VERSION_NAMES: dict[int, str] = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
"""``nvmlNvlinkVersion_t`` (what ``nvmlDeviceGetNvLinkVersion`` returns) to the NVLink generation."""
NVLINK_LINK_BYTES_PER_S: dict[str, float] = {
    "1.0": 20e9,
    "2.0": 25e9,
    "2.2": 25e9,
    "3.0": 25e9,
    "3.1": 25e9,
    "4.0": 25e9,
    "5.0": 50e9,
}
"""Usable data rate of one link, per direction, by NVLink generation, as NVIDIA publishes it (P100 NVLink 1: 20 GB/s;
V100, A100, H100: 25 GB/s; B200: 50 GB/s). Percentages of the NVLink maximum are of this rate: the driver's speed
field (``NVML_FI_DEV_NVLINK_GET_SPEED``) is the signalling rate, above it by the line encoding."""

TEMPERATURE_THRESHOLDS = {"shutdown": 0, "slowdown": 1, "memory_max": 2, "gpu_max": 3}
"""``nvmlTemperatureThresholds_t``."""
CLOCK_TYPES = {"graphics": 0, "sm": 1, "memory": 2, "video": 3}
"""``nvmlClockType_t``."""


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def decode_nvlink_version(enum_value: int | None) -> str | None:
    """The NVLink generation (``"4.0"``) for an ``nvmlNvlinkVersion_t`` value; ``None`` when invalid or unknown."""
    return None if enum_value is None else NVLINK_VERSION_NAMES.get(int(enum_value))


class DeviceProber:
    """Reads a device's static facts through an :class:`NvmlCaller`; fills ``device`` and returns its GpuInfo."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._nvml = caller.nvml

    def _get(self, device: Device, metric: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._caller.optional(device, metric, fn, *args)

    def learn(self, device: Device) -> GpuInfo:
        """Probe everything static about ``device``; raises ``GpuLost`` if it is lost meanwhile."""
        nvml = self._nvml
        uuid = self._get(device, "uuid", nvml.nvmlDeviceGetUUID)
        memory = self._get(device, "memory", nvml.nvmlDeviceGetMemoryInfo)
        pci = self._get(device, "pci_info", nvml.nvmlDeviceGetPciInfo)
        minor = _int(self._get(device, "minor_number", nvml.nvmlDeviceGetMinorNumber))
        generation = _int(self._get(device, "pcie_generation", nvml.nvmlDeviceGetMaxPcieLinkGeneration))
        width = _int(self._get(device, "pcie_width", nvml.nvmlDeviceGetMaxPcieLinkWidth))
        pcie_max = PCIE_LANE_BYTES_PER_S[generation] * width if generation in PCIE_LANE_BYTES_PER_S and width else None
        device.nvlink_links, device.nvlink_active = self._links(device)
        version = self._nvlink_version(device)
        link_rate = NVLINK_LINK_BYTES_PER_S.get(version) if device.nvlink_active and version else None
        signalling = self._nvlink_signalling_rate(device)
        links_up = len(device.nvlink_active)
        device.pcie_counters = self._fields_supported(device, [FI_PCIE_COUNT_TX_BYTES, FI_PCIE_COUNT_RX_BYTES])
        memory_temp = self._fields_supported(device, [FI_MEMORY_TEMP])
        device.field_ids = self._field_ids(device, memory_temp)
        thresholds = {
            name: _scaled(self._get(device, f"threshold_{name}", nvml.nvmlDeviceGetTemperatureThreshold, code), 1.0)
            for name, code in TEMPERATURE_THRESHOLDS.items()
        }
        max_clocks = {
            name: _scaled(self._get(device, f"max_clock_{name}", nvml.nvmlDeviceGetMaxClockInfo, code), 1.0)
            for name, code in CLOCK_TYPES.items()
        }
        constraints = self._get(device, "power_constraints", nvml.nvmlDeviceGetPowerManagementLimitConstraints)
        ecc = self._get(device, "ecc_mode", nvml.nvmlDeviceGetEccMode)
        fans = _int(self._get(device, "fan_count", nvml.nvmlDeviceGetNumFans))
        return GpuInfo(
            index=device.index,
            name=device.info.name,
            uuid=str(uuid or ""),
            memory_total_bytes=int(memory.total) if memory is not None else None,
            pcie_generation=generation or None,
            pcie_width=width or None,
            pcie_max_bytes_per_s=pcie_max,
            nvlink_links=len(device.nvlink_active),
            nvlink_max_bytes_per_s=link_rate * links_up if link_rate else None,
            pci_bus_id=text_of(getattr(pci, "busId", "")) if pci is not None else "",
            minor_number=minor,
            nvlink_version=version,
            nvlink_active_links=device.nvlink_active,
            nvlink_to_switch=self._links_to_switch(device),
            nvlink_link_bytes_per_s=link_rate,
            nvlink_link_signalling_bytes_per_s=signalling,
            nvlink_signalling_max_bytes_per_s=signalling * links_up if signalling else None,
            nvlink_speed_from_driver=signalling is not None,
            temperature_slowdown_c=thresholds["slowdown"],
            temperature_shutdown_c=thresholds["shutdown"],
            temperature_gpu_max_c=thresholds["gpu_max"],
            temperature_memory_max_c=thresholds["memory_max"],
            power_default_limit_w=_scaled(
                self._get(device, "power_default_limit", nvml.nvmlDeviceGetPowerManagementDefaultLimit), 1e-3
            ),
            power_min_limit_w=_scaled(constraints[0], 1e-3) if constraints is not None else None,
            power_max_limit_w=_scaled(constraints[1], 1e-3) if constraints is not None else None,
            clock_graphics_max_mhz=max_clocks["graphics"],
            clock_sm_max_mhz=max_clocks["sm"],
            clock_memory_max_mhz=max_clocks["memory"],
            clock_video_max_mhz=max_clocks["video"],
            fan_count=fans,
            ecc_enabled=bool(ecc[0]) if ecc is not None else None,
            ecc_pending=bool(ecc[1]) if ecc is not None else None,
            memory_error_mechanism=self._memory_error_mechanism(device),
            gpm_supported=self._gpm_supported(device),
        )

    def _links(self, device: Device) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(links NVML knows, links that are up); both empty on a GPU without NVLink."""
        nvml = self._nvml
        present: list[int] = []
        active: list[int] = []
        for link in range(NVLINK_MAX_LINKS):
            try:
                state = self._caller.call(nvml.nvmlDeviceGetNvLinkState, device.handle, link)
            except nvml.NVMLError:
                break
            present.append(link)
            if state:
                active.append(link)
        if not active:
            return (), ()
        return tuple(present), tuple(active)

    def _links_to_switch(self, device: Device) -> bool:
        """True when an active link's far end is an NVSwitch (``NVML_NVLINK_DEVICE_TYPE_SWITCH``)."""
        nvml = self._nvml
        for link in device.nvlink_active:
            kind = self._get(device, "nvlink_remote_type", nvml.nvmlDeviceGetNvLinkRemoteDeviceType, link)
            if kind is not None:
                return int(kind) == NVLINK_DEVICE_TYPE_SWITCH
        return False

    def _nvlink_version(self, device: Device) -> str | None:
        if not device.nvlink_active:
            return None
        nvml = self._nvml
        enum_value = self._get(device, "nvlink_version", nvml.nvmlDeviceGetNvLinkVersion, device.nvlink_active[0])
        return decode_nvlink_version(enum_value)

    def _nvlink_signalling_rate(self, device: Device) -> float | None:
        """One link's signalling rate per direction (bytes/s): the driver's speed field (MB/s), ``None`` without it."""
        if not device.nvlink_active:
            return None
        nvml = self._nvml
        values = self._get(
            device, "field_values", nvml.nvmlDeviceGetFieldValues, [(FI_NVLINK_GET_SPEED, device.nvlink_active[0])]
        )
        if values and values[0].nvmlReturn == nvml.NVML_SUCCESS:
            speed_mb_per_s = field_number(values[0])
            if speed_mb_per_s and speed_mb_per_s > 0:
                return speed_mb_per_s * 1e6
        return None

    def _fields_supported(self, device: Device, field_ids: list[int]) -> bool:
        nvml = self._nvml
        values = self._get(device, "field_values", nvml.nvmlDeviceGetFieldValues, field_ids)
        return values is not None and all(value.nvmlReturn == nvml.NVML_SUCCESS for value in values)

    @staticmethod
    def _field_ids(device: Device, memory_temp: bool) -> list[tuple[int, int]]:
        ids: list[tuple[int, int]] = []
        if device.pcie_counters:
            ids += [(FI_PCIE_COUNT_TX_BYTES, 0), (FI_PCIE_COUNT_RX_BYTES, 0)]
        for link in device.nvlink_active:
            ids += [(FI_NVLINK_THROUGHPUT_DATA_TX, link), (FI_NVLINK_THROUGHPUT_DATA_RX, link)]
        if memory_temp:
            ids.append((FI_MEMORY_TEMP, 0))
        return ids

    def _memory_error_mechanism(self, device: Device) -> str | None:
        nvml = self._nvml
        if self._get(device, "remapped_rows", nvml.nvmlDeviceGetRemappedRows) is not None:
            return "row remapping"
        if self._get(device, "retired_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus) is not None:
            return "page retirement"
        return None

    def _gpm_supported(self, device: Device) -> bool:
        support = self._get(device, "gpm_support", self._nvml.nvmlGpmQueryDeviceSupport)
        return bool(getattr(support, "isSupportedDevice", 0)) if support is not None else False
