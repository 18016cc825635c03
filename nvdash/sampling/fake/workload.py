"""A seeded, deterministic training workload that drives the fake GPUs' readings.

Every reading is a pure function of (profile, seed, GPU, seconds since the library was created). The job
is synchronous data-parallel training: each step loads a batch over PCIe (an RX burst), computes, and
ends with an all-reduce over NVLink (TX/RX bursts); every ``cycle`` ends with a data-loader stall during
which the GPUs wait. Byte rates are piecewise constant on 10 ms slots, so a cumulative counter is the
exact integral of its rate: a per-cycle table of prefix sums plus a closed-form sum over whole cycles.

Power, clocks and clock event reasons are per-slot tables too: about one compute step in six draws more
than the enforced power limit and is held at it (SwPowerCap, lower clock); a GPU capped below its management
limit (``Scenario.power_caps``) is held at the cap in most compute steps. The energy counter is the exact integral
of the reported power. A GPU with thermal episodes (see ``profiles``) swaps in throttled power and clock
tables during each episode's windows; episodes repeat every whole number of cycles, so their effect on
the energy integral is the same for each episode and the counter stays O(1) to read.

Violation counters (``nvmlDeviceGetViolationStatus``) are the exact time integral of their clock event reason
bits (``VIOLATION_REASONS``), from the same per-slot reasons, counted in whole nanoseconds so that they never
step back. The video engines and the GPM FP pipes are per-slot percentages like the others.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Literal

from . import constants as c
from .profiles import Profile, pcie_bytes_per_s

Series = Literal["pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"]
SERIES: tuple[Series, ...] = ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")

SLOT_S = 0.01
"""Rates are constant within each slot of this many seconds."""
_MODULATION_AMPLITUDES = (0.05, 0.03)
_G_MAX = 1.0 + sum(_MODULATION_AMPLITUDES)
_LINK_SPREAD = 0.06
_MIB = 1024 * 1024
_GIB = 1024 * _MIB
_HEAVY_STEP_SHARE = 1 / 6
_THERMAL_PERIOD_S = 120.0
_RAMP_SLOTS = 1500
"""The temperature climbs to the GPU max operating temperature over 15 s before an episode."""
_SW_SLOTS = 200
_HW_SLOTS = 1000
_EPISODE_SLOTS = _SW_SLOTS + _HW_SLOTS + _SW_SLOTS
_COOL_TAU_S = 4.0
_SW_CLOCK_FACTOR = 0.85
_HW_CLOCK_FACTOR = 0.45
"""HW slowdown cuts the clocks by a factor of 2 or more (nvml.h)."""
_SW_POWER_SHARE = 0.8
_HW_POWER_SHARE = 0.4
"""Share of the power above idle that is left during SW / HW slowdown."""
_THERMAL_BITS = c.NVML_CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN
_HW_BITS = (
    c.NVML_CLOCKS_EVENT_REASON_HW_SLOWDOWN
    | c.NVML_CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN
    | c.NVML_CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN
)
GPM_PERCENT_METRICS = (
    c.NVML_GPM_METRIC_GRAPHICS_UTIL,
    c.NVML_GPM_METRIC_SM_UTIL,
    c.NVML_GPM_METRIC_SM_OCCUPANCY,
    c.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    c.NVML_GPM_METRIC_DRAM_BW_UTIL,
    c.NVML_GPM_METRIC_FP64_UTIL,
    c.NVML_GPM_METRIC_FP32_UTIL,
    c.NVML_GPM_METRIC_FP16_UTIL,
)
"""GPM metrics the workload models as percentages of the sampled interval."""
_FP_METRICS = (c.NVML_GPM_METRIC_FP64_UTIL, c.NVML_GPM_METRIC_FP32_UTIL, c.NVML_GPM_METRIC_FP16_UTIL)
SLOT_NS = 10_000_000
"""``SLOT_S`` in nanoseconds."""
VIOLATION_REASONS = {
    c.NVML_PERF_POLICY_POWER: c.NVML_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    c.NVML_PERF_POLICY_THERMAL: c.NVML_CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN
    | c.NVML_CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN,
    c.NVML_PERF_POLICY_SYNC_BOOST: c.NVML_CLOCKS_EVENT_REASON_SYNC_BOOST,
    c.NVML_PERF_POLICY_BOARD_LIMIT: c.NVML_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    c.NVML_PERF_POLICY_LOW_UTILIZATION: c.NVML_CLOCKS_EVENT_REASON_GPU_IDLE,
    c.NVML_PERF_POLICY_RELIABILITY: 0,
}
"""``nvmlPerfPolicyType_t`` -> the clock event reason bits during which the fake's violation time accrues: power
while SwPowerCap holds the clocks, thermal while a SW or HW thermal slowdown does, board limit while the
board's external power brake does, low utilization while the GPU idles; the fake never sets the sync boost
bit and has no reliability limiter, so those two stay at 0."""
VIDEO_SAMPLING_PERIOD_US = 167_000
"""The window the encoder/decoder utilization covers (``samplingPeriodUs``); the figure drivers commonly report."""


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
class _SlotSeries:
    """A per-slot value over one cycle and its prefix integral (value x seconds)."""

    values: tuple[float, ...]
    prefix: tuple[float, ...]

    def integral(self, position: float) -> float:
        """Integral from 0 to ``position`` (in slots, repeating the cycle)."""
        cycle_slots = len(self.values)
        cycle, within = divmod(max(position, 0.0), cycle_slots)
        slot = min(int(within), cycle_slots - 1)
        fraction = within - slot
        return cycle * self.prefix[-1] + self.prefix[slot] + fraction * SLOT_S * self.values[slot]


def _series(values: list[float]) -> _SlotSeries:
    return _SlotSeries(values=tuple(values), prefix=_prefix(values))


@dataclass(frozen=True)
class _Thermal:
    """One GPU's thermal episodes: throttled power tables and their energy deltas against the base."""

    first_slot: int
    period_slots: int
    sw_power_mw: tuple[int, ...]
    hw_power_mw: tuple[int, ...]
    sw_delta: _SlotSeries
    hw_delta: _SlotSeries

    def windows(self) -> tuple[tuple[int, int, _SlotSeries, str], ...]:
        """(start, end, energy delta, phase) of each window, in slots from the episode start."""
        sw, hw = self.sw_delta, self.hw_delta
        return (
            (0, _SW_SLOTS, sw, "sw"),
            (_SW_SLOTS, _SW_SLOTS + _HW_SLOTS, hw, "hw"),
            (_SW_SLOTS + _HW_SLOTS, _EPISODE_SLOTS, sw, "sw"),
        )

    def locate(self, position: float) -> tuple[int, float]:
        """(episode index, slots since its start); the index is -1 before the first episode."""
        index, offset = divmod(position - self.first_slot, self.period_slots)
        return int(index), offset

    def phase(self, position: float) -> str | None:
        """``"sw"``/``"hw"`` inside an episode window, else None."""
        index, offset = self.locate(position)
        if index < 0:
            return None
        for start, end, _, phase in self.windows():
            if start <= offset < end:
                return phase
        return None

    def energy_delta_mj(self, position: float) -> float:
        """How much the throttled windows before ``position`` changed the energy integral."""
        index, offset = self.locate(position)
        if index < 0:
            return 0.0
        whole = sum(d.integral(self.first_slot + b) - d.integral(self.first_slot + a) for a, b, d, _ in self.windows())
        start = self.first_slot + index * self.period_slots
        partial = sum(
            d.integral(start + min(offset, b)) - d.integral(start + a) for a, b, d, _ in self.windows() if offset > a
        )
        return index * whole + partial


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
    power_mw: tuple[int, ...]
    power: _SlotSeries
    graphics_mhz: tuple[int, ...]
    reasons: tuple[int, ...]
    gpm: dict[int, _SlotSeries]
    thermal: _Thermal | None
    boot_energy_mj: float
    memory_temperature_offset_c: float
    encoder: _SlotSeries
    decoder: _SlotSeries


@dataclass(frozen=True)
class _Indicator:
    """A 0/1 value per slot over a repeating span and its prefix count, integrated in whole nanoseconds."""

    values: tuple[int, ...]
    prefix: tuple[int, ...]

    @classmethod
    def of(cls, values: list[int]) -> _Indicator:
        prefix = [0]
        for value in values:
            prefix.append(prefix[-1] + value)
        return cls(tuple(values), tuple(prefix))

    def ns(self, position: float) -> int:
        """Nanoseconds with the value 1 between 0 and ``position`` (in slots, repeating the span)."""
        span = len(self.values)
        cycle, within = divmod(max(position, 0.0), span)
        slot = min(int(within), span - 1)
        fraction = min(within - slot, 1.0)
        whole = int(cycle) * self.prefix[-1] + self.prefix[slot]
        return whole * SLOT_NS + math.floor(fraction * SLOT_NS) * self.values[slot]


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
    pcie_max = pcie_bytes_per_s(profile.pcie_generation, profile.pcie_width_of(gpu)) / _G_MAX
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
    health_rng = _rng("power", profile.name, seed, gpu)
    power_mw, graphics_mhz, reasons = _power_tables(
        profile, timing, gpu, in_job=in_job, util=util, factors=power, rng=health_rng
    )
    gpm = _gpm_tables(in_job, timing, util, mem_util, _rng("gpm", profile.name, seed, gpu))
    gpm |= _fp_tables(profile, gpm[c.NVML_GPM_METRIC_SM_UTIL].values, _rng("gpm-fp", profile.name, seed, gpu))
    encoder, decoder = _video_tables(profile, timing, in_job, _rng("video", profile.name, seed, gpu))
    thermal = _thermal_tables(profile, timing, gpu, power_mw)
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
        power_mw=power_mw,
        power=_series([float(p) for p in power_mw]),
        graphics_mhz=graphics_mhz,
        reasons=reasons,
        gpm=gpm,
        thermal=thermal,
        boot_energy_mj=health_rng.uniform(5e8, 5e10),
        memory_temperature_offset_c=health_rng.uniform(4.0, 8.0),
        encoder=encoder,
        decoder=decoder,
    )


def quantize_clock(profile: Profile, mhz: float) -> int:
    """The supported graphics clock at or below ``mhz`` (clocks step down from the maximum)."""
    top = profile.clock_max_mhz[c.NVML_CLOCK_GRAPHICS]
    if mhz >= top:
        return top
    steps = math.ceil((top - mhz) / profile.clock_step_mhz - 1e-9)
    return math.floor(top - steps * profile.clock_step_mhz)


def _power_tables(
    profile: Profile,
    timing: _Timing,
    gpu: int,
    *,
    in_job: bool,
    util: list[int],
    factors: list[float],
    rng: random.Random,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Per-slot power (mW), graphics clock (MHz) and clock event reasons of one GPU over one cycle.

    The work asks for power in proportion to the management limit (the board's rating); the draw is held at the
    enforced limit, which a cap outside the driver may put lower.
    """
    demand_limit = profile.power_limit_w
    limit = profile.enforced_limit_w(gpu)
    top = profile.clock_max_mhz[c.NVML_CLOCK_GRAPHICS]
    heavy = [
        rng.uniform(1.08, 1.15) if rng.random() < _HEAVY_STEP_SHARE else 1.0
        for _ in range(timing.cycle // timing.step + 1)
    ]
    power: list[int] = []
    clock: list[int] = []
    reasons: list[int] = []
    for slot, (u, factor) in enumerate(zip(util, factors, strict=True)):
        load = math.pow(u / 100.0, 1.3)
        watts = (profile.power_idle_w + (0.97 * demand_limit - profile.power_idle_w) * load) * factor
        if not in_job:
            power.append(round(watts * 1000))
            clock.append(profile.clock_idle_mhz[c.NVML_CLOCK_GRAPHICS])
            reasons.append(c.NVML_CLOCKS_EVENT_REASON_GPU_IDLE)
            continue
        if slot < timing.busy:
            watts *= heavy[slot // timing.step]
        if watts >= limit:
            power.append(round(limit * rng.uniform(0.985, 0.998) * 1000))
            clock.append(quantize_clock(profile, top * math.pow(limit / watts, 0.8) - profile.clock_step_mhz))
            reasons.append(c.NVML_CLOCKS_EVENT_REASON_SW_POWER_CAP)
        else:
            power.append(round(watts * 1000))
            clock.append(top)
            reasons.append(0)
    return tuple(power), tuple(clock), tuple(reasons)


def _thermal_tables(profile: Profile, timing: _Timing, gpu: int, power_mw: tuple[int, ...]) -> _Thermal | None:
    first_s = profile.scenario.thermal(gpu)
    if first_s is None:
        return None
    idle_mw = profile.power_idle_w * 1000

    def throttled(share: float) -> tuple[int, ...]:
        return tuple(round(min(p, idle_mw + (p - idle_mw) * share)) for p in power_mw)

    sw, hw = throttled(_SW_POWER_SHARE), throttled(_HW_POWER_SHARE)
    return _Thermal(
        first_slot=round(first_s / SLOT_S),
        period_slots=max(1, round(_THERMAL_PERIOD_S / (timing.cycle * SLOT_S))) * timing.cycle,
        sw_power_mw=sw,
        hw_power_mw=hw,
        sw_delta=_series([float(a - b) for a, b in zip(sw, power_mw, strict=True)]),
        hw_delta=_series([float(a - b) for a, b in zip(hw, power_mw, strict=True)]),
    )


def _gpm_tables(
    in_job: bool, timing: _Timing, util: list[int], mem_util: list[int], rng: random.Random
) -> dict[int, _SlotSeries]:
    """Per-slot GPM percentages: graphics activity is the utilization; SMs, warps, tensor and DRAM follow it."""
    sm: list[float] = []
    occupancy: list[float] = []
    tensor: list[float] = []
    dram: list[float] = []
    for slot, (u, m) in enumerate(zip(util, mem_util, strict=True)):
        if not in_job:
            sm.append(0.0)
            occupancy.append(0.0)
            tensor.append(0.0)
            dram.append(0.0)
        elif slot < timing.busy:
            sm.append(u * rng.uniform(0.82, 0.93))
            occupancy.append(rng.uniform(32.0, 52.0))
            tensor.append(rng.uniform(38.0, 62.0))
            dram.append(min(100.0, m * rng.uniform(1.3, 1.6)))
        else:
            sm.append(u * rng.uniform(0.4, 0.7))
            occupancy.append(u * rng.uniform(0.15, 0.5))
            tensor.append(rng.uniform(0.0, 3.0))
            dram.append(m * rng.uniform(0.8, 1.2))
    return {
        c.NVML_GPM_METRIC_GRAPHICS_UTIL: _series([float(u) for u in util]),
        c.NVML_GPM_METRIC_SM_UTIL: _series(sm),
        c.NVML_GPM_METRIC_SM_OCCUPANCY: _series(occupancy),
        c.NVML_GPM_METRIC_ANY_TENSOR_UTIL: _series(tensor),
        c.NVML_GPM_METRIC_DRAM_BW_UTIL: _series(dram),
    }


def _with_phase(reasons: int, phase: str | None) -> int:
    """A slot's reasons during a thermal window: the thermal bits replace SwPowerCap."""
    if phase is None:
        return reasons
    return (reasons & ~c.NVML_CLOCKS_EVENT_REASON_SW_POWER_CAP) | (_THERMAL_BITS if phase == "sw" else _HW_BITS)


def _fp_tables(profile: Profile, sm: tuple[float, ...], rng: random.Random) -> dict[int, _SlotSeries]:
    """Per-slot FP64/FP32/FP16 pipe activity: each a share (``Profile.math_mix``) of the SM activity."""
    tables: dict[int, _SlotSeries] = {}
    for metric, share in zip(_FP_METRICS, profile.math_mix, strict=True):
        tables[metric] = _series([_clamp(s * share * rng.uniform(0.85, 1.15), 0.0, 100.0) for s in sm])
    return tables


def _video_tables(
    profile: Profile, timing: _Timing, in_job: bool, rng: random.Random
) -> tuple[_SlotSeries, _SlotSeries]:
    """Per-slot NVENC and NVDEC busy percentages (0 on a GPU outside the job)."""
    busy_pct, stall_pct = profile.decode_pct
    encoder: list[float] = []
    decoder: list[float] = []
    for slot in range(timing.cycle):
        if not in_job:
            encoder.append(0.0)
            decoder.append(0.0)
            continue
        mean = busy_pct if slot < timing.busy else stall_pct
        decoder.append(_clamp(mean * rng.uniform(0.8, 1.2), 0.0, 100.0))
        encoder.append(_clamp(profile.encode_pct * rng.uniform(0.5, 1.5), 0.0, 100.0))
    return _series(encoder), _series(decoder)


class Workload:
    """Readings of every GPU of ``profile`` at ``t`` seconds after the simulation started (t < 0 is 0)."""

    def __init__(self, profile: Profile, seed: int) -> None:
        self.profile = profile
        self.seed = seed
        self._cache: dict[int, _GpuTables] = {}
        self._violations: dict[tuple[int, int], tuple[_Indicator, _Indicator | None]] = {}

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

    def _position(self, t: float) -> float:
        return max(t, 0.0) / SLOT_S

    def _base_temperature(self, tables: _GpuTables, t: float) -> float:
        profile = self.profile
        base = profile.temperature_idle_c + tables.temperature_offset_c
        if not tables.in_job:
            return base
        _, slot, _ = self._slot(t)
        warm_up = 1.0 - math.exp(-max(t, 0.0) / 45.0)
        span = profile.temperature_load_c - profile.temperature_idle_c
        return base + span * warm_up * tables.heat[slot] / 100.0

    def _temperature(self, gpu: int, t: float) -> float:
        tables = self._tables(gpu)
        base = self._base_temperature(tables, t)
        thermal = tables.thermal
        if thermal is None:
            return base
        profile = self.profile
        hot, slow = float(profile.temperature_gpu_max_c), float(profile.temperature_slowdown_c)
        index, offset = thermal.locate(self._position(t))
        if offset >= thermal.period_slots - _RAMP_SLOTS:
            x = (offset - (thermal.period_slots - _RAMP_SLOTS)) / _RAMP_SLOTS
            return base + max(hot - base, 0.0) * x * x
        if index < 0:
            return base
        if offset < _SW_SLOTS:
            return hot + 1 + (slow - hot - 1) * offset / _SW_SLOTS
        if offset < _SW_SLOTS + _HW_SLOTS:
            return slow + round(math.sin(offset / 37.0))
        if offset < _EPISODE_SLOTS:
            x = (offset - _SW_SLOTS - _HW_SLOTS) / _SW_SLOTS
            return max(hot + 1, slow - 1 - (slow - hot - 2) * x)
        cooled = math.exp(-(offset - _EPISODE_SLOTS) * SLOT_S / _COOL_TAU_S)
        return base + max(hot - base, 0.0) * cooled

    def temperature_c(self, gpu: int, t: float) -> int:
        """GPU die temperature: follows smoothed utilization, warming up over the first minute."""
        return round(self._temperature(gpu, t))

    def memory_temperature_c(self, gpu: int, t: float) -> int:
        """HBM temperature: a few degrees above the die, kept below the memory's max operating temperature."""
        offset = self._tables(gpu).memory_temperature_offset_c
        return round(min(self._temperature(gpu, t) + offset, self.profile.temperature_memory_max_c - 2))

    def thermal_phase(self, gpu: int, t: float) -> str | None:
        """``"sw"`` or ``"hw"`` while ``gpu`` is in a thermal slowdown window, else None."""
        thermal = self._tables(gpu).thermal
        return None if thermal is None else thermal.phase(self._position(t))

    def power_mw(self, gpu: int, t: float) -> int:
        """Board power in milliwatts: idle draw plus a share of the headroom that grows with utilization."""
        tables = self._tables(gpu)
        _, slot, _ = self._slot(t)
        thermal = tables.thermal
        phase = None if thermal is None else thermal.phase(self._position(t))
        if thermal is not None and phase is not None:
            return (thermal.sw_power_mw if phase == "sw" else thermal.hw_power_mw)[slot]
        return tables.power_mw[slot]

    def energy_mj(self, gpu: int, t: float) -> int:
        """Energy since driver load: a boot offset plus the exact integral of ``power_mw`` (mW x s = mJ)."""
        tables = self._tables(gpu)
        position = self._position(t)
        energy = tables.boot_energy_mj + tables.power.integral(position)
        if tables.thermal is not None:
            energy += tables.thermal.energy_delta_mj(position)
        return math.floor(energy)

    def pstate(self, gpu: int) -> int:
        """P0 for GPUs in the job (a CUDA context holds them there), P8 for idle ones."""
        return c.NVML_PSTATE_0 if self._tables(gpu).in_job else c.NVML_PSTATE_8

    def clocks_mhz(self, gpu: int, t: float) -> tuple[int, int, int, int]:
        """Current (graphics, SM, memory, video) clocks."""
        profile = self.profile
        tables = self._tables(gpu)
        if not tables.in_job:
            return profile.clock_idle_mhz
        _, slot, _ = self._slot(t)
        graphics = tables.graphics_mhz[slot]
        phase = self.thermal_phase(gpu, t)
        if phase == "sw":
            graphics = quantize_clock(profile, graphics * _SW_CLOCK_FACTOR)
        elif phase == "hw":
            graphics = quantize_clock(profile, profile.clock_max_mhz[c.NVML_CLOCK_GRAPHICS] * _HW_CLOCK_FACTOR)
        top, _, memory, video = profile.clock_max_mhz
        video_now = max(profile.clock_idle_mhz[c.NVML_CLOCK_VIDEO], round(video * graphics / top))
        return graphics, graphics, memory, video_now

    def clock_event_reasons(self, gpu: int, t: float) -> int:
        """The ``nvmlClocksEventReason*`` bitmask that explains the current clocks."""
        tables = self._tables(gpu)
        _, slot, _ = self._slot(t)
        return _with_phase(tables.reasons[slot], self.thermal_phase(gpu, t))

    def violation_ns(self, gpu: int, policy: int, t: float) -> int:
        """Nanoseconds since the start during which a reason bit of ``policy`` (``VIOLATION_REASONS``) was set."""
        base, episodes = self._violation_tables(gpu, policy)
        position = self._position(t)
        thermal = self._tables(gpu).thermal
        if thermal is None or episodes is None or position <= thermal.first_slot:
            return base.ns(position)
        return base.ns(thermal.first_slot) + episodes.ns(position - thermal.first_slot)

    def _violation_tables(self, gpu: int, policy: int) -> tuple[_Indicator, _Indicator | None]:
        """The policy's bits over one cycle, and (on a GPU with thermal episodes) over one episode period."""
        key = (gpu, policy)
        found = self._violations.get(key)
        if found is not None:
            return found
        mask = VIOLATION_REASONS[policy]
        tables = self._tables(gpu)
        base = _Indicator.of([int(bool(reasons & mask)) for reasons in tables.reasons])
        episodes = None
        thermal = tables.thermal
        if thermal is not None:
            cycle = len(tables.reasons)
            slots = range(thermal.first_slot, thermal.first_slot + thermal.period_slots)
            episodes = _Indicator.of(
                [int(bool(_with_phase(tables.reasons[s % cycle], thermal.phase(s)) & mask)) for s in slots]
            )
        self._violations[key] = (base, episodes)
        return base, episodes

    def _video_pct(self, series: _SlotSeries, t: float) -> int:
        period_s = VIDEO_SAMPLING_PERIOD_US / 1e6
        end = self._position(t)
        start = self._position(t - period_s)
        if end <= start:
            return round(series.values[int(end) % len(series.values)])
        mean = (series.integral(end) - series.integral(start)) / ((end - start) * SLOT_S)
        return round(_clamp(mean, 0.0, 100.0))

    def encoder_pct(self, gpu: int, t: float) -> int:
        """NVENC busy share over the sampling period ending at ``t``, in whole percent."""
        return self._video_pct(self._tables(gpu).encoder, t)

    def decoder_pct(self, gpu: int, t: float) -> int:
        """NVDEC busy share over the sampling period ending at ``t``, in whole percent."""
        return self._video_pct(self._tables(gpu).decoder, t)

    def gpm_percent(self, gpu: int, metric: int, t1: float, t2: float) -> float:
        """Mean of a GPM percentage metric over [t1, t2] (``t2 > t1``)."""
        series = self._tables(gpu).gpm[metric]
        mean = (series.integral(self._position(t2)) - series.integral(self._position(t1))) / (t2 - t1)
        return _clamp(mean, 0.0, 100.0)

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

    def pcie_link_width(self, gpu: int) -> int:
        """Current PCIe width: the maximum unless the scenario has the link trained narrower."""
        return self.profile.pcie_width_of(gpu)
