"""Bottleneck hints from a window of rows, each with its evidence in words.

Input pipeline (GPUs idle while the host CPU is saturated), transfer bound (PCIe near its maximum while the GPU
is not busy), memory filling up (a least-squares trend with a time-to-full), NVLink traffic unbalanced across
GPUs. Unknown readings are left out of every average; a lost GPU gives no hint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvdash.sampling.records import GpuInfo, GpuSample, Inventory, Snapshot

WINDOW_S = 60.0
"""The rows the load hints average over."""
MEMORY_WINDOW_S = 300.0
"""The rows the memory trend is fitted over."""
MIN_ROWS = 3

CPU_SATURATED_PCT = 90.0
GPU_STARVED_PCT = 30.0
GPU_IN_USE_MEMORY_SHARE = 0.05
"""A GPU holding less than this share of its memory runs no job worth a hint."""
PCIE_NEAR_MAX_SHARE = 0.7
TRANSFER_UTIL_PCT = 50.0
MEMORY_HORIZON_S = 1800.0
"""A memory trend is reported when it would fill the GPU within this time."""
MEMORY_MIN_FIT_R2 = 0.8
MEMORY_MIN_SPAN_S = 30.0
NVLINK_MIN_SHARE = 0.05
"""The busiest GPU must move at least this share of its NVLink maximum for an imbalance to matter."""
NVLINK_UNBALANCED_RATIO = 0.5
NVLINK_BUSY_PCT = 10.0
"""GPUs whose mean utilization is below this are not computing at all: their quiet links are no imbalance."""

GiB = 1024**3


@dataclass(frozen=True, slots=True)
class Hint:
    """A likely bottleneck: ``kind`` (``input``, ``transfer``, ``memory``, ``nvlink``), the GPUs it is about, a
    sentence saying what, and the readings that led to it."""

    kind: str
    gpus: tuple[int, ...]
    text: str
    evidence: str


def _window(rows: Sequence[Snapshot], window_s: float) -> Sequence[Snapshot]:
    if not rows:
        return rows
    start = rows[-1].time_s - window_s
    first = len(rows)
    while first > 0 and rows[first - 1].time_s >= start:
        first -= 1
    return rows[first:]


def _samples(rows: Sequence[Snapshot], index: int) -> list[tuple[float, GpuSample]]:
    found = []
    for row in rows:
        sample = next((s for s in row.gpus if s.index == index), None)
        if sample is not None:
            found.append((row.time_s, sample))
    return found


def _mean(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if len(known) >= MIN_ROWS else None


def _gpu_mean(samples: Sequence[tuple[float, GpuSample]], metric: Callable[[GpuSample], float | None]) -> float | None:
    return _mean([metric(sample) for _, sample in samples])


def _lost(samples: Sequence[tuple[float, GpuSample]]) -> bool:
    return bool(samples) and samples[-1][1].lost


def _gib(value: float) -> str:
    return f"{value / GiB:.1f} GiB"


def _rate(value: float) -> str:
    return f"{value / 1e9:.1f} GB/s"


def _span(window: Sequence[Snapshot]) -> str:
    seconds = window[-1].time_s - window[0].time_s if window else 0.0
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _input_bound(inventory: Inventory, rows: Sequence[Snapshot]) -> list[Hint]:
    window = _window(rows, WINDOW_S)
    cpu = _mean([row.host.cpu_pct for row in window])
    if cpu is None or cpu < CPU_SATURATED_PCT:
        return []
    starved: list[tuple[GpuInfo, float, float]] = []
    for info in inventory.gpus:
        samples = _samples(window, info.index)
        if _lost(samples):
            continue
        util = _gpu_mean(samples, lambda s: None if s.lost else s.utilization_pct)
        used = _gpu_mean(samples, lambda s: None if s.lost else s.memory_used_bytes)
        total = info.memory_total_bytes
        if util is None or used is None or util >= GPU_STARVED_PCT:
            continue
        if total and used < GPU_IN_USE_MEMORY_SHARE * total:
            continue  # no job holds this GPU: its idleness says nothing about the host
        starved.append((info, util, used))
    if not starved:
        return []
    names = ", ".join(f"GPU {info.index}" for info, _, _ in starved)
    each = "; ".join(f"GPU {info.index} {util:.0f} % busy holding {_gib(used)}" for info, util, used in starved)
    verb = "is" if len(starved) == 1 else "are"
    return [Hint("input", tuple(info.index for info, _, _ in starved),
                 f"{names} {verb} mostly idle while the host CPU is saturated: the input pipeline (data loading, "
                 "preprocessing) may be the bottleneck",
                 f"over the last {_span(window)} the host CPU averaged {cpu:.0f} % busy; {each}")]


def _transfer_bound(inventory: Inventory, rows: Sequence[Snapshot]) -> list[Hint]:
    window = _window(rows, WINDOW_S)
    hints = []
    for info in inventory.gpus:
        maximum = info.pcie_max_bytes_per_s
        samples = _samples(window, info.index)
        if not maximum or _lost(samples):
            continue
        util = _gpu_mean(samples, lambda s: None if s.lost else s.utilization_pct)
        tx = _gpu_mean(samples, lambda s: None if s.lost else s.pcie_tx_bytes_per_s)
        rx = _gpu_mean(samples, lambda s: None if s.lost else s.pcie_rx_bytes_per_s)
        directions = [(name, rate) for name, rate in (("TX", tx), ("RX", rx)) if rate is not None]
        if util is None or not directions or util >= TRANSFER_UTIL_PCT:
            continue
        direction, rate = max(directions, key=lambda item: item[1])
        if rate < PCIE_NEAR_MAX_SHARE * maximum:
            continue
        hints.append(Hint("transfer", (info.index,),
                          f"GPU {info.index} looks transfer-bound: its PCIe link is near its maximum while the GPU "
                          "is not busy (pin host memory, overlap copies with compute, keep data on the GPU)",
                          f"over the last {_span(window)} PCIe {direction} averaged {_rate(rate)} of "
                          f"{_rate(maximum)} ({100 * rate / maximum:.0f} %) while utilization averaged {util:.0f} %"))
    return hints


def linear_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least-squares ``y = slope * x + intercept`` and its R²; ``None`` for fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return None
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx <= 0:
        return None
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    slope = sxy / sxx
    r2 = 1.0 if syy <= 0 else (sxy * sxy) / (sxx * syy)
    return slope, mean_y - slope * mean_x, r2


def _still_rising(points: Sequence[tuple[float, float]], slope: float) -> bool:
    """Whether the newer half of the window still grows at least half as fast as the whole window.

    A ramp that has reached its plateau fits a rising line over the whole window, but it is no longer filling.
    """
    middle = points[0][0] + (points[-1][0] - points[0][0]) / 2
    recent = [(t - middle, used) for t, used in points if t >= middle]
    fit = linear_fit(recent) if len(recent) >= MIN_ROWS else None
    return fit is not None and fit[0] >= slope / 2


def _memory_trend(inventory: Inventory, rows: Sequence[Snapshot]) -> list[Hint]:
    window = _window(rows, MEMORY_WINDOW_S)
    hints = []
    for info in inventory.gpus:
        samples = _samples(window, info.index)
        if _lost(samples):
            continue
        points = [(t, float(s.memory_used_bytes)) for t, s in samples
                  if not s.lost and s.memory_used_bytes is not None]
        if len(points) < MIN_ROWS or points[-1][0] - points[0][0] < MEMORY_MIN_SPAN_S:
            continue
        fit = linear_fit([(t - points[0][0], used) for t, used in points])
        last = samples[-1][1]
        total = last.memory_total_bytes if last.memory_total_bytes is not None else info.memory_total_bytes
        if fit is None or not total:
            continue
        slope, _intercept, r2 = fit
        capacity = total - (last.memory_reserved_bytes or 0)
        if slope <= 0 or r2 < MEMORY_MIN_FIT_R2 or not _still_rising(points, slope):
            continue
        seconds = max(0.0, (capacity - points[-1][1]) / slope)
        if seconds > MEMORY_HORIZON_S or math.isnan(seconds):
            continue
        when = f"in about {seconds:.0f} s" if seconds < 60 else f"in about {seconds / 60:.0f} min"
        span = points[-1][0] - points[0][0]
        hints.append(Hint("memory", (info.index,),
                          f"GPU {info.index} memory is filling up: full {when} at this rate",
                          f"{_gib(points[-1][1])} used of {_gib(capacity)} available; growing "
                          f"{slope * 60 / GiB:.2f} GiB/min over the last {span / 60:.0f} min "
                          f"(least-squares fit, R² {r2:.2f})"))
    return hints


def _nvlink_balance(inventory: Inventory, rows: Sequence[Snapshot]) -> list[Hint]:
    window = _window(rows, WINDOW_S)
    traffic: list[tuple[GpuInfo, float]] = []
    for info in inventory.gpus:
        samples = _samples(window, info.index)
        if not info.has_nvlink or _lost(samples):
            continue
        tx = _gpu_mean(samples, lambda s: None if s.lost else s.nvlink_tx_bytes_per_s)
        rx = _gpu_mean(samples, lambda s: None if s.lost else s.nvlink_rx_bytes_per_s)
        busy = _gpu_mean(samples, lambda s: None if s.lost else s.utilization_pct)
        if busy is not None and busy < NVLINK_BUSY_PCT:
            continue
        if tx is not None and rx is not None:
            traffic.append((info, tx + rx))
    if len(traffic) < 2:
        return []
    busiest, top = max(traffic, key=lambda item: item[1])
    floor = 2 * busiest.nvlink_max_bytes_per_s * NVLINK_MIN_SHARE if busiest.nvlink_max_bytes_per_s else 1e9
    quiet = [(info, rate) for info, rate in traffic if rate < NVLINK_UNBALANCED_RATIO * top]
    if top < floor or not quiet:
        return []
    names = ", ".join(f"GPU {info.index}" for info, _ in quiet)
    each = "; ".join(f"GPU {info.index} {_rate(rate)}" for info, rate in quiet)
    return [Hint("nvlink", tuple(info.index for info, _ in quiet),
                 f"NVLink traffic is unbalanced: {names} move{'s' if len(quiet) == 1 else ''} less than half of "
                 f"GPU {busiest.index}'s (a straggler, or a collective that skips them?)",
                 f"over the last {_span(window)} TX + RX averaged {_rate(top)} on GPU {busiest.index}; {each}")]


def bottleneck_hints(inventory: Inventory, rows: Sequence[Snapshot]) -> list[Hint]:
    """Every hint the newest rows support (oldest row first in ``rows``), in a fixed rule order."""
    if not rows or not inventory.gpus:
        return []
    return [*_input_bound(inventory, rows), *_transfer_bound(inventory, rows), *_memory_trend(inventory, rows),
            *_nvlink_balance(inventory, rows)]
