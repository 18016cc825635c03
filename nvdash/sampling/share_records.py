"""Records of how a shared GPU's work, power and energy divide among the pods, containers and processes on it.

A unit is a whole GPU, or one MIG instance of it. Each owner's part of the unit is its SM time from NVML's
per-process utilization samples (``nvmlDeviceGetProcessUtilization``), or for a MIG instance its processes' part of
the instance's GPM activity. Shares never add up to more than the unit's utilization: what no owner's samples
explain (processes that came and went between readings, sampling granularity) is ``unattributed``, never spread
over the owners. Power and energy follow the same split: an owner's part is ``sm_pct / utilization_pct`` of the
unit's, and the owners' parts plus the unattributed part add up to the unit's (the idle remainder is unattributed).
"""

from __future__ import annotations

from dataclasses import dataclass

OWNER_KINDS = ("pod", "container", "process")
"""Who an owner is: a pod's container (named by the kubelet), a container outside Kubernetes (by its id), or a
process outside any container (by its PID)."""


@dataclass(frozen=True, slots=True, order=True)
class ShareOwner:
    """Whose share it is."""

    kind: str
    """One of :data:`OWNER_KINDS`."""
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    """A pod's container name (``None`` when the kubelet does not say which), or a container id (12 hex digits)."""
    pid: int | None = None
    """For a process outside any container."""

    @property
    def sort_key(self) -> tuple[str, str, str, str, int]:
        """An order of owners that never compares an unknown part with a known one (the dataclass order would: a
        pod's owner whose container the kubelet did not name yet beside the same pod's named container)."""
        return (self.kind, self.namespace or "", self.pod or "", self.container or "", self.pid or 0)

    @property
    def label(self) -> str:
        """``namespace/pod/container``, ``container 0123456789ab`` or ``pid 1234``."""
        if self.kind == "pod":
            return "/".join(part for part in (self.namespace, self.pod, self.container) if part)
        if self.kind == "container":
            return f"container {self.container}"
        return f"pid {self.pid}"


@dataclass(frozen=True, slots=True)
class OwnerShare:
    """One owner's part of one unit over the last share window."""

    owner: ShareOwner
    sm_pct: float | None
    """The owner's SM time, in percent of the unit's time (0-100); ``None`` when the unit has no per-process
    utilization (then the owner holds memory only)."""
    fraction: float | None
    """The owner's part of the unit's power and energy, 0-1: ``sm_pct / utilization_pct``."""
    memory_bytes: int | None
    """GPU memory its processes hold on the unit (NVML's process lists); ``None`` when NVML cannot say."""
    power_w: float | None
    """The unit's power times ``fraction`` (a MIG instance's power is its compute slices' part of the GPU's)."""
    energy_j: float
    """Cumulative: the energy apportioned to this owner on this unit since the server started (joules)."""
    gpm_sm_active_pct: float | None
    """The unit's GPM SM activity times ``fraction``, where GPM reports it."""
    processes: int
    """Its processes on the unit."""


@dataclass(frozen=True, slots=True)
class UnitShares:
    """How one GPU (or MIG instance) divides among its owners."""

    gpu_index: int
    gpu_uuid: str
    unit: str
    """The GPU's UUID, or the MIG instance's."""
    sharing: str
    """How the unit is given out, one of :data:`~nvdash.sampling.usage_records.SHARING_KINDS` (``whole`` for a GPU,
    ``mig`` for a MIG instance, when no pod holds it)."""
    window_s: float
    """The span the SM shares are measured over (between two process readings)."""
    utilization_pct: float | None
    """The unit's mean utilization over the window (a MIG instance: its GPM graphics-engine activity)."""
    owners: tuple[OwnerShare, ...]
    unattributed_sm_pct: float | None
    """``utilization_pct`` minus the owners' SM shares (never negative)."""
    unattributed_memory_bytes: int | None
    """The unit's used memory that no listed process holds (the driver's and contexts' own, or hidden PIDs)."""
    unattributed_power_w: float | None
    unattributed_energy_j: float
    """Cumulative, as :attr:`OwnerShare.energy_j`: the unit's energy no owner's work explains, idle time included."""
    measured: bool
    """True when the SM shares come from per-process samples (or MIG GPM); False: memory only."""
