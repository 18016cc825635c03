"""GPM sample buffers (``nvmlGpmSampleAlloc``/``Get``/``Free``) and the metrics between two of them.

A sample remembers which GPU it was taken on (and which GPU instance, for ``nvmlGpmMigSampleGet``) and when;
``nvmlGpmMetricsGet`` turns two samples of the same GPU (or GPU instance) into means over the interval between them,
from the same workload every other reading comes from.

The work of a GPU instance (the fake's definition, see :func:`mig_metric_value`): the GPU's own simulated job,
scaled by how much of the instance its processes keep busy, ``min(1, sum of their sm_share)``.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from . import constants as c
from .workload import GPM_PERCENT_METRICS, Series, Workload

_MIB = 1024 * 1024
_RATE_METRICS: dict[int, Series] = {
    c.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx",
    c.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx",
    c.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx",
    c.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx",
}
"""Bandwidth metrics, in MiB/s as NVML defines them."""


@dataclass
class _Sample:
    storage: ctypes.Array[ctypes.c_char]
    device: int | None = None
    t: float = 0.0
    gpu_instance: int | None = None


class GpmSamples:
    """The sample buffers handed out so far, by address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[int, _Sample] = {}

    def alloc(self) -> int:
        """A new, empty sample buffer; its address."""
        storage = ctypes.create_string_buffer(8)
        with self._lock:
            address = ctypes.addressof(storage)
            self._samples[address] = _Sample(storage=storage)
        return address

    def free(self, address: int | None) -> int:
        """Release a buffer; NVML return code."""
        with self._lock:
            found = address is not None and self._samples.pop(address, None) is not None
        return c.NVML_SUCCESS if found else c.NVML_ERROR_INVALID_ARGUMENT

    def fill(self, address: int | None, device: int, t: float, gpu_instance: int | None = None) -> int:
        """Take a sample of ``device`` (or of its GPU instance ``gpu_instance``) at ``t``; NVML return code."""
        with self._lock:
            sample = None if address is None else self._samples.get(address)
            if sample is None:
                return c.NVML_ERROR_INVALID_ARGUMENT
            sample.device, sample.t, sample.gpu_instance = device, t, gpu_instance
        return c.NVML_SUCCESS

    def taken(self, address: int | None) -> tuple[int, int | None, float] | None:
        """(device, GPU instance id or None for the whole GPU, time) of a filled sample, or None."""
        with self._lock:
            sample = None if address is None else self._samples.get(address)
            if sample is None or sample.device is None:
                return None
            return sample.device, sample.gpu_instance, sample.t


def metric_value(workload: Workload, device: int, metric: int, t1: float, t2: float) -> float | None:
    """One GPM metric of ``device`` over [t1, t2], or None where the fake does not model it."""
    if metric in GPM_PERCENT_METRICS:
        return workload.gpm_percent(device, metric, t1, t2)
    series = _RATE_METRICS.get(metric)
    if series is None:
        return None
    if series.startswith("nvlink") and workload.profile.nvlink_links == 0:
        return None
    return workload.mean_rate_bytes_per_s(device, series, t1, t2) / _MIB


def instance_busy_fraction(sm_shares: list[float]) -> float:
    """How much of a GPU instance its processes keep busy: the sum of their ``sm_share``, at most 1."""
    return min(1.0, max(0.0, sum(sm_shares)))


def mig_metric_value(
    workload: Workload, device: int, sm_shares: list[float], metric: int, *, t1: float, t2: float
) -> float | None:
    """One GPM metric of a GPU instance over [t1, t2], or None where the fake does not model it.

    The fake's definition of an instance's work: the processes in the GPU instance (over all its compute instances)
    run the GPU's simulated job, each keeping ``sm_share`` of the instance busy, so a percentage metric is the GPU's
    own mean over [t1, t2] (``Workload.gpm_percent``) times :func:`instance_busy_fraction` of their shares (an
    instance without processes reads 0). Bandwidth metrics (PCIe, NVLink) belong to the whole GPU: None.
    """
    if metric not in GPM_PERCENT_METRICS:
        return None
    return workload.gpm_percent(device, metric, t1, t2) * instance_busy_fraction(sm_shares)
