"""Reading values out of snapshots: ``None`` becomes NaN (a gap), never zero."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from nvdash.sampling.records import GpuInfo, GpuSample, Snapshot

FloatArray = npt.NDArray[np.float64]


def nan_if_none(value: float | None) -> float:
    """The value as a float, NaN when unknown."""
    return math.nan if value is None else float(value)


def gpu_sample(snapshot: Snapshot | None, index: int) -> GpuSample | None:
    """The sample of GPU ``index`` in ``snapshot``, or ``None`` when the GPU is absent from it."""
    if snapshot is None:
        return None
    gpus = snapshot.gpus
    if index < len(gpus) and gpus[index].index == index:
        return gpus[index]
    return next((sample for sample in gpus if sample.index == index), None)


def time_ms(rows: Sequence[Snapshot]) -> FloatArray:
    """Snapshot times as epoch milliseconds, Bokeh's datetime unit."""
    return np.fromiter((row.time_s * 1000.0 for row in rows), dtype=np.float64, count=len(rows))


def column(rows: Sequence[Snapshot], value: Callable[[Snapshot], float | None]) -> FloatArray:
    """One value per snapshot, NaN where unknown (numpy turns ``None`` into NaN for a float array)."""
    return np.array([value(row) for row in rows], dtype=np.float64)


def gpu_value(index: int, metric: Callable[[GpuSample], float | None]) -> Callable[[Snapshot], float | None]:
    """Reads ``metric`` of GPU ``index`` from a snapshot; unknown when the GPU is absent or lost."""

    def read(snapshot: Snapshot) -> float | None:
        sample = gpu_sample(snapshot, index)
        return None if sample is None or sample.lost else metric(sample)

    return read


def total(*values: float | None) -> float | None:
    """The sum, unknown when any part is unknown."""
    if any(value is None for value in values):
        return None
    return sum(value for value in values if value is not None)


def gpu_memory_total(info: GpuInfo, sample: GpuSample | None) -> int | None:
    """The GPU's own memory total: the sample's when it reports one, else the inventory's."""
    if sample is not None and sample.memory_total_bytes is not None:
        return sample.memory_total_bytes
    return info.memory_total_bytes


def gpu_reading(snapshot: Snapshot | None, index: int) -> tuple[GpuSample | None, bool]:
    """``(sample, lost)``: the GPU's usable sample (``None`` when absent or lost) and whether it is lost."""
    sample = gpu_sample(snapshot, index)
    if sample is not None and sample.lost:
        return None, True
    return sample, False


def largest(values: Iterable[float | None]) -> float | None:
    """The largest known value, ``None`` when none is known (an axis maximum then follows the data)."""
    known = [value for value in values if value is not None]
    return max(known) if known else None
