"""The simulated driver: the body of each NVML C function, with the C signature pynvml calls it with.

Each body receives the already-resolved device index and the clock reading of the call, writes into the
ctypes out-parameters and returns an NVML return code. Initialisation state, faults, latency and call
accounting are the library shell's business (``library.py``).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import constants as c
from .cargs import address_of, as_int, store_address, store_string, target
from .profiles import Profile, gpu_uuid
from .workload import Workload

_PCIE_THROUGHPUT_WINDOW_S = 0.02
_FIELD_LATENCY_US = 3


@dataclass(frozen=True)
class Call:
    """What a function body may know about its call: the device (or -1) and the clock after the latency."""

    device: int
    now: float


@dataclass(frozen=True)
class EntrySpec:
    """One entry point: its body, its latency at ``latency_scale=1`` and how its device is named."""

    run: Callable[..., int]
    latency_s: Callable[[tuple[object, ...]], float]
    device: Literal["handle", "index"] | None = None


def _fixed(seconds: float) -> Callable[[tuple[object, ...]], float]:
    return lambda _args: seconds


def _field_values_latency(args: tuple[object, ...]) -> float:
    try:
        count = as_int(args[1])
    except (IndexError, TypeError):
        count = 0
    return 30e-6 + max(count, 0) * _FIELD_LATENCY_US * 1e-6


class FakeDriver:
    """The GPUs of one profile, their handles, and the readings the workload gives them."""

    def __init__(self, profile: Profile, seed: int, created_at: float) -> None:
        self.profile = profile
        self.workload = Workload(profile, seed)
        self.created_at = created_at
        self._uuids = [gpu_uuid(profile.name, seed, i) for i in range(profile.gpu_count)]
        self._handle_storage = [ctypes.create_string_buffer(8) for _ in range(profile.gpu_count)]
        self._devices = {ctypes.addressof(buf): i for i, buf in enumerate(self._handle_storage)}

    def device_of(self, handle: object) -> int | None:
        """The index of the device a handle refers to, or ``None`` for a handle this driver never gave out."""
        address = address_of(handle)
        return None if address is None else self._devices.get(address)

    def specs(self) -> dict[str, EntrySpec]:
        """Every entry point this driver implements, by C name."""
        getter = _fixed(30e-6)
        static = _fixed(10e-6)
        return {
            "nvmlInitWithFlags": EntrySpec(self._ok, _fixed(0.05 + 0.004 * self.profile.gpu_count)),
            "nvmlInit_v2": EntrySpec(self._ok, _fixed(0.05 + 0.004 * self.profile.gpu_count)),
            "nvmlShutdown": EntrySpec(self._ok, _fixed(5e-3)),
            "nvmlErrorString": EntrySpec(self._ok, _fixed(1e-6)),
            "nvmlSystemGetDriverVersion": EntrySpec(self.system_get_driver_version, static),
            "nvmlDeviceGetCount_v2": EntrySpec(self.device_get_count, static),
            "nvmlDeviceGetHandleByIndex_v2": EntrySpec(self.device_get_handle_by_index, static, "index"),
            "nvmlDeviceGetName": EntrySpec(self.device_get_name, static, "handle"),
            "nvmlDeviceGetUUID": EntrySpec(self.device_get_uuid, static, "handle"),
            "nvmlDeviceGetMemoryInfo": EntrySpec(self.device_get_memory_info, getter, "handle"),
            "nvmlDeviceGetMemoryInfo_v2": EntrySpec(self.device_get_memory_info_v2, getter, "handle"),
            "nvmlDeviceGetUtilizationRates": EntrySpec(self.device_get_utilization_rates, getter, "handle"),
            "nvmlDeviceGetTemperature": EntrySpec(self.device_get_temperature, getter, "handle"),
            "nvmlDeviceGetPowerUsage": EntrySpec(self.device_get_power_usage, getter, "handle"),
            "nvmlDeviceGetMaxPcieLinkGeneration": EntrySpec(self.device_get_max_pcie_generation, static, "handle"),
            "nvmlDeviceGetMaxPcieLinkWidth": EntrySpec(self.device_get_pcie_width, static, "handle"),
            "nvmlDeviceGetCurrPcieLinkGeneration": EntrySpec(self.device_get_curr_pcie_generation, static, "handle"),
            "nvmlDeviceGetCurrPcieLinkWidth": EntrySpec(self.device_get_pcie_width, static, "handle"),
            "nvmlDeviceGetPcieThroughput": EntrySpec(
                self.device_get_pcie_throughput, _fixed(_PCIE_THROUGHPUT_WINDOW_S), "handle"
            ),
            "nvmlDeviceGetNvLinkState": EntrySpec(self.device_get_nvlink_state, getter, "handle"),
            "nvmlDeviceGetNvLinkVersion": EntrySpec(self.device_get_nvlink_version, getter, "handle"),
            "nvmlDeviceGetFieldValues": EntrySpec(self.device_get_field_values, _field_values_latency, "handle"),
        }

    def _t(self, now: float) -> float:
        return now - self.created_at

    @staticmethod
    def _ok(_call: Call, *_args: object) -> int:
        return c.NVML_SUCCESS

    @staticmethod
    def _store_uint(out: object, value: int) -> int:
        target(out).value = value
        return c.NVML_SUCCESS

    def system_get_driver_version(self, _call: Call, buffer: object, size: object) -> int:
        if not store_string(buffer, size, self.profile.driver_version):
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        return c.NVML_SUCCESS

    def device_get_count(self, _call: Call, count: object) -> int:
        return self._store_uint(count, self.profile.gpu_count)

    def device_get_handle_by_index(self, call: Call, _index: object, device: object) -> int:
        store_address(device, ctypes.addressof(self._handle_storage[call.device]))
        return c.NVML_SUCCESS

    def device_get_name(self, _call: Call, _handle: object, buffer: object, size: object) -> int:
        if not store_string(buffer, size, self.profile.gpu_name):
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        return c.NVML_SUCCESS

    def device_get_uuid(self, call: Call, _handle: object, buffer: object, size: object) -> int:
        if not store_string(buffer, size, self._uuids[call.device]):
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        return c.NVML_SUCCESS

    def device_get_memory_info(self, call: Call, _handle: object, memory: object) -> int:
        used = self.workload.memory_used_bytes(call.device, self._t(call.now))
        out = target(memory)
        out.total = self.profile.memory_total_bytes
        out.used = used
        out.free = self.profile.memory_total_bytes - used
        return c.NVML_SUCCESS

    def device_get_memory_info_v2(self, call: Call, _handle: object, memory: object) -> int:
        out = target(memory)
        if out.version != c.NVML_MEMORY_V2_VERSION:
            return c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        used = self.workload.memory_used_bytes(call.device, self._t(call.now))
        reserved = self.profile.memory_reserved_bytes
        out.total = self.profile.memory_total_bytes
        out.reserved = reserved
        out.used = used - reserved
        out.free = self.profile.memory_total_bytes - used
        return c.NVML_SUCCESS

    def device_get_utilization_rates(self, call: Call, _handle: object, utilization: object) -> int:
        gpu, memory = self.workload.utilization(call.device, self._t(call.now))
        out = target(utilization)
        out.gpu = gpu
        out.memory = memory
        return c.NVML_SUCCESS

    def device_get_temperature(self, call: Call, _handle: object, sensor: object, temperature: object) -> int:
        if as_int(sensor) != c.NVML_TEMPERATURE_GPU:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(temperature, self.workload.temperature_c(call.device, self._t(call.now)))

    def device_get_power_usage(self, call: Call, _handle: object, milliwatts: object) -> int:
        return self._store_uint(milliwatts, self.workload.power_mw(call.device, self._t(call.now)))

    def device_get_max_pcie_generation(self, _call: Call, _handle: object, generation: object) -> int:
        return self._store_uint(generation, self.profile.pcie_generation)

    def device_get_curr_pcie_generation(self, call: Call, _handle: object, generation: object) -> int:
        return self._store_uint(generation, self.workload.pcie_link_generation(call.device))

    def device_get_pcie_width(self, _call: Call, _handle: object, width: object) -> int:
        return self._store_uint(width, self.profile.pcie_width)

    def device_get_pcie_throughput(self, call: Call, _handle: object, counter: object, kb_per_s: object) -> int:
        """Mean rate over the 20 ms before the call returns, in KB/s (1000 bytes/s)."""
        series: Literal["pcie_tx", "pcie_rx"]
        which = as_int(counter)
        if which == c.NVML_PCIE_UTIL_TX_BYTES:
            series = "pcie_tx"
        elif which == c.NVML_PCIE_UTIL_RX_BYTES:
            series = "pcie_rx"
        else:
            return c.NVML_ERROR_INVALID_ARGUMENT
        t = self._t(call.now)
        rate = self.workload.mean_rate_bytes_per_s(call.device, series, t - _PCIE_THROUGHPUT_WINDOW_S, t)
        return self._store_uint(kb_per_s, math.floor(rate / 1000))

    def _nvlink_check(self, link: object) -> int:
        if self.profile.nvlink_links == 0:
            return c.NVML_ERROR_NOT_SUPPORTED
        if not 0 <= as_int(link) < self.profile.nvlink_links:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return c.NVML_SUCCESS

    def device_get_nvlink_state(self, _call: Call, _handle: object, link: object, active: object) -> int:
        code = self._nvlink_check(link)
        return code if code != c.NVML_SUCCESS else self._store_uint(active, 1)

    def device_get_nvlink_version(self, _call: Call, _handle: object, link: object, version: object) -> int:
        code = self._nvlink_check(link)
        return code if code != c.NVML_SUCCESS else self._store_uint(version, self.profile.nvlink_version)

    def device_get_field_values(self, call: Call, _handle: object, count: object, values: object) -> int:
        """Fill each requested field; a field that cannot be read fails alone, in its ``nvmlReturn``."""
        n = as_int(count)
        array = target(values)
        if n < 0 or n > len(array):
            return c.NVML_ERROR_INVALID_ARGUMENT
        timestamp_us = math.floor(call.now * 1e6)
        t = timestamp_us / 1e6 - self.created_at
        for i in range(n):
            entry = array[i]
            entry.timestamp = timestamp_us
            entry.latencyUsec = _FIELD_LATENCY_US
            entry.valueType = c.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.nvmlReturn = self._field(entry, call.device, t)
        return c.NVML_SUCCESS

    def _field(self, entry: Any, device: int, t: float) -> int:
        field_id: int = entry.fieldId
        scope: int = entry.scopeId
        profile = self.profile
        value: int
        if field_id in (c.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, c.NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
            if not profile.pcie_byte_counters:
                return c.NVML_ERROR_NOT_SUPPORTED
            series: Literal["pcie_tx", "pcie_rx"] = (
                "pcie_tx" if field_id == c.NVML_FI_DEV_PCIE_COUNT_TX_BYTES else "pcie_rx"
            )
            value = self.workload.pcie_counter_bytes(device, series, t)
        elif field_id in (c.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, c.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            code = self._nvlink_check(scope)
            if code != c.NVML_SUCCESS:
                return code
            link_series: Literal["nvlink_tx", "nvlink_rx"] = (
                "nvlink_tx" if field_id == c.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else "nvlink_rx"
            )
            value = self.workload.nvlink_counter_kib(device, link_series, scope, t)
        elif field_id == c.NVML_FI_DEV_NVLINK_LINK_COUNT:
            if profile.nvlink_links == 0:
                return c.NVML_ERROR_NOT_SUPPORTED
            entry.valueType = c.NVML_VALUE_TYPE_UNSIGNED_INT
            value = profile.nvlink_links
        else:
            return c.NVML_ERROR_NOT_SUPPORTED
        entry.value.ullVal = value
        return c.NVML_SUCCESS
