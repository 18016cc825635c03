"""The simulated driver: the body of each NVML C function, with the C signature pynvml calls it with.

Each body receives the already-resolved device index and the clock reading of the call, writes into the
ctypes out-parameters and returns an NVML return code. Initialisation state, faults, latency and call
accounting are the library shell's business (``library.py``).
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import constants as c
from .cargs import address_of, as_int, store_address, store_pointer_field, store_string, target
from .counters import LoadCounters
from .events import POLL_S, SUPPORTED_EVENT_TYPES, EventHub
from .gpm import GpmSamples, metric_value, mig_metric_value
from .mig import MigLayouts
from .processes import ProcessTable
from .profiles import Profile, gpu_uuid
from .scenario import Event, Health
from .usage_driver import UsageFunctions
from .workload import VIDEO_SAMPLING_PERIOD_US, VIOLATION_REASONS, Workload

_PCIE_THROUGHPUT_WINDOW_S = 0.02
_FIELD_LATENCY_US = 3
IDLE_DRIVER_BYTES = 4 * 1024 * 1024
"""What the driver uses on a GPU beyond its reservation with no job on it (the workload's idle GPUs use as much)."""
_OK = c.NVML_SUCCESS
_NVLINK_CAPABILITIES = {
    c.NVML_NVLINK_CAP_P2P_SUPPORTED: 1,
    c.NVML_NVLINK_CAP_SYSMEM_ACCESS: 0,
    c.NVML_NVLINK_CAP_P2P_ATOMICS: 1,
    c.NVML_NVLINK_CAP_SYSMEM_ATOMICS: 0,
    c.NVML_NVLINK_CAP_SLI_BRIDGE: 0,
    c.NVML_NVLINK_CAP_VALID: 1,
}
"""GPU-to-GPU links through NVSwitch on an x86 host: peer access and atomics, no system memory over NVLink."""
_UNSUPPORTED_THRESHOLDS = range(c.NVML_TEMPERATURE_THRESHOLD_GPU_MAX + 1, c.NVML_TEMPERATURE_THRESHOLD_COUNT)
"""Acoustic and GPS thresholds: not on datacenter boards."""


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


def _bus_ids(bus: int, device: int) -> tuple[bytes, bytes]:
    """(``busIdLegacy``, ``busId``) in NVML's ``%04X:%02X:%02X.0`` and ``%08X:%02X:%02X.0`` forms, domain 0."""
    return f"0000:{bus:02X}:{device:02X}.0".encode(), f"00000000:{bus:02X}:{device:02X}.0".encode()


def _fill_pci(out: Any, bus: int, device: int, device_id: int, subsystem_id: int) -> None:
    legacy, bus_id = _bus_ids(bus, device)
    out.busIdLegacy = legacy
    out.domain = 0
    out.bus = bus
    out.device = device
    out.pciDeviceId = device_id
    out.pciSubSystemId = subsystem_id
    out.busId = bus_id


NVML_TEMPERATURE_V1_VERSION = 12 | (1 << 24)
"""``nvmlTemperature_v1``: ``NVML_STRUCT_VERSION(Temperature, 1)`` of the 12-byte ``nvmlTemperature_v1_t``."""


class FakeDriver:
    """The GPUs of one profile, their handles, and the readings the workload gives them."""

    def __init__(self, profile: Profile, seed: int, created_at: float, clock: Callable[[], float] = time.time) -> None:
        self.profile = profile
        self.workload = Workload(profile, seed)
        self.health = Health(profile, seed, created_at)
        self.created_at = created_at
        real_time = clock is time.time
        self.events = EventHub(
            self.health.scenario_events, lambda: clock() - created_at, poll_s=None if real_time else POLL_S
        )
        self.gpm = GpmSamples()
        self.counters = LoadCounters(self.workload)
        self._uuids = [gpu_uuid(profile.name, seed, i) for i in range(profile.gpu_count)]
        self.names: dict[int, str] = {}
        self.unanswered_fields: set[int] = set()
        """Field ids the simulated driver answers NOT_SUPPORTED (a driver that lacks them)."""
        """Product names that replace the profile's, by device (see the ``name`` fault)."""
        self._handle_storage = [ctypes.create_string_buffer(8) for _ in range(profile.gpu_count)]
        self._devices = {ctypes.addressof(buf): i for i, buf in enumerate(self._handle_storage)}
        self.usage = UsageFunctions(
            profile,
            ProcessTable(profile, self.workload, created_at),
            MigLayouts(profile, self._uuids),
            lambda gpu: ctypes.addressof(self._handle_storage[gpu]),
            created_at,
        )

    def device_of(self, handle: object) -> int | None:
        """The index of the device a handle refers to (a MIG device's parent), or ``None`` for a foreign handle."""
        address = address_of(handle)
        if address is None:
            return None
        device = self._devices.get(address)
        if device is None:
            mig = self.usage.mig.device_of(address)
            device = None if mig is None else mig[0]
        return device

    def is_mig_handle(self, handle: object) -> bool:
        """True for a MIG device handle."""
        return self.usage.mig_of(handle) is not None

    def _memory_used(self, gpu: int, t: float) -> int:
        """Used memory, driver reservation included: the job's, fixed-size processes', or the MIG instances'.

        The job's memory is there only while a rank of the job (a process holding a ``memory_share`` of it) runs on
        the GPU: on a GPU whose processes all hold fixed amounts (a shared GPU), used memory is the reservation, a
        few MiB of the driver's own, and those amounts, as ``nvidia-smi`` would add them up."""
        if self.usage.mig.enabled(gpu):
            return self.profile.memory_reserved_bytes + self.usage.parent_mig_used(gpu)
        fixed = self.usage.whole_gpu_fixed_bytes(gpu)
        processes = self.usage.running(gpu)
        if processes and not any(spec.memory_share > 0 for spec in processes):
            return self.profile.memory_reserved_bytes + IDLE_DRIVER_BYTES + fixed
        return self.workload.memory_used_bytes(gpu, t) + fixed

    def inject_xid(self, device: int, xid: int, t: float) -> None:
        """XID ``xid`` on ``device`` at ``t`` s: its side effects on the counters and its events."""
        self.events.add(self.health.inject(device, xid, t))

    def specs(self) -> dict[str, EntrySpec]:
        """Every entry point this driver implements, by C name."""
        getter = _fixed(30e-6)
        static = _fixed(10e-6)
        init = _fixed(0.05 + 0.004 * self.profile.gpu_count)
        plain: dict[str, tuple[Callable[..., int], Callable[[tuple[object, ...]], float]]] = {
            "nvmlInitWithFlags": (self._ok, init),
            "nvmlInit_v2": (self._ok, init),
            "nvmlShutdown": (self._ok, _fixed(5e-3)),
            "nvmlErrorString": (self._ok, _fixed(1e-6)),
            "nvmlSystemGetDriverVersion": (self.system_get_driver_version, static),
            "nvmlDeviceGetCount_v2": (self.device_get_count, static),
            "nvmlEventSetCreate": (self.event_set_create, static),
            "nvmlEventSetWait_v2": (self.event_set_wait, static),
            "nvmlEventSetFree": (self.event_set_free, static),
            "nvmlGpmSampleAlloc": (self.gpm_sample_alloc, static),
            "nvmlGpmSampleFree": (self.gpm_sample_free, static),
            "nvmlGpmMetricsGet": (self.gpm_metrics_get, getter),
        }
        by_handle: dict[str, tuple[Callable[..., int], Callable[[tuple[object, ...]], float]]] = {
            "nvmlDeviceGetName": (self.device_get_name, static),
            "nvmlDeviceGetUUID": (self.device_get_uuid, static),
            "nvmlDeviceGetPciInfo_v3": (self.device_get_pci_info, static),
            "nvmlDeviceGetMinorNumber": (self.device_get_minor_number, static),
            "nvmlDeviceGetArchitecture": (self.device_get_architecture, static),
            "nvmlDeviceGetTemperatureThreshold": (self.device_get_temperature_threshold, static),
            "nvmlDeviceGetPowerManagementDefaultLimit": (self.device_get_power_default_limit, static),
            "nvmlDeviceGetPowerManagementLimitConstraints": (self.device_get_power_limit_constraints, static),
            "nvmlDeviceGetMaxClockInfo": (self.device_get_max_clock_info, static),
            "nvmlDeviceGetNumFans": (self.device_get_num_fans, static),
            "nvmlDeviceGetEccMode": (self.device_get_ecc_mode, static),
            "nvmlGpmQueryDeviceSupport": (self.gpm_query_device_support, static),
            "nvmlDeviceGetTopologyCommonAncestor": (self.device_get_topology_common_ancestor, static),
            "nvmlDeviceGetSupportedEventTypes": (self.device_get_supported_event_types, static),
            "nvmlDeviceRegisterEvents": (self.device_register_events, static),
            "nvmlDeviceGetMaxPcieLinkGeneration": (self.device_get_max_pcie_generation, static),
            "nvmlDeviceGetMaxPcieLinkWidth": (self.device_get_max_pcie_width, static),
            "nvmlDeviceGetNvLinkVersion": (self.device_get_nvlink_version, getter),
            "nvmlDeviceGetNvLinkRemotePciInfo_v2": (self.device_get_nvlink_remote_pci_info, static),
            "nvmlDeviceGetNvLinkRemoteDeviceType": (self.device_get_nvlink_remote_device_type, static),
            "nvmlDeviceGetNvLinkCapability": (self.device_get_nvlink_capability, static),
            "nvmlDeviceGetMemoryInfo": (self.device_get_memory_info, getter),
            "nvmlDeviceGetMemoryInfo_v2": (self.device_get_memory_info_v2, getter),
            "nvmlDeviceGetUtilizationRates": (self.device_get_utilization_rates, getter),
            "nvmlDeviceGetTemperature": (self.device_get_temperature, getter),
            "nvmlDeviceGetTemperatureV": (self.device_get_temperature_v, getter),
            "nvmlDeviceGetPowerUsage": (self.device_get_power_usage, getter),
            "nvmlDeviceGetTotalEnergyConsumption": (self.device_get_total_energy, getter),
            "nvmlDeviceGetEnforcedPowerLimit": (self.device_get_enforced_power_limit, getter),
            "nvmlDeviceGetPowerManagementLimit": (self.device_get_power_management_limit, getter),
            "nvmlDeviceGetPerformanceState": (self.device_get_performance_state, getter),
            "nvmlDeviceGetClockInfo": (self.device_get_clock_info, getter),
            "nvmlDeviceGetCurrentClocksEventReasons": (self.device_get_clock_event_reasons, getter),
            "nvmlDeviceGetCurrentClocksThrottleReasons": (self.device_get_clock_event_reasons, getter),
            "nvmlDeviceGetFanSpeed": (self.device_get_fan_speed, getter),
            "nvmlDeviceGetFanSpeed_v2": (self.device_get_fan_speed_v2, getter),
            "nvmlDeviceGetCurrPcieLinkGeneration": (self.device_get_curr_pcie_generation, getter),
            "nvmlDeviceGetCurrPcieLinkWidth": (self.device_get_curr_pcie_width, getter),
            "nvmlDeviceGetPcieReplayCounter": (self.device_get_pcie_replay_counter, getter),
            "nvmlDeviceGetPcieThroughput": (self.device_get_pcie_throughput, _fixed(_PCIE_THROUGHPUT_WINDOW_S)),
            "nvmlDeviceGetTotalEccErrors": (self.device_get_total_ecc_errors, getter),
            "nvmlDeviceGetRemappedRows": (self.device_get_remapped_rows, getter),
            "nvmlDeviceGetRetiredPages": (self.device_get_retired_pages, getter),
            "nvmlDeviceGetRetiredPages_v2": (self.device_get_retired_pages_v2, getter),
            "nvmlDeviceGetRetiredPagesPendingStatus": (self.device_get_retired_pages_pending, getter),
            "nvmlDeviceGetNvLinkState": (self.device_get_nvlink_state, getter),
            "nvmlDeviceGetNvLinkErrorCounter": (self.device_get_nvlink_error_counter, getter),
            "nvmlDeviceGetFieldValues": (self.device_get_field_values, _field_values_latency),
            "nvmlGpmSampleGet": (self.gpm_sample_get, getter),
            "nvmlGpmMigSampleGet": (self.gpm_mig_sample_get, getter),
        }
        by_handle |= {
            "nvmlDeviceGetEncoderUtilization": (self.device_get_encoder_utilization, getter),
            "nvmlDeviceGetDecoderUtilization": (self.device_get_decoder_utilization, getter),
            "nvmlDeviceGetViolationStatus": (self.device_get_violation_status, getter),
        }
        by_handle |= {name: (body, getter) for name, body in self.usage.bodies().items()}
        plain["nvmlGpuInstanceGetInfo"] = (self.usage.gpu_instance_get_info, static)
        specs = {name: EntrySpec(run, latency) for name, (run, latency) in plain.items()}
        specs |= {name: EntrySpec(run, latency, "handle") for name, (run, latency) in by_handle.items()}
        specs["nvmlDeviceGetHandleByIndex_v2"] = EntrySpec(self.device_get_handle_by_index, static, "index")
        return specs

    def _t(self, now: float) -> float:
        return now - self.created_at

    @staticmethod
    def _ok(_call: Call, *_args: object) -> int:
        return _OK

    @staticmethod
    def _store_uint(out: object, value: int) -> int:
        target(out).value = value
        return _OK

    # Identity and static properties

    def system_get_driver_version(self, _call: Call, buffer: object, size: object) -> int:
        if not store_string(buffer, size, self.profile.driver_version):
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        return _OK

    def device_get_count(self, _call: Call, count: object) -> int:
        return self._store_uint(count, self.profile.gpu_count)

    def device_get_handle_by_index(self, call: Call, _index: object, device: object) -> int:
        store_address(device, ctypes.addressof(self._handle_storage[call.device]))
        return _OK

    def device_get_name(self, call: Call, handle: object, buffer: object, size: object) -> int:
        mig = self.usage.mig_of(handle)
        gpu_name = self.names.get(mig[0] if mig is not None else call.device, self.profile.gpu_name)
        name = gpu_name if mig is None else self.usage.mig_name(gpu_name, mig)
        if not store_string(buffer, size, name):
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        return _OK

    def device_get_uuid(self, call: Call, handle: object, buffer: object, size: object) -> int:
        mig = self.usage.mig_of(handle)
        uuid = self._uuids[call.device] if mig is None else self.usage.mig.uuid(*mig)
        if not store_string(buffer, size, uuid):
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        return _OK

    def device_get_minor_number(self, call: Call, handle: object, minor: object) -> int:
        """``/dev/nvidia<minor>``: in reverse order of the index (as where the driver probed the boards in another
        order than NVML's PCI order), so that whatever names GPUs by minor number cannot pass by using the index."""
        if self.usage.mig_of(handle) is not None:
            return c.NVML_ERROR_NOT_SUPPORTED
        return self._store_uint(minor, self.profile.gpu_count - 1 - call.device)

    def device_get_pci_info(self, call: Call, _handle: object, pci: object) -> int:
        """``nvmlPciInfo_t`` as ``nvmlDeviceGetPciInfo_v3`` fills it."""
        bus, device = self.profile.pci_locations[call.device]
        _fill_pci(target(pci), bus, device, self.profile.pci_device_id, self.profile.pci_subsystem_id)
        return _OK

    def device_get_architecture(self, _call: Call, _handle: object, arch: object) -> int:
        return self._store_uint(arch, self.profile.architecture)

    def device_get_temperature_threshold(self, _call: Call, _handle: object, threshold: object, temp: object) -> int:
        """Degrees C; the memory maximum only where an HBM sensor exists."""
        profile = self.profile
        values = {
            c.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: profile.temperature_shutdown_c,
            c.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: profile.temperature_slowdown_c,
            c.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: profile.temperature_memory_max_c,
            c.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: profile.temperature_gpu_max_c,
        }
        which = as_int(threshold)
        if which in _UNSUPPORTED_THRESHOLDS:
            return c.NVML_ERROR_NOT_SUPPORTED
        if which not in values:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(temp, values[which]) if values[which] else c.NVML_ERROR_NOT_SUPPORTED

    def device_get_power_default_limit(self, _call: Call, _handle: object, limit: object) -> int:
        return self._store_uint(limit, round(self.profile.power_limit_w * 1000))

    def device_get_power_limit_constraints(self, _call: Call, _handle: object, low: object, high: object) -> int:
        self._store_uint(low, round(self.profile.power_min_limit_w * 1000))
        return self._store_uint(high, round(self.profile.power_max_limit_w * 1000))

    def device_get_max_clock_info(self, _call: Call, _handle: object, clock_type: object, mhz: object) -> int:
        which = as_int(clock_type)
        if not 0 <= which < c.NVML_CLOCK_COUNT:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(mhz, self.profile.clock_max_mhz[which])

    def device_get_num_fans(self, _call: Call, _handle: object, count: object) -> int:
        """Passively cooled boards have no fan to report: NOT_SUPPORTED, as for their fan speed."""
        if self.profile.fan_count == 0:
            return c.NVML_ERROR_NOT_SUPPORTED
        return self._store_uint(count, self.profile.fan_count)

    def device_get_ecc_mode(self, _call: Call, _handle: object, current: object, pending: object) -> int:
        self._store_uint(current, c.NVML_FEATURE_ENABLED)
        return self._store_uint(pending, c.NVML_FEATURE_ENABLED)

    def gpm_query_device_support(self, _call: Call, _handle: object, support: object) -> int:
        """``nvmlGpmSupport_t``: Hopper and later answer ``isSupportedDevice`` 1, older GPUs 0."""
        out = target(support)
        if out.version != c.NVML_GPM_SUPPORT_VERSION:
            return c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        out.isSupportedDevice = int(self.profile.gpm_supported)
        return _OK

    def device_get_topology_common_ancestor(self, call: Call, _handle: object, other: object, level: object) -> int:
        """The closest PCIe level two GPUs share: a switch, the socket (NODE) or the whole system (SYS)."""
        second = self.device_of(other)
        if second is None:
            return c.NVML_ERROR_INVALID_ARGUMENT
        profile, first = self.profile, call.device
        if first == second:
            value = c.NVML_TOPOLOGY_INTERNAL
        elif profile.pcie_switches[first] == profile.pcie_switches[second]:
            value = profile.shared_switch_level
        elif profile.numa_nodes[first] == profile.numa_nodes[second]:
            value = c.NVML_TOPOLOGY_NODE
        else:
            value = c.NVML_TOPOLOGY_SYSTEM
        return self._store_uint(level, value)

    def device_get_max_pcie_generation(self, _call: Call, _handle: object, generation: object) -> int:
        return self._store_uint(generation, self.profile.pcie_generation)

    def device_get_max_pcie_width(self, _call: Call, _handle: object, width: object) -> int:
        return self._store_uint(width, self.profile.pcie_width)

    # Memory, utilization, temperature, power, clocks

    def _memory(self, call: Call, handle: object) -> tuple[int, int, int]:
        """(total, used including the reservation, reserved) of a GPU or of a MIG device."""
        mig = self.usage.mig_of(handle)
        if mig is not None:
            return self.usage.mig_memory(mig)
        reserved = self.profile.memory_reserved_bytes
        return self.profile.memory_total_bytes, self._memory_used(call.device, self._t(call.now)), reserved

    def device_get_memory_info(self, call: Call, handle: object, memory: object) -> int:
        total, used, _ = self._memory(call, handle)
        out = target(memory)
        out.total = total
        out.used = used
        out.free = total - used
        return _OK

    def device_get_memory_info_v2(self, call: Call, handle: object, memory: object) -> int:
        out = target(memory)
        if out.version != c.NVML_MEMORY_V2_VERSION:
            return c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        total, used, reserved = self._memory(call, handle)
        out.total = total
        out.reserved = reserved
        out.used = used - reserved
        out.free = total - used
        return _OK

    def device_get_utilization_rates(self, call: Call, _handle: object, utilization: object) -> int:
        """NOT_SUPPORTED on a GPU in MIG mode (nvidia-smi shows N/A): the instances share the engines."""
        if self.usage.mig.enabled(call.device):
            return c.NVML_ERROR_NOT_SUPPORTED
        gpu, memory = self.workload.utilization(call.device, self._t(call.now))
        out = target(utilization)
        out.gpu = gpu
        out.memory = memory
        return _OK

    def device_get_temperature(self, call: Call, _handle: object, sensor: object, temperature: object) -> int:
        if as_int(sensor) != c.NVML_TEMPERATURE_GPU:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(temperature, self.workload.temperature_c(call.device, self._t(call.now)))

    # Entry points that replace deprecated ones (the library drops those newer than the profile's driver)

    def device_get_temperature_v(self, call: Call, _handle: object, temperature: object) -> int:
        """``nvmlDeviceGetTemperatureV`` (R565+): an ``nvmlTemperature_v1_t`` in and out, the value signed."""
        out = target(temperature)
        if out.version != NVML_TEMPERATURE_V1_VERSION:
            return c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if out.sensorType != c.NVML_TEMPERATURE_GPU:
            return c.NVML_ERROR_INVALID_ARGUMENT
        out.temperature = self.workload.temperature_c(call.device, self._t(call.now))
        return _OK

    def device_get_power_usage(self, call: Call, _handle: object, milliwatts: object) -> int:
        return self._store_uint(milliwatts, self.workload.power_mw(call.device, self._t(call.now)))

    def device_get_total_energy(self, call: Call, _handle: object, millijoules: object) -> int:
        """mJ since the driver was loaded: the integral of what ``nvmlDeviceGetPowerUsage`` reports."""
        return self._store_uint(millijoules, self.counters.energy_mj(call.device, self._t(call.now)))

    def device_get_enforced_power_limit(self, call: Call, _handle: object, limit: object) -> int:
        """mW: the lowest of the management limit and any other limiter (nvml.h), here an out-of-band cap."""
        return self._store_uint(limit, round(self.profile.enforced_limit_w(call.device) * 1000))

    def device_get_power_management_limit(self, _call: Call, _handle: object, limit: object) -> int:
        """mW: the limit the power management algorithm is asked to hold (the default: nobody changed it)."""
        return self._store_uint(limit, round(self.profile.power_limit_w * 1000))

    def device_get_performance_state(self, call: Call, _handle: object, pstate: object) -> int:
        return self._store_uint(pstate, self.workload.pstate(call.device))

    def device_get_clock_info(self, call: Call, _handle: object, clock_type: object, mhz: object) -> int:
        which = as_int(clock_type)
        if not 0 <= which < c.NVML_CLOCK_COUNT:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(mhz, self.workload.clocks_mhz(call.device, self._t(call.now))[which])

    def device_get_clock_event_reasons(self, call: Call, _handle: object, reasons: object) -> int:
        """The same bitmask under both names (``...ClocksEventReasons`` and the older ``...ThrottleReasons``)."""
        return self._store_uint(reasons, self.workload.clock_event_reasons(call.device, self._t(call.now)))

    def _fan_percent(self, call: Call) -> int:
        temperature = self.workload.temperature_c(call.device, self._t(call.now))
        return min(100, max(30, round(30 + (temperature - 40) * 1.6)))

    def device_get_fan_speed(self, call: Call, _handle: object, speed: object) -> int:
        if self.profile.fan_count == 0:
            return c.NVML_ERROR_NOT_SUPPORTED
        return self._store_uint(speed, self._fan_percent(call))

    def device_get_fan_speed_v2(self, call: Call, _handle: object, fan: object, speed: object) -> int:
        if self.profile.fan_count == 0:
            return c.NVML_ERROR_NOT_SUPPORTED
        if not 0 <= as_int(fan) < self.profile.fan_count:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(speed, self._fan_percent(call))

    # Video engines and throttle time

    def _video(self, call: Call, engines: int, percent: int, utilization: object, period: object) -> int:
        """(busy %, sampling period in µs); NOT_SUPPORTED without the engine or on a GPU in MIG mode."""
        if engines == 0 or self.usage.mig.enabled(call.device):
            return c.NVML_ERROR_NOT_SUPPORTED
        self._store_uint(utilization, percent)
        return self._store_uint(period, VIDEO_SAMPLING_PERIOD_US)

    def device_get_encoder_utilization(self, call: Call, _handle: object, utilization: object, period: object) -> int:
        percent = self.workload.encoder_pct(call.device, self._t(call.now))
        return self._video(call, self.profile.nvenc_count, percent, utilization, period)

    def device_get_decoder_utilization(self, call: Call, _handle: object, utilization: object, period: object) -> int:
        percent = self.workload.decoder_pct(call.device, self._t(call.now))
        return self._video(call, self.profile.nvdec_count, percent, utilization, period)

    def device_get_violation_status(self, call: Call, _handle: object, policy: object, violation: object) -> int:
        """``nvmlViolationTime_t``: the call's CPU time in µs and the policy's cumulative violation time in ns."""
        which = as_int(policy)
        if not 0 <= which < c.NVML_PERF_POLICY_COUNT:
            return c.NVML_ERROR_INVALID_ARGUMENT
        if which not in VIOLATION_REASONS or which not in self.profile.violation_policies:
            return c.NVML_ERROR_NOT_SUPPORTED
        out = target(violation)
        out.referenceTime = math.floor(call.now * 1e6)
        out.violationTime = self.workload.violation_ns(call.device, which, self._t(call.now))
        return _OK

    # PCIe

    def device_get_curr_pcie_generation(self, call: Call, _handle: object, generation: object) -> int:
        return self._store_uint(generation, self.workload.pcie_link_generation(call.device))

    def device_get_curr_pcie_width(self, call: Call, _handle: object, width: object) -> int:
        return self._store_uint(width, self.workload.pcie_link_width(call.device))

    def device_get_pcie_replay_counter(self, call: Call, _handle: object, count: object) -> int:
        return self._store_uint(count, self.health.pcie_replays(call.device, self._t(call.now)))

    def device_get_pcie_throughput(self, call: Call, _handle: object, counter: object, kb_per_s: object) -> int:
        """Mean rate over the 20 ms before the call returns, in NVML's "KB/s", taken as KiB/s (1024 bytes/s).

        nvml.h says only "KB/s"; nvdash reads that KB as 1024 bytes everywhere (see the README's units note), as
        nvitop does, and this fake answers in the same unit so that one choice holds end to end.
        """
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
        return self._store_uint(kb_per_s, math.floor(rate / 1024))

    # Memory errors

    def device_get_total_ecc_errors(
        self, call: Call, _handle: object, error_type: object, counter_type: object, count: object
    ) -> int:
        kind, counter = as_int(error_type), as_int(counter_type)
        if kind not in (c.NVML_MEMORY_ERROR_TYPE_CORRECTED, c.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            return c.NVML_ERROR_INVALID_ARGUMENT
        if counter not in (c.NVML_VOLATILE_ECC, c.NVML_AGGREGATE_ECC):
            return c.NVML_ERROR_INVALID_ARGUMENT
        value = self.health.ecc_errors(
            call.device,
            uncorrected=kind == c.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            aggregate=counter == c.NVML_AGGREGATE_ECC,
            t=self._t(call.now),
        )
        return self._store_uint(count, value)

    def device_get_remapped_rows(
        self, call: Call, _handle: object, corrected: object, uncorrected: object, pending: object, failure: object
    ) -> int:
        """Ampere and later; older GPUs retire pages instead and answer NOT_SUPPORTED."""
        if not self.profile.row_remapping:
            return c.NVML_ERROR_NOT_SUPPORTED
        rows = self.health.remapped_rows(call.device, self._t(call.now))
        for out, value in zip((corrected, uncorrected, pending, failure), rows, strict=True):
            self._store_uint(out, int(value))
        return _OK

    def _retired_pages(
        self, call: Call, cause: object, count: object, addresses: object, timestamps: object = None
    ) -> int:
        """Page retirement (pre-Ampere): the size query and the filled-in list, as NVML documents both."""
        if self.profile.row_remapping:
            return c.NVML_ERROR_NOT_SUPPORTED
        which = as_int(cause)
        if which not in (
            c.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            c.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            return c.NVML_ERROR_INVALID_ARGUMENT
        pages = self.health.retired_pages(call.device, which, self._t(call.now))
        size = target(count)
        if size.value < len(pages):
            size.value = len(pages)
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        size.value = len(pages)
        if not pages:
            return _OK
        if addresses is None:
            return c.NVML_ERROR_INVALID_ARGUMENT
        address_out, time_out = target(addresses), None if timestamps is None else target(timestamps)
        for i, (address, retired_at) in enumerate(pages):
            address_out[i] = address
            if time_out is not None:
                time_out[i] = retired_at
        return _OK

    def device_get_retired_pages(
        self, call: Call, _handle: object, cause: object, count: object, addresses: object
    ) -> int:
        return self._retired_pages(call, cause, count, addresses)

    def device_get_retired_pages_v2(
        self, call: Call, _handle: object, cause: object, count: object, addresses: object, timestamps: object = None
    ) -> int:
        """pynvml's size query passes no ``timestamps`` at all (the C library then never reads it)."""
        return self._retired_pages(call, cause, count, addresses, timestamps)

    def device_get_retired_pages_pending(self, call: Call, _handle: object, state: object) -> int:
        if self.profile.row_remapping:
            return c.NVML_ERROR_NOT_SUPPORTED
        pending = self.health.retirement_pending(call.device, self._t(call.now))
        return self._store_uint(state, c.NVML_FEATURE_ENABLED if pending else c.NVML_FEATURE_DISABLED)

    # NVLink

    def _nvlink_check(self, link: object) -> int:
        if self.profile.nvlink_links == 0:
            return c.NVML_ERROR_NOT_SUPPORTED
        if not 0 <= as_int(link) < self.profile.nvlink_links:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return _OK

    def device_get_nvlink_state(self, call: Call, _handle: object, link: object, active: object) -> int:
        code = self._nvlink_check(link)
        if code != _OK:
            return code
        return self._store_uint(active, int(self.health.nvlink_active(call.device, as_int(link))))

    def device_get_nvlink_version(self, _call: Call, _handle: object, link: object, version: object) -> int:
        """``nvmlNvlinkVersion_t``: an enum (5 = NVLink 3.1, 6 = 4.0, 7 = 5.0), not a version number."""
        code = self._nvlink_check(link)
        return code if code != _OK else self._store_uint(version, self.profile.nvlink_version)

    def _switch_link(self, link: object) -> int:
        code = self._nvlink_check(link)
        if code == _OK and not self.profile.nvswitch_buses:
            return c.NVML_ERROR_NOT_SUPPORTED
        return code

    def device_get_nvlink_remote_pci_info(self, _call: Call, _handle: object, link: object, pci: object) -> int:
        """The NVSwitch chip at the far end of ``link`` (an NVSwitch is itself a PCIe device)."""
        code = self._switch_link(link)
        if code != _OK:
            return code
        bus = self.profile.nvswitch_buses[self.profile.nvswitch_of(as_int(link))]
        _fill_pci(target(pci), bus, 0, self.profile.nvswitch_pci_device_id, 0)
        return _OK

    def device_get_nvlink_remote_device_type(self, _call: Call, _handle: object, link: object, kind: object) -> int:
        code = self._switch_link(link)
        return code if code != _OK else self._store_uint(kind, c.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    def device_get_nvlink_capability(
        self, _call: Call, _handle: object, link: object, capability: object, result: object
    ) -> int:
        code = self._nvlink_check(link)
        if code != _OK:
            return code
        which = as_int(capability)
        if which not in _NVLINK_CAPABILITIES:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(result, _NVLINK_CAPABILITIES[which])

    def device_get_nvlink_error_counter(
        self, call: Call, _handle: object, link: object, counter: object, value: object
    ) -> int:
        code = self._nvlink_check(link)
        if code != _OK:
            return code
        which = as_int(counter)
        if not 0 <= which < c.NVML_NVLINK_ERROR_COUNT:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self._store_uint(value, self.health.nvlink_errors(call.device, as_int(link), which, self._t(call.now)))

    # Field values

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
        return _OK

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
            value = self.counters.pcie_bytes(device, series, t)
        elif field_id in (c.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, c.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            code = self._nvlink_check(scope)
            if code != _OK:
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
        elif field_id == c.NVML_FI_DEV_NVLINK_GET_SPEED:
            # MBps per link (nvml.h: "NVLink Speed in MBps"); the link is the scope id; an inactive link is 0.
            # A profile without a speed (0) is a driver that does not answer the field.
            code = self._nvlink_check(scope)
            if code != _OK:
                return code
            if not profile.nvlink_speed_mbps:
                return c.NVML_ERROR_NOT_SUPPORTED
            entry.valueType = c.NVML_VALUE_TYPE_UNSIGNED_INT
            value = profile.nvlink_speed_mbps if self.health.nvlink_active(device, scope) else 0
        elif c.NVML_FI_DEV_PERF_POLICY_POWER <= field_id <= c.NVML_FI_DEV_PERF_POLICY_RELIABILITY:
            # The perf policy counters: NVML's violation time in ns (what nvmlDeviceGetViolationStatus, which NVML
            # deprecates in their favour, answers as violationTime).
            policy = field_id - c.NVML_FI_DEV_PERF_POLICY_POWER
            if field_id in self.unanswered_fields or policy not in VIOLATION_REASONS:
                return c.NVML_ERROR_NOT_SUPPORTED
            if policy not in self.profile.violation_policies:
                return c.NVML_ERROR_NOT_SUPPORTED
            value = self.workload.violation_ns(device, policy, t)
        elif field_id == c.NVML_FI_DEV_MEMORY_TEMP:
            if not profile.temperature_memory_max_c:
                return c.NVML_ERROR_NOT_SUPPORTED
            entry.valueType = c.NVML_VALUE_TYPE_UNSIGNED_INT
            value = self.workload.memory_temperature_c(device, t)
        else:
            return c.NVML_ERROR_NOT_SUPPORTED
        entry.value.ullVal = value
        return _OK

    # GPM

    def gpm_sample_alloc(self, _call: Call, sample: object) -> int:
        store_address(sample, self.gpm.alloc())
        return _OK

    def gpm_sample_free(self, _call: Call, sample: object) -> int:
        return self.gpm.free(address_of(sample))

    def gpm_sample_get(self, call: Call, _handle: object, sample: object) -> int:
        if not self.profile.gpm_supported:
            return c.NVML_ERROR_NOT_SUPPORTED
        return self.gpm.fill(address_of(sample), call.device, self._t(call.now))

    def gpm_mig_sample_get(self, call: Call, _handle: object, gpu_instance_id: object, sample: object) -> int:
        """A sample of one GPU instance: NOT_SUPPORTED without GPM, INVALID_ARGUMENT for an id that names no GPU
        instance of the GPU (or MIG mode off)."""
        if not self.profile.gpm_supported:
            return c.NVML_ERROR_NOT_SUPPORTED
        instance = as_int(gpu_instance_id)
        if not self.usage.mig.instance_indexes(call.device, instance):
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self.gpm.fill(address_of(sample), call.device, self._t(call.now), instance)

    def _instance_sm_shares(self, device: int, gpu_instance: int, t: float) -> list[float] | None:
        """``sm_share`` of each process running in the GPU instance and busy at ``t`` (a process idle until later
        counts 0); None when the instance no longer exists."""
        indexes = self.usage.mig.instance_indexes(device, gpu_instance)
        if not indexes:
            return None
        return [spec.sm_share if spec.busy_at(t) else 0.0
                for spec in self.usage.running(device) if spec.mig in indexes]

    def gpm_metrics_get(self, _call: Call, metrics_get: object) -> int:
        """``nvmlGpmMetricsGet_t``: each requested metric over the interval between the two samples (of one GPU, or
        of one GPU instance: see :func:`~nvdash.sampling.fake.gpm.mig_metric_value`)."""
        out = target(metrics_get)
        if out.version != c.NVML_GPM_METRICS_GET_VERSION:
            return c.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first, second = self.gpm.taken(address_of(out.sample1)), self.gpm.taken(address_of(out.sample2))
        n = out.numMetrics
        if first is None or second is None or first[:2] != second[:2] or second[2] <= first[2]:
            return c.NVML_ERROR_INVALID_ARGUMENT
        if n > len(out.metrics):
            return c.NVML_ERROR_INVALID_ARGUMENT
        device, gpu_instance, t1, t2 = first[0], first[1], first[2], second[2]
        shares = None if gpu_instance is None else self._instance_sm_shares(device, gpu_instance, t2)
        if gpu_instance is not None and shares is None:
            return c.NVML_ERROR_INVALID_ARGUMENT
        for i in range(n):
            metric = out.metrics[i]
            if shares is None:
                value = metric_value(self.workload, device, metric.metricId, t1, t2)
            else:
                value = mig_metric_value(self.workload, device, shares, metric.metricId, t1=t1, t2=t2)
            metric.nvmlReturn = c.NVML_ERROR_NOT_SUPPORTED if value is None else _OK
            metric.value = 0.0 if value is None else value
        return _OK

    # Events

    def device_get_supported_event_types(self, _call: Call, _handle: object, event_types: object) -> int:
        return self._store_uint(event_types, SUPPORTED_EVENT_TYPES)

    def event_set_create(self, _call: Call, event_set: object) -> int:
        store_address(event_set, self.events.create())
        return _OK

    def device_register_events(self, call: Call, _handle: object, event_types: object, event_set: object) -> int:
        address = address_of(event_set)
        if address is None:
            return c.NVML_ERROR_INVALID_ARGUMENT
        return self.events.register(address, call.device, as_int(event_types))

    def event_set_wait(self, _call: Call, event_set: object, data: object, timeout_ms: object) -> int:
        """Blocks (without any library lock) until an event is due or the timeout passes."""
        address = address_of(event_set)
        if address is None:
            return c.NVML_ERROR_INVALID_ARGUMENT
        result = self.events.wait(address, as_int(timeout_ms))
        if not isinstance(result, Event):
            return result
        out = target(data)
        store_pointer_field(out, "device", ctypes.addressof(self._handle_storage[result.device]))
        out.eventType = result.event_type
        out.eventData = result.data
        out.gpuInstanceId = c.NVML_INSTANCE_ID_NONE
        out.computeInstanceId = c.NVML_INSTANCE_ID_NONE
        return _OK

    def event_set_free(self, _call: Call, event_set: object) -> int:
        address = address_of(event_set)
        return c.NVML_ERROR_INVALID_ARGUMENT if address is None else self.events.free(address)
