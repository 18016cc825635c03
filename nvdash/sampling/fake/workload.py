"""A seeded, deterministic training workload that drives the fake GPUs' readings.

Every reading is a pure function of (profile, seed, GPU, seconds since the library was created). The job
is synchronous data-parallel training: each step loads a batch over PCIe (an RX burst), computes, and
ends with an all-reduce over NVLink (TX/RX bursts); every ``cycle`` ends with a data-loader stall during
which the GPUs wait. Byte rates are piecewise constant on 10 ms slots, so a cumulative counter is the
exact integral of its rate: a per-cycle table of prefix sums plus a closed-form sum over whole cycles.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Literal

from .profiles import Profile

Series = Literal["pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"]
SERIES: tuple[Series, ...] = ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")

SLOT_S = 0.01
"""Rates are constant within each slot of this many seconds."""
_MODULATION_AMPLITUDES = (0.05, 0.03)
_G_MAX = 1.0 + sum(_MODULATION_AMPLITUDES)
_LINK_SPREAD = 0.06
_MIB = 1024 * 1024
_GIB = 1024 * _MIB


@dataclass(frozen=True)
class _Timing:
    """Step and stall layout shared by every GPU of the job, in slots."""

    step: int
    cycle: int
    busy: int
    """Slots of whole steps at the start of each cycle; the rest of the cycle is the stall."""
    load: int
    allreduce: int


@dataclass(frozen=True)
class _GpuTables:
    """One GPU's per-slot values over one cycle, with prefix sums (bytes) of each rate."""

    in_job: bool
    util: tuple[int, ...]
    mem_util: tuple[int, ...]
    heat: tuple[float, ...]
    power_factor: tuple[float, ...]
    rates: dict[str, tuple[float, ...]]
    prefix: dict[str, tuple[float, ...]]
    boot_bytes: dict[str, float]
    modulation: tuple[tuple[float, float, float], ...]
    """(amplitude, angle step, phase) of the per-cycle rate modulation g_j = 1 + sum a sin(w j + p)."""
    link_weights: tuple[float, ...]
    memory_plateau_bytes: int
    memory_ramp_s: float
    memory_wobble: tuple[float, float]
    """(amplitude in bytes, period in seconds)."""
    temperature_offset_c: float


def _rng(*key: object) -> random.Random:
    return random.Random(":".join(str(part) for part in key))


@functools.lru_cache(maxsize=32)
def _timing(profile_name: str, seed: int) -> _Timing:
    rng = _rng("timing", profile_name, seed)
    step = rng.randint(35, 60)
    cycle = rng.randint(2000, 4000)
    stall = rng.randint(200, 400)
    return _Timing(
        step=step,
        cycle=cycle,
        busy=((cycle - stall) // step) * step,
        load=rng.randint(4, 12),
        allreduce=rng.randint(4, 8),
    )


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _prefix(rates: list[float]) -> tuple[float, ...]:
    total = 0.0
    sums = [0.0]
    for rate in rates:
        total += rate * SLOT_S
        sums.append(total)
    return tuple(sums)


def _circular_ema(values: tuple[int, ...], tau_s: float) -> tuple[float, ...]:
    alpha = 1.0 - math.exp(-SLOT_S / tau_s)
    level = sum(values) / len(values)
    smoothed = [0.0] * len(values)
    for _ in range(2):
        for i, value in enumerate(values):
            level += alpha * (value - level)
            smoothed[i] = level
    return tuple(smoothed)


@functools.lru_cache(maxsize=64)
def _gpu_tables(profile: Profile, seed: int, gpu: int) -> _GpuTables:
    timing = _timing(profile.name, seed)
    rng = _rng("gpu", profile.name, seed, gpu)
    in_job = gpu not in profile.idle_gpus
    pcie_max = profile.pcie_max_bytes_per_s / _G_MAX
    spread = [1.0 + rng.uniform(-_LINK_SPREAD, _LINK_SPREAD) for _ in range(profile.nvlink_links)]
    weights = tuple(w / sum(spread) for w in spread)
    nvlink_max = profile.nvlink_link_bytes_per_s / max(weights) / _G_MAX if weights else 0.0
    rx_burst = rng.uniform(0.2, 0.45) * pcie_max
    nv_burst = rng.uniform(0.6, 0.85) * nvlink_max
    util: list[int] = []
    mem_util: list[int] = []
    power: list[float] = []
    rates: dict[str, list[float]] = {name: [] for name in SERIES}
    for slot in range(timing.cycle):
        busy = in_job and slot < timing.busy
        pos = slot % timing.step
        if busy:
            util.append(round(_clamp(rng.gauss(95.0, 2.0), 88.0, 100.0)))
            mem_util.append(round(_clamp(rng.gauss(45.0, 5.0), 30.0, 60.0)))
            rx = rx_burst * rng.uniform(0.9, 1.1) if pos < timing.load else pcie_max * rng.uniform(1e-3, 3e-3)
            tx = pcie_max * (rng.uniform(5e-3, 1e-2) if pos == timing.step - 1 else rng.uniform(5e-4, 1.5e-3))
            nv = nv_burst * rng.uniform(0.92, 1.08) if pos >= timing.step - timing.allreduce else 0.0
        elif in_job:
            util.append(round(rng.uniform(5.0, 20.0)))
            mem_util.append(round(rng.uniform(1.0, 6.0)))
            rx = pcie_max * rng.uniform(1e-4, 5e-4)
            tx = pcie_max * rng.uniform(5e-5, 2e-4)
            nv = 0.0
        else:
            util.append(0)
            mem_util.append(0)
            rx = rng.uniform(2e3, 8e3)
            tx = rng.uniform(1e3, 4e3)
            nv = 0.0
        power.append(rng.uniform(0.95, 1.03))
        rates["pcie_rx"].append(min(rx, pcie_max))
        rates["pcie_tx"].append(min(tx, pcie_max))
        rates["nvlink_tx"].append(min(nv, nvlink_max))
        rates["nvlink_rx"].append(min(nv * rng.uniform(0.97, 1.03), nvlink_max))
    total = profile.memory_total_bytes
    plateau = int(total * rng.uniform(0.62, 0.88))
    return _GpuTables(
        in_job=in_job,
        util=tuple(util),
        mem_util=tuple(mem_util),
        heat=_circular_ema(tuple(util), tau_s=4.0),
        power_factor=tuple(power),
        rates={name: tuple(values) for name, values in rates.items()},
        prefix={name: _prefix(values) for name, values in rates.items()},
        boot_bytes={name: rng.uniform(1e11, 1e13) if name.startswith("pcie") or weights else 0.0 for name in SERIES},
        modulation=tuple((a, rng.uniform(0.3, 2.5), rng.uniform(0.0, 2 * math.pi)) for a in _MODULATION_AMPLITUDES),
        link_weights=weights,
        memory_plateau_bytes=plateau,
        memory_ramp_s=rng.uniform(45.0, 75.0),
        memory_wobble=(total * rng.uniform(0.002, 0.006), rng.uniform(5.0, 9.0)),
        temperature_offset_c=rng.uniform(-2.0, 3.0),
    )


class Workload:
    """Readings of every GPU of ``profile`` at ``t`` seconds after the simulation started (t < 0 is 0)."""

    def __init__(self, profile: Profile, seed: int) -> None:
        self.profile = profile
        self.seed = seed
        self._cache: dict[int, _GpuTables] = {}

    def _tables(self, gpu: int) -> _GpuTables:
        tables = self._cache.get(gpu)
        if tables is None:
            if not 0 <= gpu < self.profile.gpu_count:
                raise IndexError(f"GPU {gpu} out of range for profile {self.profile.name}")
            tables = self._cache[gpu] = _gpu_tables(self.profile, self.seed, gpu)
        return tables

    def _slot(self, t: float) -> tuple[int, int, float]:
        """(cycle index, slot within the cycle, fraction of that slot elapsed) at ``t``."""
        cycle_slots = _timing(self.profile.name, self.seed).cycle
        position = max(t, 0.0) / SLOT_S
        cycle, within = divmod(position, cycle_slots)
        slot = int(within)
        if slot >= cycle_slots:
            return int(cycle), cycle_slots - 1, 1.0
        return int(cycle), slot, within - slot

    def utilization(self, gpu: int, t: float) -> tuple[int, int]:
        """(GPU, memory) utilization in percent."""
        tables = self._tables(gpu)
        _, slot, _ = self._slot(t)
        return tables.util[slot], tables.mem_util[slot]

    def memory_used_bytes(self, gpu: int, t: float) -> int:
        """Framebuffer in use, driver reservation included (what ``nvmlMemory_t.used`` reports)."""
        tables = self._tables(gpu)
        reserved = self.profile.memory_reserved_bytes
        if not tables.in_job:
            return reserved + 4 * _MIB
        t = max(t, 0.0)
        x = min(t / tables.memory_ramp_s, 1.0)
        ramp = x * x * (3.0 - 2.0 * x)
        amplitude, period = tables.memory_wobble
        used = _GIB + (tables.memory_plateau_bytes - _GIB) * ramp
        used += amplitude * ramp * math.sin(2 * math.pi * t / period)
        used_mib = int(used) // _MIB
        return int(_clamp(used_mib * _MIB, reserved + 4 * _MIB, self.profile.memory_total_bytes - _MIB))

    def temperature_c(self, gpu: int, t: float) -> int:
        """GPU die temperature: follows smoothed utilization, warming up over the first minute."""
        tables = self._tables(gpu)
        profile = self.profile
        base = profile.temperature_idle_c + tables.temperature_offset_c
        if not tables.in_job:
            return round(base)
        _, slot, _ = self._slot(t)
        warm_up = 1.0 - math.exp(-max(t, 0.0) / 45.0)
        span = profile.temperature_load_c - profile.temperature_idle_c
        return round(base + span * warm_up * tables.heat[slot] / 100.0)

    def power_mw(self, gpu: int, t: float) -> int:
        """Board power in milliwatts: idle draw plus a share of the headroom that grows with utilization."""
        tables = self._tables(gpu)
        profile = self.profile
        _, slot, _ = self._slot(t)
        load = math.pow(tables.util[slot] / 100.0, 1.3)
        watts = profile.power_idle_w + (0.97 * profile.power_max_w - profile.power_idle_w) * load
        return round(min(watts * tables.power_factor[slot], profile.power_max_w) * 1000)

    def _modulation(self, tables: _GpuTables, cycle: int) -> float:
        return 1.0 + sum(a * math.sin(w * cycle + p) for a, w, p in tables.modulation)

    def _modulation_sum(self, tables: _GpuTables, cycles: int) -> float:
        """Sum of the modulation g_j over j = 0 .. cycles - 1, in closed form."""
        total = float(cycles)
        for a, w, p in tables.modulation:
            total += a * math.sin(cycles * w / 2) * math.sin(p + (cycles - 1) * w / 2) / math.sin(w / 2)
        return total

    def rate_bytes_per_s(self, gpu: int, series: Series, t: float) -> float:
        """The instantaneous rate of ``series`` (NVLink: summed over links) at ``t``."""
        tables = self._tables(gpu)
        cycle, slot, _ = self._slot(t)
        return self._modulation(tables, cycle) * tables.rates[series][slot]

    def transferred_bytes(self, gpu: int, series: Series, t: float) -> float:
        """Bytes moved by ``series`` between the start and ``t``: the exact integral of its rate."""
        tables = self._tables(gpu)
        cycle, slot, fraction = self._slot(t)
        prefix = tables.prefix[series]
        within = prefix[slot] + fraction * SLOT_S * tables.rates[series][slot]
        return self._modulation_sum(tables, cycle) * prefix[-1] + self._modulation(tables, cycle) * within

    def mean_rate_bytes_per_s(self, gpu: int, series: Series, t1: float, t2: float) -> float:
        """Mean rate over [t1, t2]."""
        return (self.transferred_bytes(gpu, series, t2) - self.transferred_bytes(gpu, series, t1)) / (t2 - t1)

    def pcie_counter_bytes(self, gpu: int, series: Literal["pcie_tx", "pcie_rx"], t: float) -> int:
        """Cumulative PCIe bytes since boot, as ``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES`` reports."""
        boot = self._tables(gpu).boot_bytes[series]
        return math.floor(boot + self.transferred_bytes(gpu, series, t))

    def nvlink_counter_kib(self, gpu: int, series: Literal["nvlink_tx", "nvlink_rx"], link: int, t: float) -> int:
        """Cumulative KiB on one NVLink link since boot (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}``)."""
        tables = self._tables(gpu)
        weight = tables.link_weights[link]
        total = tables.boot_bytes[series] + self.transferred_bytes(gpu, series, t)
        return math.floor(weight * total / 1024)

    def link_weight(self, gpu: int, link: int) -> float:
        """Share of the GPU's NVLink traffic that ``link`` carries."""
        return self._tables(gpu).link_weights[link]

    def pcie_link_generation(self, gpu: int) -> int:
        """Current PCIe generation: GPUs outside the job have trained the link down to Gen1 to save power."""
        return 1 if gpu in self.profile.idle_gpus else self.profile.pcie_generation
