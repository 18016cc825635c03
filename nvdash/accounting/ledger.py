"""Adding up the owners' shares of each GPU over time: GPU-seconds allocated and busy, energy, memory, activity,
and the seconds lost to the power cap and to thermal slowdown (see :mod:`nvdash.accounting.throttle`).

Each reading closes an interval since the previous one; the interval goes to the owners of the reading that closes
it (NVML's utilization is an average over the time before the reading, as is the energy counter's difference).
An interval longer than ``max_gap_s`` (the server was stopped, the machine suspended) is not counted: nvdash
cannot tell who held the GPU meanwhile.

Tallies are kept per hour (of the reading that closes the interval), so that a range of hours can be added up
later from stored tallies; an hour is the accounting's resolution.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nvdash.accounting.attribution import Owner, Share
from nvdash.accounting.energy import MJ_PER_J, interval_energy_mj
from nvdash.accounting.throttle import interval_violation_s, share_pct
from nvdash.sampling.records import GpuSample

DEFAULT_MAX_GAP_S = 60.0
"""The longest interval between readings that is still counted."""
HOUR_S = 3600.0


def hour_of(time_s: float) -> float:
    """The start of the (UTC) hour holding ``time_s``: the bucket its interval is counted in."""
    return math.floor(time_s / HOUR_S) * HOUR_S


@dataclass
class Tally:
    """What one owner used of one GPU. Seconds are GPU-seconds (a share of a GPU counts its fraction)."""

    start_s: float
    end_s: float
    allocated_s: float = 0.0
    busy_s: float = 0.0
    """Allocated seconds in which the unit's utilization was over 0."""
    activity_known_s: float = 0.0
    """Allocated seconds with a utilization reading (efficiency is ``busy_s`` over this)."""
    utilization_s: float = 0.0
    """Utilization (0-1) integrated over the known seconds: the mean is ``utilization_s / activity_known_s``."""
    sm_active_s: float = 0.0
    sm_known_s: float = 0.0
    energy_j: float = 0.0
    energy_known_s: float = 0.0
    memory_byte_s: float = 0.0
    memory_known_s: float = 0.0
    peak_memory_bytes: int | None = None
    power_cap_s: float = 0.0
    """GPU-seconds in which the power cap held the clocks down (the GPU's violation time, times the fraction)."""
    power_cap_known_s: float = 0.0
    """Allocated seconds over which the power-cap counter was read (the share's denominator)."""
    thermal_s: float = 0.0
    """As ``power_cap_s``, for thermal slowdown."""
    thermal_known_s: float = 0.0

    def add(self, share: Share, time_s: float, seconds: float, energy_mj: int | None, *,
            power_cap_s: float | None = None, thermal_s: float | None = None) -> None:
        """Count ``seconds`` of the GPU ending at ``time_s`` for ``share``: the GPU's energy and the seconds its
        clocks were held down by the power cap and by heat in them (``None``: unknown)."""
        gpu_seconds = seconds * share.fraction
        self.end_s = max(self.end_s, time_s)
        self.allocated_s += gpu_seconds
        if share.utilization_pct is not None:
            self.activity_known_s += gpu_seconds
            self.utilization_s += gpu_seconds * share.utilization_pct / 100.0
            if share.utilization_pct > 0:
                self.busy_s += gpu_seconds
        if share.sm_active_pct is not None:
            self.sm_known_s += gpu_seconds
            self.sm_active_s += gpu_seconds * share.sm_active_pct / 100.0
        if energy_mj is not None:
            self.energy_known_s += gpu_seconds
            self.energy_j += energy_mj * share.fraction / MJ_PER_J
        if share.memory_bytes is not None:
            self.memory_known_s += gpu_seconds
            self.memory_byte_s += gpu_seconds * share.memory_bytes
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, share.memory_bytes)
        if power_cap_s is not None:
            self.power_cap_known_s += gpu_seconds
            self.power_cap_s += power_cap_s * share.fraction
        if thermal_s is not None:
            self.thermal_known_s += gpu_seconds
            self.thermal_s += thermal_s * share.fraction

    def merge(self, other: Tally) -> None:
        """Add ``other`` (another GPU's, or another owner's) to this tally."""
        self.start_s = min(self.start_s, other.start_s)
        self.end_s = max(self.end_s, other.end_s)
        for name in ("allocated_s", "busy_s", "activity_known_s", "utilization_s", "sm_active_s", "sm_known_s",
                     "energy_j", "energy_known_s", "memory_byte_s", "memory_known_s", "power_cap_s",
                     "power_cap_known_s", "thermal_s", "thermal_known_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.peak_memory_bytes is not None:
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, other.peak_memory_bytes)

    @property
    def wasted_s(self) -> float:
        """Allocated seconds known to be idle (utilization 0)."""
        return self.activity_known_s - self.busy_s

    @property
    def energy_complete(self) -> bool:
        """Whether the energy counter was read over all of the allocated time."""
        return self.energy_known_s >= self.allocated_s * (1 - 1e-9)

    @property
    def efficiency(self) -> float | None:
        """Busy over allocated (where utilization was known), 0-1; ``None`` with no reading."""
        return self.busy_s / self.activity_known_s if self.activity_known_s else None

    @property
    def mean_utilization_pct(self) -> float | None:
        return 100.0 * self.utilization_s / self.activity_known_s if self.activity_known_s else None

    @property
    def mean_sm_active_pct(self) -> float | None:
        return 100.0 * self.sm_active_s / self.sm_known_s if self.sm_known_s else None

    @property
    def mean_memory_bytes(self) -> float | None:
        return self.memory_byte_s / self.memory_known_s if self.memory_known_s else None

    @property
    def power_cap_pct(self) -> float | None:
        """The share of the GPU time lost to the power cap, in percent (``None``: never read)."""
        return share_pct(self.power_cap_s, self.power_cap_known_s)

    @property
    def thermal_pct(self) -> float | None:
        """The share of the GPU time lost to thermal slowdown, in percent (``None``: never read)."""
        return share_pct(self.thermal_s, self.thermal_known_s)


Key = tuple[Owner, int, float]
"""A tally's owner, GPU index and hour (see :func:`hour_of`)."""


@dataclass
class Ledger:
    """Tallies per (owner, GPU index, hour), fed one reading at a time."""

    max_gap_s: float = DEFAULT_MAX_GAP_S
    tallies: dict[Key, Tally] = field(default_factory=dict)
    running: dict[Owner, Tally] = field(default_factory=dict)
    """Per owner, everything counted since the ledger started (all GPUs, all hours): never drained nor forgotten,
    the running totals ``/metrics`` exports as counters."""
    _last_time_s: float | None = None
    _last_energy_mj: dict[int, int | None] = field(default_factory=dict)
    _last_violation_ns: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    """Per GPU, the power-cap and thermal counters of the last reading."""

    def step(self, time_s: float, gpus: Sequence[GpuSample], shares: Iterable[Share]) -> None:
        """Count the interval that the reading at ``time_s`` closes for ``shares`` (its owners)."""
        previous = self._last_time_s
        if previous is not None and time_s <= previous:
            return  # a reading out of order (the clock stepped back): skipped
        energies = {gpu.index: None if gpu.lost else gpu.energy_mj for gpu in gpus}
        deltas = {index: interval_energy_mj(self._last_energy_mj.get(index), energy)
                  for index, energy in energies.items()}
        violations = {gpu.index: (None, None) if gpu.lost else (gpu.violation_power_ns, gpu.violation_thermal_ns)
                      for gpu in gpus}
        before_violations, self._last_violation_ns = self._last_violation_ns, violations
        self._last_energy_mj = energies
        self._last_time_s = time_s
        if previous is None or time_s - previous > self.max_gap_s:
            return
        seconds = time_s - previous
        lost: dict[int, dict[str, float | None]] = {}
        for index, (power, thermal) in violations.items():
            power_before, thermal_before = before_violations.get(index, (None, None))
            lost[index] = {"power_cap_s": interval_violation_s(power_before, power, seconds),
                           "thermal_s": interval_violation_s(thermal_before, thermal, seconds)}
        hour = hour_of(time_s)
        for share in shares:
            if share.fraction <= 0.0:
                continue  # an allocated owner that used none of a shared unit: nothing to count
            key = (share.owner, share.gpu_index, hour)
            tally = self.tallies.get(key)
            if tally is None:
                tally = self.tallies[key] = Tally(start_s=previous, end_s=time_s)
            tally.add(share, time_s, seconds, deltas.get(share.gpu_index), **lost.get(share.gpu_index, {}))
            running = self.running.get(share.owner)
            if running is None:
                running = self.running[share.owner] = Tally(start_s=previous, end_s=time_s)
            running.add(share, time_s, seconds, deltas.get(share.gpu_index), **lost.get(share.gpu_index, {}))

    def drain(self) -> dict[Key, Tally]:
        """The tallies so far, handed over; the ledger starts again from nothing (the next reading still counts
        the interval since the last one)."""
        tallies, self.tallies = self.tallies, {}
        return tallies

    def restore(self, tallies: dict[Key, Tally]) -> None:
        """Take back drained tallies (they could not be stored), adding them to what was counted since."""
        for key, tally in tallies.items():
            mine = self.tallies.get(key)
            if mine is None:
                self.tallies[key] = tally
            else:
                mine.merge(tally)

    def forget_before(self, hour_s: float) -> None:
        """Drop the tallies of hours before ``hour_s`` (kept in memory only, past their retention)."""
        self.tallies = {key: tally for key, tally in self.tallies.items() if key[2] >= hour_s}
