"""One sweep's reading of one GPU: fast readings every sweep, health counters at a slower cadence."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from nvdash.sampling.gpm import GpmReader
from nvdash.sampling.nvml_device import Device, NvmlCaller, field_number
from nvdash.sampling.nvml_probe import (
    CLOCK_TYPES,
    FI_MEMORY_TEMP,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    NVLINK_THROUGHPUT_FIELDS,
)
from nvdash.sampling.nvml_temperature import gpu_temperature
from nvdash.sampling.rates import CounterRate
from nvdash.sampling.records import GpuSample, NvLinkSample

PCIE_UTIL_TX_BYTES = 0
PCIE_UTIL_RX_BYTES = 1
PCIE_THROUGHPUT_KB_BYTES = 1024
"""``nvmlDeviceGetPcieThroughput`` answers in "KB/s"; nvdash reads that KB as 1024 bytes (KiB), like NVML's
other KB-denominated figures (the NVLink throughput counters are documented in KiB)."""
ECC_COUNTERS = {
    "ecc_corrected_volatile": (0, 0),
    "ecc_uncorrected_volatile": (1, 0),
    "ecc_corrected_aggregate": (0, 1),
    "ecc_uncorrected_aggregate": (1, 1),
}
"""Sample field -> (nvmlMemoryErrorType_t, nvmlEccCounterType_t)."""
NVLINK_ERROR_COUNTERS = {"replay_errors": 0, "recovery_errors": 1, "crc_flit_errors": 2, "crc_data_errors": 3}
"""NvLinkSample field -> ``nvmlNvLinkErrorCounter_t``."""
PAGE_RETIREMENT_CAUSES = {"retired_pages_sbe": 0, "retired_pages_dbe": 1}
"""Sample field -> ``nvmlPageRetirementCause_t``."""
VIOLATION_POLICIES = {
    "violation_power_ns": 0,  # NVML_PERF_POLICY_POWER
    "violation_thermal_ns": 1,  # NVML_PERF_POLICY_THERMAL
    "violation_sync_boost_ns": 2,  # NVML_PERF_POLICY_SYNC_BOOST
    "violation_board_limit_ns": 3,  # NVML_PERF_POLICY_BOARD_LIMIT
    "violation_low_utilization_ns": 4,  # NVML_PERF_POLICY_LOW_UTILIZATION
    "violation_reliability_ns": 5,  # NVML_PERF_POLICY_RELIABILITY
}
"""Sample field -> ``nvmlPerfPolicyType_t``."""
PERF_POLICY_FIELD_FIRST = 74
"""``NVML_FI_DEV_PERF_POLICY_POWER``: the perf policy counters are fields 74 to 79 in ``nvmlPerfPolicyType_t``'s
order, each NVML's violation time in ns."""
PCIE_COUNTER_BOUND_BYTES_PER_S = 256e9
"""Above any PCIe link's rate (6.0 x16 carries about 121 GB/s per direction): a PCIe byte counter whose implied
rate exceeds it was reset, not wrapped."""
SLOW_INTERVAL_S = 5.0
"""Seconds between readings of the health counters (ECC, remapped rows, retired pages, NVLink errors) and of the
management power limit."""


class DeviceReader:
    """Reads one :class:`GpuSample` of a device through an :class:`NvmlCaller`."""

    def __init__(
        self,
        caller: NvmlCaller,
        slow_interval_s: float = SLOW_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._caller = caller
        self._nvml = caller.nvml
        self._slow_interval_s = slow_interval_s
        self._clock = clock
        self._gpm = GpmReader(caller)

    def _get(self, device: Device, metric: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._caller.optional(device, metric, fn, *args)

    def close(self) -> None:
        """Free what the reader allocated in NVML (the GPM sample buffers)."""
        self._gpm.close()

    def read(self, device: Device) -> GpuSample:
        """The device's reading now; raises ``GpuLost`` when NVML says it is gone."""
        values: dict[str, Any] = {}
        values.update(self._basics(device))
        values.update(self._counters(device))
        values.update(self._power(device))
        values.update(self._clocks(device))
        values.update(self._pcie(device))
        if device.info.gpm_supported:
            values.update(self._gpm.read(device))
        values.update(self._video(device))
        values.update(self._violations(device))
        now = self._clock()
        if now >= device.slow_due_s:
            device.slow_due_s = now + self._slow_interval_s
            device.slow_values = self._slow(device)
        values.update(device.slow_values)
        return GpuSample(index=device.index, **values)

    def _basics(self, device: Device) -> dict[str, Any]:
        nvml = self._nvml
        utilization = self._get(device, "utilization", nvml.nvmlDeviceGetUtilizationRates)
        memory = self._memory(device)
        temperature = gpu_temperature(self._caller, device)
        fan = None
        if device.info.fan_count:
            fan = self._get(device, "fan_speed", nvml.nvmlDeviceGetFanSpeed)
        reserved = getattr(memory, "reserved", None) if memory is not None else None
        return {
            "utilization_pct": float(utilization.gpu) if utilization is not None else None,
            "memory_utilization_pct": float(utilization.memory) if utilization is not None else None,
            "memory_used_bytes": int(memory.used) if memory is not None else None,
            "memory_total_bytes": int(memory.total) if memory is not None else None,
            "memory_reserved_bytes": int(reserved) if reserved is not None else None,
            "temperature_c": temperature,
            "fan_speed_pct": float(fan) if fan is not None else None,
        }

    def _memory(self, device: Device) -> Any:
        """``nvmlMemory_v2_t`` (used excludes driver-reserved memory, as nvidia-smi shows); v1 on older drivers."""
        nvml = self._nvml
        if self._caller.supported(device, "memory_v2"):
            version = getattr(nvml, "nvmlMemory_v2", None)
            if version is not None:
                v2 = functools.partial(nvml.nvmlDeviceGetMemoryInfo, version=version)
                memory = self._get(device, "memory_v2", v2)
                if memory is not None:
                    return memory
                if self._caller.supported(device, "memory_v2"):
                    return None
            else:
                device.unsupported.add("memory_v2")
        return self._get(device, "memory", nvml.nvmlDeviceGetMemoryInfo)

    def _counters(self, device: Device) -> dict[str, Any]:
        """Rates and readings from the device's field values, one call for all of them."""
        values: dict[str, Any] = {}
        fields = self._field_values(device)
        if device.pcie_counters:
            values["pcie_tx_bytes_per_s"] = fields.get((FI_PCIE_COUNT_TX_BYTES, 0))
            values["pcie_rx_bytes_per_s"] = fields.get((FI_PCIE_COUNT_RX_BYTES, 0))
        else:
            values["pcie_tx_bytes_per_s"] = self._pcie_throughput(device, PCIE_UTIL_TX_BYTES)
            values["pcie_rx_bytes_per_s"] = self._pcie_throughput(device, PCIE_UTIL_RX_BYTES)
        if device.nvlink_active:
            tx, tx_partial = sum_links(fields, FI_NVLINK_THROUGHPUT_DATA_TX, device.nvlink_active)
            rx, rx_partial = sum_links(fields, FI_NVLINK_THROUGHPUT_DATA_RX, device.nvlink_active)
            values["nvlink_tx_bytes_per_s"] = tx
            values["nvlink_rx_bytes_per_s"] = rx
            values["nvlink_partial"] = tx_partial or rx_partial
        values["memory_temperature_c"] = fields.get((FI_MEMORY_TEMP, 0))
        return values

    def _field_values(self, device: Device) -> dict[tuple[int, int], float | None]:
        """Each field's value (counters turned into rates with the values' own timestamps); None if it failed."""
        if not device.field_ids:
            return {}
        nvml = self._nvml
        answer = self._get(device, "field_values", nvml.nvmlDeviceGetFieldValues, device.field_ids)
        if answer is None:
            return {}
        result: dict[tuple[int, int], float | None] = {}
        for key, value in zip(device.field_ids, answer, strict=True):
            if value.nvmlReturn != nvml.NVML_SUCCESS:
                result[key] = None
            elif key[0] == FI_MEMORY_TEMP:
                result[key] = field_number(value)
            else:
                rate = device.rates.get(key) or device.rates.setdefault(key, counter_rate(device, key[0]))
                result[key] = rate.update(int(value.value.ullVal), value.timestamp / 1e6)
        return result

    def _pcie_throughput(self, device: Device, counter: int) -> float | None:
        metric = "pcie_throughput_tx" if counter == PCIE_UTIL_TX_BYTES else "pcie_throughput_rx"
        kb_per_s = self._get(device, metric, self._nvml.nvmlDeviceGetPcieThroughput, counter)
        return float(kb_per_s) * PCIE_THROUGHPUT_KB_BYTES if kb_per_s is not None else None

    def _power(self, device: Device) -> dict[str, Any]:
        nvml = self._nvml
        power_mw = self._get(device, "power", nvml.nvmlDeviceGetPowerUsage)
        limit_mw = self._get(device, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit)
        energy_mj = self._get(device, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption)
        pstate = self._get(device, "pstate", nvml.nvmlDeviceGetPerformanceState)
        return {
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
            "energy_mj": int(energy_mj) if energy_mj is not None else None,
            "pstate": int(pstate) if pstate is not None and 0 <= int(pstate) <= 15 else None,
        }

    def _clocks(self, device: Device) -> dict[str, Any]:
        nvml = self._nvml
        values: dict[str, Any] = {}
        for name, code in CLOCK_TYPES.items():
            mhz = self._get(device, f"clock_{name}", nvml.nvmlDeviceGetClockInfo, code)
            values[f"clock_{name}_mhz"] = float(mhz) if mhz is not None else None
        reasons = self._get(device, "clock_events", nvml.nvmlDeviceGetCurrentClocksEventReasons)
        if reasons is None and not self._caller.supported(device, "clock_events"):
            reasons = self._get(device, "clock_throttle", nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        values["clock_event_reasons"] = int(reasons) if reasons is not None else None
        return values

    def _pcie(self, device: Device) -> dict[str, Any]:
        nvml = self._nvml
        generation = self._get(device, "pcie_generation_current", nvml.nvmlDeviceGetCurrPcieLinkGeneration)
        width = self._get(device, "pcie_width_current", nvml.nvmlDeviceGetCurrPcieLinkWidth)
        replay = self._get(device, "pcie_replay", nvml.nvmlDeviceGetPcieReplayCounter)
        return {
            "pcie_generation_current": int(generation) if generation else None,
            "pcie_width_current": int(width) if width else None,
            "pcie_replay_count": int(replay) if replay is not None else None,
        }

    def _slow(self, device: Device) -> dict[str, Any]:
        """ECC, remapped rows, retired pages and per-link NVLink state and errors."""
        nvml = self._nvml
        values: dict[str, Any] = {}
        if device.info.ecc_enabled:
            for name, (error_type, counter_type) in ECC_COUNTERS.items():
                count = self._get(device, name, nvml.nvmlDeviceGetTotalEccErrors, error_type, counter_type)
                values[name] = int(count) if count is not None else None
        mechanism = device.info.memory_error_mechanism
        if mechanism == "row remapping":
            rows = self._get(device, "remapped_rows", nvml.nvmlDeviceGetRemappedRows)
            if rows is not None:
                corrected, uncorrected, pending, failure = rows
                values.update(
                    remapped_rows_corrected=int(corrected),
                    remapped_rows_uncorrected=int(uncorrected),
                    remap_pending=bool(pending),
                    remap_failure=bool(failure),
                )
        elif mechanism == "page retirement":
            for name, cause in PAGE_RETIREMENT_CAUSES.items():
                pages = self._get(device, name, nvml.nvmlDeviceGetRetiredPages, cause)
                values[name] = len(pages) if pages is not None else None
            pending = self._get(device, "retired_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus)
            values["retired_pages_pending"] = bool(pending) if pending is not None else None
        if device.nvlink_links:
            values["nvlinks"] = tuple(self._link(device, link) for link in device.nvlink_links)
        values.update(self._slow_readings(device, values.get("nvlinks", ())))
        return values

    def _video(self, device: Device) -> dict[str, Any]:
        """Encoder and decoder busy shares: levels over the driver's own sampling period, so read every sweep."""
        nvml = self._nvml
        encoder = self._get(device, "encoder_utilization", nvml.nvmlDeviceGetEncoderUtilization)
        decoder = self._get(device, "decoder_utilization", nvml.nvmlDeviceGetDecoderUtilization)
        return {
            "encoder_utilization_pct": float(encoder[0]) if encoder is not None else None,
            "decoder_utilization_pct": float(decoder[0]) if decoder is not None else None,
        }

    def _slow_readings(self, device: Device, links: tuple[NvLinkSample, ...]) -> dict[str, Any]:
        """The management power limit and NVLink error totals, at the slow cadence (the limit changes only when
        someone sets it)."""
        nvml = self._nvml
        limit_mw = self._get(device, "power_management_limit", nvml.nvmlDeviceGetPowerManagementLimit)
        values: dict[str, Any] = {"power_management_limit_w": limit_mw / 1000.0 if limit_mw is not None else None}
        for name in NVLINK_ERROR_COUNTERS:
            counts = [count for link in links if (count := getattr(link, name)) is not None]
            values[f"nvlink_{name}"] = sum(counts) if counts else None
        return values

    def _violations(self, device: Device) -> dict[str, int | None]:
        """The throttle-time counters, every sweep: NVML's perf policy fields in one field-values call, as NVML asks
        now that it deprecates ``nvmlDeviceGetViolationStatus``; that call for a field the driver does not answer.

        Every sweep, not at the slow cadence: whoever holds the GPU is charged each sweep's increase (the
        accounting), and an increase read only every few seconds would land in one sweep's interval, where no more
        than the interval can be believed."""
        nvml = self._nvml
        wanted = [name for name in VIOLATION_POLICIES if self._caller.supported(device, f"{name}_field")]
        fields: dict[str, int] = {}
        if wanted:
            ids = [(PERF_POLICY_FIELD_FIRST + VIOLATION_POLICIES[name], 0) for name in wanted]
            answer = self._get(device, "violation_fields", nvml.nvmlDeviceGetFieldValues, ids)
            if answer is None and not self._caller.supported(device, "violation_fields"):
                device.unsupported.update(f"{name}_field" for name in wanted)
            for name, value in zip(wanted, answer or (), strict=False):
                if value.nvmlReturn == nvml.NVML_SUCCESS:
                    fields[name] = int(value.value.ullVal)
                else:
                    device.unsupported.add(f"{name}_field")
        values: dict[str, int | None] = {}
        for name, policy in VIOLATION_POLICIES.items():
            if name in fields:
                values[name] = fields[name]
            elif self._caller.supported(device, f"{name}_field"):
                values[name] = None  # the field call failed this time: ask again at the next slow reading
            else:
                status = self._get(device, name, nvml.nvmlDeviceGetViolationStatus, policy)
                values[name] = int(status.violationTime) if status is not None else None
        return values

    def _link(self, device: Device, link: int) -> NvLinkSample:
        nvml = self._nvml
        state = self._link_value(device, "nvlink_state", nvml.nvmlDeviceGetNvLinkState, link)
        counters = {
            name: self._link_value(device, f"nvlink_error_{name}", nvml.nvmlDeviceGetNvLinkErrorCounter, link, code)
            for name, code in NVLINK_ERROR_COUNTERS.items()
        }
        return NvLinkSample(link=link, active=bool(state) if state is not None else None, **counters)

    def _link_value(self, device: Device, metric: str, fn: Callable[..., Any], *args: Any) -> int | None:
        value = self._get(device, metric, fn, *args)
        return int(value) if value is not None else None


def counter_rate(device: Device, field_id: int) -> CounterRate:
    """The rate keeper of one counter field: NVLink counts KiB; a PCIe byte counter can carry at most its link's
    rate (twice it, for the slack of the values' timestamps; a generous bound where the maximum is unknown)."""
    if field_id in NVLINK_THROUGHPUT_FIELDS:
        return CounterRate(scale=1024.0)
    pcie_max = device.info.pcie_max_bytes_per_s
    return CounterRate(max_rate=2 * pcie_max if pcie_max else PCIE_COUNTER_BOUND_BYTES_PER_S)


def sum_links(
    rates: dict[tuple[int, int], float | None], field_id: int, links: tuple[int, ...]
) -> tuple[float | None, bool]:
    """(sum of the per-link rates, whether some link had no rate); the sum is ``None`` when no link has one."""
    known = [rate for link in links if (rate := rates.get((field_id, link))) is not None]
    if not known:
        return None, False
    return float(sum(known)), len(known) < len(links)
