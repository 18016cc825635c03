"""The families nvdash can export, by name: dcgm-exporter's names and units where DCGM has the field, ``nvdash_*``
in base units for the readings DCGM has no name for.

Each field reads one GPU's newest sample (with its inventory entry and its last XID); ``None`` leaves the GPU's
series out of that scrape, as dcgm-exporter does for a field a GPU does not support. :data:`MIG_FIELDS` read one
GPU instance of a GPU in MIG mode; the pod and process families are built by the collector from the usage reading,
the share families from the snapshot's shares, the accounting families from the accountant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvdash.sampling.records import GpuInfo, GpuSample, NvLinkSample

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuView:
    """What a field reads: the GPU's identity, its newest sample, the code of its newest XID (0: none), and the rank
    of the node's health verdict of it (``None``: not judged for this scrape)."""

    info: GpuInfo
    sample: GpuSample
    last_xid: int
    health: int | None = None


Reader = Callable[[GpuView], float | None]


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _ratio(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


def _free_mib(view: GpuView) -> float | None:
    sample = view.sample
    total = sample.memory_total_bytes if sample.memory_total_bytes is not None else view.info.memory_total_bytes
    if total is None or sample.memory_used_bytes is None:
        return None
    return (total - sample.memory_used_bytes - (sample.memory_reserved_bytes or 0)) / MIB


def _total_mib(view: GpuView) -> float | None:
    sample = view.sample
    return _mib(sample.memory_total_bytes if sample.memory_total_bytes is not None else view.info.memory_total_bytes)


def _sum(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else first + second


NVLINK_BANDWIDTH_UNIT_BYTES_PER_S = 1024 * 1000
"""One unit of ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` in bytes per second: DCGM sums NVML's per-link TX and RX KiB
counters, divides their increase by the seconds between readings and then by 1000 ("KiB/s -> MiB/s" in
``DcgmCacheManager.cpp``), so a unit is 1000 KiB/s, about a MB/s."""


def _nvlink_bandwidth_total(view: GpuView) -> float | None:
    total = _sum(view.sample.nvlink_tx_bytes_per_s, view.sample.nvlink_rx_bytes_per_s)
    return None if total is None else total / NVLINK_BANDWIDTH_UNIT_BYTES_PER_S


NVLINK_LINKS = 18
"""Links DCGM has per-link fields for: ``_L0`` to ``_L17``."""
LinkCounter = Callable[[NvLinkSample], int | None]
SumCounter = Callable[[GpuSample], int | None]
NVLINK_ERRORS: dict[str, tuple[LinkCounter, SumCounter]] = {
    "CRC_FLIT": (lambda link: link.crc_flit_errors, lambda sample: sample.nvlink_crc_flit_errors),
    "CRC_DATA": (lambda link: link.crc_data_errors, lambda sample: sample.nvlink_crc_data_errors),
    "REPLAY": (lambda link: link.replay_errors, lambda sample: sample.nvlink_replay_errors),
    "RECOVERY": (lambda link: link.recovery_errors, lambda sample: sample.nvlink_recovery_errors),
}
"""DCGM's name part for each NVLink error counter -> the counter on one link, and the sum over the links."""


def _link_counter(link: int, counter: LinkCounter) -> Reader:
    """One link's error counter; absent when the GPU has no such link or the driver did not answer for it."""

    def read(view: GpuView) -> float | None:
        for sample in view.sample.nvlinks:
            if sample.link == link:
                return _count(counter(sample))
        return None

    return read


def _sum_counter(counter: SumCounter) -> Reader:
    return lambda view: _count(counter(view.sample))


def _nvlink_error_fields() -> dict[str, Reader]:
    """DCGM's NVLink error counters: the sum over the links (``..._COUNT_TOTAL``) and, as dcgm-exporter exposes a
    GPU's per-link fields, one family per link (``..._COUNT_L0`` to ``_L17``), not a link label."""
    fields: dict[str, Reader] = {}
    for kind, (_, total) in NVLINK_ERRORS.items():
        fields[f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL"] = _sum_counter(total)
    for kind, (counter, _) in NVLINK_ERRORS.items():
        for link in range(NVLINK_LINKS):
            fields[f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}"] = _link_counter(link, counter)
    return fields


def _count(value: int | None) -> float | None:
    return None if value is None else float(value)


FIELDS: dict[str, Reader] = {
    # Utilization and memory (framebuffer sizes in MiB, as DCGM reports them).
    "DCGM_FI_DEV_GPU_UTIL": lambda v: v.sample.utilization_pct,
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda v: v.sample.memory_utilization_pct,
    "DCGM_FI_DEV_ENC_UTIL": lambda v: v.sample.encoder_utilization_pct,
    "DCGM_FI_DEV_DEC_UTIL": lambda v: v.sample.decoder_utilization_pct,
    "DCGM_FI_DEV_FB_USED": lambda v: _mib(v.sample.memory_used_bytes),
    "DCGM_FI_DEV_FB_FREE": _free_mib,
    "DCGM_FI_DEV_FB_RESERVED": lambda v: _mib(v.sample.memory_reserved_bytes),
    "DCGM_FI_DEV_FB_TOTAL": _total_mib,
    # Temperatures (°C), power (W), energy (mJ since the driver loaded).
    "DCGM_FI_DEV_GPU_TEMP": lambda v: v.sample.temperature_c,
    "DCGM_FI_DEV_MEMORY_TEMP": lambda v: v.sample.memory_temperature_c,
    "DCGM_FI_DEV_SLOWDOWN_TEMP": lambda v: v.info.temperature_slowdown_c,
    "DCGM_FI_DEV_SHUTDOWN_TEMP": lambda v: v.info.temperature_shutdown_c,
    "DCGM_FI_DEV_POWER_USAGE": lambda v: v.sample.power_w,
    # The limit requested through power management (nvmlDeviceGetPowerManagementLimit), and the one the driver
    # enforces (nvmlDeviceGetEnforcedPowerLimit): the lowest of that and any other cap, so it can be below it.
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": lambda v: v.sample.power_management_limit_w,
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": lambda v: v.sample.power_limit_w,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda v: v.sample.energy_mj,
    "DCGM_FI_DEV_FAN_SPEED": lambda v: v.sample.fan_speed_pct,
    "DCGM_FI_DEV_PSTATE": lambda v: v.sample.pstate,
    # Clocks (MHz) and the clock event ("throttle") reasons bitmask, under both of DCGM's names.
    "DCGM_FI_DEV_SM_CLOCK": lambda v: v.sample.clock_sm_mhz,
    "DCGM_FI_DEV_MEM_CLOCK": lambda v: v.sample.clock_memory_mhz,
    "DCGM_FI_DEV_VIDEO_CLOCK": lambda v: v.sample.clock_video_mhz,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": lambda v: v.sample.clock_event_reasons,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": lambda v: v.sample.clock_event_reasons,
    # Errors: the last XID, ECC counts, retired pages, remapped rows, PCIe replays and link state.
    "DCGM_FI_DEV_XID_ERRORS": lambda v: float(v.last_xid),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": lambda v: v.sample.ecc_corrected_volatile,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": lambda v: v.sample.ecc_uncorrected_volatile,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": lambda v: v.sample.ecc_corrected_aggregate,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": lambda v: v.sample.ecc_uncorrected_aggregate,
    "DCGM_FI_DEV_RETIRED_SBE": lambda v: v.sample.retired_pages_sbe,
    "DCGM_FI_DEV_RETIRED_DBE": lambda v: v.sample.retired_pages_dbe,
    "DCGM_FI_DEV_RETIRED_PENDING": lambda v: _flag(v.sample.retired_pages_pending),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda v: v.sample.remapped_rows_corrected,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda v: v.sample.remapped_rows_uncorrected,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": lambda v: _flag(v.sample.remap_pending),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda v: _flag(v.sample.remap_failure),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda v: v.sample.pcie_replay_count,
    # Time the clocks were held down, per reason: NVML's cumulative violationTime, in ns as DCGM passes it on
    # (dcgm_fields.h: "Power Violation time in ns"; DCGM reads NVML_FI_DEV_PERF_POLICY_*).
    "DCGM_FI_DEV_POWER_VIOLATION": lambda v: _count(v.sample.violation_power_ns),
    "DCGM_FI_DEV_THERMAL_VIOLATION": lambda v: _count(v.sample.violation_thermal_ns),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": lambda v: _count(v.sample.violation_sync_boost_ns),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": lambda v: _count(v.sample.violation_board_limit_ns),
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": lambda v: _count(v.sample.violation_low_utilization_ns),
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": lambda v: _count(v.sample.violation_reliability_ns),
    "DCGM_FI_DEV_PCIE_LINK_GEN": lambda v: v.sample.pcie_generation_current,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": lambda v: v.sample.pcie_width_current,
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": lambda v: v.info.pcie_generation,
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": lambda v: v.info.pcie_width,
    # Link rates: PCIe in bytes per second (DCGM's profiling fields), NVLink TX + RX in DCGM's ~MB/s units.
    "DCGM_FI_PROF_PCIE_TX_BYTES": lambda v: v.sample.pcie_tx_bytes_per_s,
    "DCGM_FI_PROF_PCIE_RX_BYTES": lambda v: v.sample.pcie_rx_bytes_per_s,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _nvlink_bandwidth_total,
    # GPM activity, as DCGM's profiling fields report it: a ratio of time, 0 to 1.
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda v: _ratio(v.sample.gpm_graphics_active_pct),
    "DCGM_FI_PROF_SM_ACTIVE": lambda v: _ratio(v.sample.gpm_sm_active_pct),
    "DCGM_FI_PROF_SM_OCCUPANCY": lambda v: _ratio(v.sample.gpm_sm_occupancy_pct),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda v: _ratio(v.sample.gpm_tensor_active_pct),
    "DCGM_FI_PROF_DRAM_ACTIVE": lambda v: _ratio(v.sample.gpm_dram_active_pct),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": lambda v: _ratio(v.sample.gpm_fp64_active_pct),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": lambda v: _ratio(v.sample.gpm_fp32_active_pct),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": lambda v: _ratio(v.sample.gpm_fp16_active_pct),
    # NVLink error counters: over all links, and per link.
    **_nvlink_error_fields(),
    # What DCGM has no name for, in base units.
    "nvdash_pcie_transmit_bytes_per_second": lambda v: v.sample.pcie_tx_bytes_per_s,
    "nvdash_pcie_receive_bytes_per_second": lambda v: v.sample.pcie_rx_bytes_per_s,
    "nvdash_pcie_max_bytes_per_second": lambda v: v.info.pcie_max_bytes_per_s,
    "nvdash_nvlink_transmit_bytes_per_second": lambda v: v.sample.nvlink_tx_bytes_per_s,
    "nvdash_nvlink_receive_bytes_per_second": lambda v: v.sample.nvlink_rx_bytes_per_s,
    "nvdash_nvlink_bytes_per_second": lambda v: _sum(v.sample.nvlink_tx_bytes_per_s, v.sample.nvlink_rx_bytes_per_s),
    "nvdash_nvlink_max_bytes_per_second": lambda v: v.info.nvlink_max_bytes_per_s,
    "nvdash_gpu_lost": lambda v: _flag(v.sample.lost),
    "nvdash_gpu_health_status": lambda v: _count(v.health),
}
"""Every per-GPU family nvdash can export, by name."""

LOST_FAMILY = "nvdash_gpu_lost"
"""1 when the GPU stopped answering."""
HEALTH_FAMILY = "nvdash_gpu_health_status"
"""The node's own health verdict of the GPU (:class:`~nvdash.health.status.Status` rank: 0 OK, 1 warning, 2
critical), the one its Health page, index page and snapshot API show."""
WHEN_LOST = frozenset((LOST_FAMILY, HEALTH_FAMILY))
"""The per-GPU families a lost GPU still has (it has no readings)."""


@dataclass(frozen=True)
class MigView:
    """What a MIG field reads: one GPU instance of a GPU in MIG mode (its compute instances merged)."""

    profile: str
    """The GPU instance profile, e.g. ``3g.20gb``."""
    gpu_instance_id: int
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    sm_active_pct: float | None
    """The GPU instance's graphics engine activity (GPM), 0-100 %."""
    gpm_sm_active_pct: float | None = None
    gpm_sm_occupancy_pct: float | None = None


MigReader = Callable[[MigView], float | None]


def _mig_free_mib(view: MigView) -> float | None:
    if view.memory_total_bytes is None or view.memory_used_bytes is None:
        return None
    return (view.memory_total_bytes - view.memory_used_bytes) / MIB


MIG_FIELDS: dict[str, MigReader] = {
    "DCGM_FI_DEV_FB_USED": lambda m: _mib(m.memory_used_bytes),
    "DCGM_FI_DEV_FB_FREE": _mig_free_mib,
    "DCGM_FI_DEV_FB_TOTAL": lambda m: _mib(m.memory_total_bytes),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda m: _ratio(m.sm_active_pct),
    "DCGM_FI_PROF_SM_ACTIVE": lambda m: _ratio(m.gpm_sm_active_pct),
    "DCGM_FI_PROF_SM_OCCUPANCY": lambda m: _ratio(m.gpm_sm_occupancy_pct),
}
"""The families a GPU instance reads for itself, with one extra series per instance (``GPU_I_PROFILE``,
``GPU_I_ID``). Device-wide readings (temperature, power, clocks, errors) stay on the GPU's own series only, so that
a sum over a GPU's series never counts them twice."""

POD_FAMILIES = ("nvdash_pod_gpu_allocated", "nvdash_pod_gpu_idle")
"""With ``--metrics-pods``: one series per allocation of a GPU or MIG instance to a pod's container."""
PROCESS_FAMILIES = ("nvdash_process_gpu_memory_bytes", "nvdash_process_sm_utilization_ratio")
"""With ``--metrics-processes``: one series per process on a GPU or MIG instance."""
ACCOUNTING_FAMILIES = ("nvdash_gpu_allocated_idle_seconds",)
"""From the accountant (a live server, not a replay): one series per GPU."""
POD_SHARE_FAMILIES = ("nvdash_pod_gpu_sm_share_ratio", "nvdash_pod_gpu_memory_bytes", "nvdash_pod_gpu_power_watts",
                      "nvdash_pod_gpu_energy_joules_total")
"""From the snapshot's shares, whenever they name pods (no option needed): one series per pod's container and GPU
(or MIG instance) it runs on, with the device's labels plus ``namespace``, ``pod``, ``container`` and ``sharing``."""
UNATTRIBUTED_FAMILIES = ("nvdash_gpu_unattributed_sm_ratio", "nvdash_gpu_unattributed_power_watts",
                         "nvdash_gpu_unattributed_energy_joules_total")
"""From the snapshot's shares: one series per GPU (or MIG instance) with shares, the device's labels only."""
SHARE_FAMILIES = (*POD_SHARE_FAMILIES, *UNATTRIBUTED_FAMILIES)
QUOTA_FAMILIES = ("nvdash_pod_gpu_core_quota_ratio", "nvdash_pod_gpu_memory_quota_bytes",
                  "nvdash_pod_gpu_quota_finding")
"""Whenever quotas are known (no option needed): each container's vGPU or MPS quota, and the quota findings
(:mod:`nvdash.health.quotas`)."""
FAMILIES = frozenset((*FIELDS, *POD_FAMILIES, *PROCESS_FAMILIES, *ACCOUNTING_FAMILIES,
                      *SHARE_FAMILIES, *QUOTA_FAMILIES))
"""Every family name nvdash can export."""
