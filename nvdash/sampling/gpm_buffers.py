"""What GPU-wide and per-MIG-instance GPM readings share: pairs of sample buffers, and the metrics between two samples.

NVML computes GPM metrics from two samples (``nvmlGpmMetricsGet``); a reader alternates between two buffers per GPU
(or per GPU instance), allocated once with ``nvmlGpmSampleAlloc`` and freed with ``nvmlGpmSampleFree``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from nvdash.sampling.nvml_device import NvmlCaller

K = TypeVar("K", bound=Hashable)


class BufferPairs(Generic[K]):
    """Two GPM sample buffers per key, allocated on first use; thread-safe (reads run on pool threads while ``close``
    may run: what a read allocated while ``close`` ran is freed, not kept)."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._pairs: dict[K, list[Any]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, key: K) -> list[Any] | None:
        """The key's two buffers, allocating them on first use; ``None`` once closed."""
        with self._lock:
            pair = self._pairs.get(key)
            if pair is not None or self._closed:
                return pair
        made: list[Any] = []
        try:
            for _ in range(2):
                made.append(self._caller.call(self._caller.nvml.nvmlGpmSampleAlloc))
        except BaseException:
            self._free(made)
            raise
        with self._lock:
            if not self._closed:
                return self._pairs.setdefault(key, made)
        self._free(made)
        return None

    def forget(self, gone: Callable[[K], bool]) -> list[K]:
        """Free the buffers of every key ``gone`` accepts; the keys freed."""
        with self._lock:
            keys = [key for key in self._pairs if gone(key)]
            pairs = [self._pairs.pop(key) for key in keys]
        for pair in pairs:
            self._free(pair)
        return keys

    def close(self) -> None:
        """Free every buffer (errors ignored: NVML may already be shut down); later ``get`` calls allocate none."""
        with self._lock:
            held, self._pairs, self._closed = list(self._pairs.values()), {}, True
        for pair in held:
            self._free(pair)

    def _free(self, buffers: list[Any]) -> None:
        nvml = self._caller.nvml
        for buffer in buffers:
            with contextlib.suppress(nvml.NVMLError):
                self._caller.call(nvml.nvmlGpmSampleFree, buffer)


def other(pair: list[Any], previous: Any) -> Any:
    """The buffer of ``pair`` that does not hold the previous sample."""
    return pair[0] if previous is not pair[0] else pair[1]


def metrics_between(caller: NvmlCaller, previous: Any, current: Any, metric_ids: Sequence[int]) -> list[float | None]:
    """Each metric over the interval between two samples, clamped to 0-100 %; ``None`` where NVML does not answer
    it. Raises what ``nvmlGpmMetricsGet`` raises."""
    nvml = caller.nvml
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metric_ids)
    request.sample1 = previous
    request.sample2 = current
    for slot, metric_id in enumerate(metric_ids):
        request.metrics[slot].metricId = metric_id
    answer = caller.call(nvml.nvmlGpmMetricsGet, request)
    values: list[float | None] = []
    for slot in range(len(metric_ids)):
        metric = answer.metrics[slot]
        ok = metric.nvmlReturn == nvml.NVML_SUCCESS
        values.append(min(max(float(metric.value), 0.0), 100.0) if ok else None)
    return values
