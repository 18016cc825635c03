"""Plain, typed, unit-carrying records that every layer above the hardware speaks.

A metric a device does not support (or could not be read this time) is ``None``, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """Per direction, summed over the active links; ``None`` without NVLink."""

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

    @property
    def has_gpus(self) -> bool:
        """True when at least one GPU was found."""
        return bool(self.gpus)

    @property
    def has_nvlink(self) -> bool:
        """True when at least one GPU has an active NVLink link."""
        return any(gpu.has_nvlink for gpu in self.gpus)
