"""Plain, typed, unit-carrying records that every layer above the hardware speaks.

A metric a device does not support (or could not be read this time) is ``None``, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvdash.sampling.notebook_records import NotebookView
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.usage_records import Usage


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What does not change while a GPU is attached: identity, capacity and link maxima."""

    index: int
    name: str
    uuid: str
    memory_total_bytes: int | None
    pcie_generation: int | None
    pcie_width: int | None
    pcie_max_bytes_per_s: float | None
    """Per direction: the maximum link generation's lane rate times the maximum width."""
    nvlink_links: int
    """Active NVLink links; 0 on a GPU without NVLink."""
    nvlink_max_bytes_per_s: float | None
    """The usable data rate per direction, summed over the active links (H100: 18 x 25 GB/s = 450 GB/s); ``None``
    without NVLink. Percentages of the NVLink maximum are of this figure."""
    pci_bus_id: str = ""
    """NVML's bus id, e.g. ``00000000:18:00.0``."""
    minor_number: int | None = None
    """The N of ``/dev/nvidiaN`` (``nvmlDeviceGetMinorNumber``); DRA drivers name GPUs by it. ``None``: unknown."""
    nvlink_version: str | None = None
    """Decoded from NVML's ``nvmlNvlinkVersion_t`` enum, e.g. ``"4.0"``; ``None`` without NVLink."""
    nvlink_link_bytes_per_s: float | None = None
    """One link's usable data rate per direction, from the NVLink version (NVLink 3/4: 25 GB/s, 5: 50 GB/s)."""
    nvlink_link_signalling_bytes_per_s: float | None = None
    """One link's signalling rate per direction, as the driver's speed field (``NVML_FI_DEV_NVLINK_GET_SPEED``)
    gives it (H100: 26.5625 GB/s); above the data rate by the link's encoding overhead. ``None`` when the driver
    does not answer."""
    nvlink_signalling_max_bytes_per_s: float | None = None
    """``nvlink_link_signalling_bytes_per_s`` summed over the active links (H100: 478 GB/s); ``None`` when unknown."""
    nvlink_active_links: tuple[int, ...] = ()
    """The ids of the links that were up at start."""
    nvlink_to_switch: bool = False
    """Whether the links lead to NVSwitches (every link NVML knows is then meant to be up)."""
    nvlink_speed_from_driver: bool = False
    """Whether the driver answered its speed field (``NVML_FI_DEV_NVLINK_GET_SPEED``), which gives
    ``nvlink_link_signalling_bytes_per_s``."""
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    temperature_gpu_max_c: float | None = None
    """The GPU's own maximum operating temperature (``NVML_TEMPERATURE_THRESHOLD_GPU_MAX``)."""
    temperature_memory_max_c: float | None = None
    power_default_limit_w: float | None = None
    power_min_limit_w: float | None = None
    power_max_limit_w: float | None = None
    clock_graphics_max_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    clock_memory_max_mhz: float | None = None
    clock_video_max_mhz: float | None = None
    fan_count: int | None = None
    """Fans NVML reports (0 on passively cooled boards); ``None`` when NVML cannot say."""
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None
    """ECC mode after the next reboot."""
    memory_error_mechanism: str | None = None
    """``"row remapping"`` (Ampere and later), ``"page retirement"`` (older), or ``None``."""
    gpm_supported: bool = False
    """Whether ``nvmlGpmQueryDeviceSupport`` says GPU performance metrics are available (Hopper and later)."""

    @property
    def has_nvlink(self) -> bool:
        """True when at least one NVLink link is active."""
        return self.nvlink_links > 0


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. A lost GPU has ``lost=True`` and no values."""

    index: int
    lost: bool = False
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    memory_reserved_bytes: int | None = None
    """Driver-reserved memory (``nvmlMemory_v2_t.reserved``); ``memory_used_bytes`` excludes it."""
    memory_temperature_c: float | None = None
    fan_speed_pct: float | None = None
    """The first fan's intended speed, 0-100 % of its maximum."""
    power_limit_w: float | None = None
    """The enforced power limit (``nvmlDeviceGetEnforcedPowerLimit``, DCGM's ``ENFORCED_POWER_LIMIT``): the lowest
    of the management limit and any other cap (a board or system limit), so it can be below the next field."""
    power_management_limit_w: float | None = None
    """The management limit that was requested (``nvmlDeviceGetPowerManagementLimit``, DCGM's ``POWER_MGMT_LIMIT``)."""
    energy_mj: int | None = None
    """Total energy since the driver was loaded (a counter, in millijoules)."""
    pstate: int | None = None
    """Performance state 0 (fastest) to 15; ``None`` when unknown."""
    clock_graphics_mhz: float | None = None
    clock_sm_mhz: float | None = None
    clock_memory_mhz: float | None = None
    clock_video_mhz: float | None = None
    clock_event_reasons: int | None = None
    """NVML's ``nvmlClocksEventReason*`` bitmask (decode with ``nvdash.health.clock_events``)."""
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    pcie_generation_current: int | None = None
    pcie_width_current: int | None = None
    pcie_replay_count: int | None = None
    nvlink_partial: bool = False
    """True when some active links did not answer: the NVLink rates are then a lower bound."""
    nvlinks: tuple[NvLinkSample, ...] = ()
    """Per-link state and error counters (read at the slow cadence); empty without NVLink."""
    gpm_sm_active_pct: float | None = None
    gpm_sm_occupancy_pct: float | None = None
    gpm_tensor_active_pct: float | None = None
    gpm_dram_active_pct: float | None = None
    gpm_graphics_active_pct: float | None = None
    """Share of time the graphics/compute engine was busy (GPM ``NVML_GPM_METRIC_GRAPHICS_UTIL``), 0-100."""
    memory_utilization_pct: float | None = None
    """Share of time device memory was read or written (``nvmlUtilization_t.memory``), 0-100; not capacity."""
    gpm_fp64_active_pct: float | None = None
    """Share of time the SMs did non-tensor FP64 math (GPM ``NVML_GPM_METRIC_FP64_UTIL``), 0-100."""
    gpm_fp32_active_pct: float | None = None
    """Share of time the SMs did non-tensor FP32 math (GPM ``NVML_GPM_METRIC_FP32_UTIL``), 0-100."""
    gpm_fp16_active_pct: float | None = None
    """Share of time the SMs did non-tensor FP16 math (GPM ``NVML_GPM_METRIC_FP16_UTIL``), 0-100."""
    encoder_utilization_pct: float | None = None
    """Video encoder busy share over the driver's sampling period (``nvmlDeviceGetEncoderUtilization``), 0-100."""
    decoder_utilization_pct: float | None = None
    """Video decoder busy share over the driver's sampling period (``nvmlDeviceGetDecoderUtilization``), 0-100."""
    violation_power_ns: int | None = None
    """Time clocks were held below the requested ones by the power cap, since the driver loaded
    (``nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER).violationTime``, a counter in ns)."""
    violation_thermal_ns: int | None = None
    """As ``violation_power_ns``, for thermal slowdown (``NVML_PERF_POLICY_THERMAL``)."""
    violation_sync_boost_ns: int | None = None
    """As ``violation_power_ns``, for sync boost (``NVML_PERF_POLICY_SYNC_BOOST``)."""
    violation_board_limit_ns: int | None = None
    """As ``violation_power_ns``, for the board limit (``NVML_PERF_POLICY_BOARD_LIMIT``)."""
    violation_low_utilization_ns: int | None = None
    """As ``violation_power_ns``, for low utilization (``NVML_PERF_POLICY_LOW_UTILIZATION``)."""
    violation_reliability_ns: int | None = None
    """As ``violation_power_ns``, for board reliability (``NVML_PERF_POLICY_RELIABILITY``)."""
    nvlink_crc_flit_errors: int | None = None
    """The links' CRC flit error counters summed (DCGM's ``NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL``); per link in
    ``nvlinks``. ``None`` without NVLink or when no link answered."""
    nvlink_crc_data_errors: int | None = None
    """As ``nvlink_crc_flit_errors``, for CRC data errors."""
    nvlink_replay_errors: int | None = None
    """As ``nvlink_crc_flit_errors``, for replay errors."""
    nvlink_recovery_errors: int | None = None
    """As ``nvlink_crc_flit_errors``, for recovery errors."""
    error: str | None = None
    """Why this sweep has no reading for the GPU (an unexpected failure), else ``None``."""


@dataclass(frozen=True, slots=True)
class NvLinkSample:
    """One NVLink link: whether it is up, and its error counters where the driver reports them."""

    link: int
    active: bool | None = None
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """Something that happened, not a level: an XID, an ECC increment, a throttling episode, a link change.

    ``kind`` is one of ``EVENT_KINDS``; ``code`` is the XID number for ``"xid"``; ``severity`` is
    ``"info"``, ``"warning"`` or ``"critical"``.
    """

    time_s: float
    gpu_index: int | None
    kind: str
    message: str
    severity: str = "info"
    code: int | None = None
    counter: str | None = None
    """For a counter increment, which counter rose (``"corrected ECC errors"``); else ``None``."""


EVENT_KINDS = ("xid", "ecc", "remap", "throttle", "link", "pcie", "lost", "health")


@dataclass(frozen=True, slots=True)
class HostInfo:
    """The machine the server runs on."""

    hostname: str
    cpu_count: int
    memory_total_bytes: int


@dataclass(frozen=True, slots=True)
class HostSample:
    """One reading of the host. Rates are ``None`` until two readings exist."""

    cpu_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    disk_read_bytes_per_s: float | None = None
    disk_write_bytes_per_s: float | None = None
    net_sent_bytes_per_s: float | None = None
    net_recv_bytes_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything read in one sampler tick. ``time_s`` is wall-clock seconds since the epoch."""

    time_s: float
    gpus: tuple[GpuSample, ...]
    host: HostSample
    usage: Usage | None = None
    """Who uses the GPUs (processes, pods, MIG), read at its own slower cadence; the latest is carried in every
    snapshot. ``None`` before the first reading or when process collection is off."""
    shares: tuple[UnitShares, ...] = ()
    """How each GPU (or MIG instance) divides among the pods, containers and processes on it, as of this snapshot
    (SM shares from the latest process reading, energy counted up to this snapshot); empty without usage."""
    notebooks: NotebookView | None = None
    """This Jupyter server's kernels joined to the GPU processes (as of the latest process reading); ``None`` when
    nvdash was not given a kernels file (it was not started by Jupyter) or process readings are off."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """What the server found at start: the host, the GPUs, and why there are none if so."""

    host: HostInfo
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None
    nvml_error: str | None = None
    """A plain explanation when NVML could not be used (library missing, driver not loaded)."""
    simulated: str | None = None
    """The simulation profile's name, or ``None`` on real hardware."""
    topology: tuple[tuple[str, ...], ...] = ()
    """``topology[i][j]``: how GPU i reaches GPU j, as ``nvidia-smi topo -m`` writes it (``X``, ``NV18``,
    ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``); empty when NVML could not say."""

    @property
    def has_gpus(self) -> bool:
        """True when at least one GPU was found."""
        return bool(self.gpus)

    @property
    def has_nvlink(self) -> bool:
        """True when at least one GPU has an active NVLink link."""
        return any(gpu.has_nvlink for gpu in self.gpus)
