"""The NVML source: the only module that imports ``pynvml``.

It takes the pynvml module as a parameter (``NvmlSource(nvml)``), so the fake NVML library can be installed
under the real wrapper for simulation and tests. NVML is initialised in :meth:`NvmlSource.open`, never at
import; handles are cached and each device's capabilities are learnt once. Every NVML error is handled per
metric and per device: a metric a device does not support is ``None`` from then on, a lost GPU is reported
lost while the others keep updating.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from nvdash.sampling.rates import CounterRate
from nvdash.sampling.records import GpuInfo, GpuSample

T = TypeVar("T")

# NVML field ids and enums (from nvml.h; pynvml mirrors them).
FI_NVLINK_THROUGHPUT_DATA_TX = 138
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_PCIE_COUNT_TX_BYTES = 197
FI_PCIE_COUNT_RX_BYTES = 198
PCIE_UTIL_TX_BYTES = 0
PCIE_UTIL_RX_BYTES = 1
TEMPERATURE_GPU = 0
NVLINK_MAX_LINKS = 36

# Per lane, per direction, after line encoding (bytes/s).
PCIE_LANE_BYTES_PER_S: dict[int, float] = {
    1: 2.5e9 * 8 / 10 / 8,
    2: 5e9 * 8 / 10 / 8,
    3: 8e9 * 128 / 130 / 8,
    4: 16e9 * 128 / 130 / 8,
    5: 32e9 * 128 / 130 / 8,
    6: 64e9 * 242 / 256 / 8,
}
# Per link, per direction (bytes/s), by NVLink version.
NVLINK_LINK_BYTES_PER_S: dict[int, float] = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why in plain words."""


def load_nvml() -> ModuleType:
    """Import and return the real pynvml module (from nvidia-ml-py)."""
    import pynvml  # noqa: PLC0415 - imported on demand so that importing nvdash never loads it

    module: ModuleType = pynvml
    return module


def install_library(nvml: ModuleType, lib: object) -> Callable[[], None]:
    """Make ``nvml`` (the pynvml module) call into ``lib`` instead of libnvidia-ml; returns an undo.

    pynvml looks each C function up by name on its module-global library object and caches what it found,
    so handing it an object whose attributes follow the C signatures runs the whole real wrapper.
    """
    saved_lib = nvml.nvmlLib
    saved_cache = dict(nvml._nvmlGetFunctionPointer_cache)
    setattr(nvml, "nvmlLib", lib)  # noqa: B010 - a module global of pynvml
    nvml._nvmlGetFunctionPointer_cache.clear()

    def restore() -> None:
        setattr(nvml, "nvmlLib", saved_lib)  # noqa: B010
        nvml._nvmlGetFunctionPointer_cache.clear()
        nvml._nvmlGetFunctionPointer_cache.update(saved_cache)

    return restore


def explain_init_error(nvml: ModuleType, error: Exception) -> str:
    """A plain sentence for an nvmlInit failure."""
    if isinstance(error, nvml.NVMLError_LibraryNotFound):
        return "The NVML library (libnvidia-ml.so.1) was not found: the NVIDIA driver is not installed on this machine."
    if isinstance(error, nvml.NVMLError_DriverNotLoaded):
        return "The NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded)."
    if isinstance(error, nvml.NVMLError_NoPermission):
        return "NVML refused access to the GPUs (insufficient permissions)."
    return f"NVML could not be initialised: {error}."


class _GpuLost(Exception):
    """Raised inside a device read when NVML reports the GPU lost."""


@dataclass
class _Device:
    """One GPU's cached handle, learnt capabilities and counter state."""

    index: int
    handle: Any
    info: GpuInfo
    unsupported: set[str] = field(default_factory=set)
    pcie_counters: bool = False
    nvlink_links: tuple[int, ...] = ()
    field_ids: list[tuple[int, int]] = field(default_factory=list)
    rates: dict[tuple[int, int], CounterRate] = field(default_factory=dict)
    lost: bool = False
    pending: Future[GpuSample] | None = None


class NvmlSource:
    """Reads every GPU through pynvml: static inventory once, a :class:`GpuSample` per GPU per sweep."""

    def __init__(self, nvml: ModuleType, max_workers: int = 16) -> None:
        self._nvml = nvml
        self._max_workers = max_workers
        self._devices: list[_Device] = []
        self._pool: ThreadPoolExecutor | None = None
        self._driver_version: str | None = None
        self._calls = 0
        self._calls_lock = threading.Lock()
        self._opened = False

    @property
    def calls(self) -> int:
        """How many NVML functions this source has called."""
        with self._calls_lock:
            return self._calls

    @property
    def driver_version(self) -> str | None:
        """The driver version NVML reported, once opened."""
        return self._driver_version

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        """The GPUs found by :meth:`open`."""
        return tuple(device.info for device in self._devices)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        with self._calls_lock:
            self._calls += 1
        return fn(*args)

    def open(self) -> tuple[GpuInfo, ...]:
        """Initialise NVML and learn each GPU; raises :class:`NvmlUnavailable` with a plain reason."""
        nvml = self._nvml
        try:
            self._call(nvml.nvmlInit)
        except nvml.NVMLError as error:
            raise NvmlUnavailable(explain_init_error(nvml, error)) from None
        self._opened = True
        try:
            self._driver_version = str(self._call(nvml.nvmlSystemGetDriverVersion))
        except nvml.NVMLError:
            self._driver_version = None
        try:
            count = int(self._call(nvml.nvmlDeviceGetCount))
        except nvml.NVMLError as error:
            self.close()
            raise NvmlUnavailable(f"NVML could not count the GPUs: {error}.") from None
        self._devices = [self._open_device(index) for index in range(count)]
        if self._devices:
            workers = max(1, min(self._max_workers, len(self._devices)))
            self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nvdash-nvml")
        return self.gpus

    def _open_device(self, index: int) -> _Device:
        nvml = self._nvml
        try:
            handle = self._call(nvml.nvmlDeviceGetHandleByIndex, index)
            name = str(self._call(nvml.nvmlDeviceGetName, handle))
        except nvml.NVMLError as error:
            info = GpuInfo(index, f"GPU {index} (unavailable: {error})", "", None, None, None, None, 0, None)
            return _Device(index, None, info, lost=True)
        device = _Device(index, handle, GpuInfo(index, name, "", None, None, None, None, 0, None))
        try:
            self._learn_device(device)
        except _GpuLost:
            device.lost = True
        return device

    def _learn_device(self, device: _Device) -> None:
        nvml = self._nvml
        uuid = self._optional(device, "uuid", nvml.nvmlDeviceGetUUID)
        memory = self._optional(device, "memory", nvml.nvmlDeviceGetMemoryInfo)
        generation = self._optional(device, "pcie_generation", nvml.nvmlDeviceGetMaxPcieLinkGeneration)
        width = self._optional(device, "pcie_width", nvml.nvmlDeviceGetMaxPcieLinkWidth)
        pcie_max = None
        if generation in PCIE_LANE_BYTES_PER_S and width:
            pcie_max = PCIE_LANE_BYTES_PER_S[int(generation)] * int(width)
        device.nvlink_links, nvlink_version = self._probe_nvlink(device)
        nvlink_max = None
        if device.nvlink_links:
            per_link = NVLINK_LINK_BYTES_PER_S.get(nvlink_version or 0, NVLINK_LINK_BYTES_PER_S[4])
            nvlink_max = per_link * len(device.nvlink_links)
        device.pcie_counters = self._probe_pcie_counters(device)
        device.field_ids = self._field_ids(device)
        device.info = GpuInfo(
            index=device.index,
            name=device.info.name,
            uuid=str(uuid or ""),
            memory_total_bytes=int(memory.total) if memory is not None else None,
            pcie_generation=int(generation) if generation else None,
            pcie_width=int(width) if width else None,
            pcie_max_bytes_per_s=pcie_max,
            nvlink_links=len(device.nvlink_links),
            nvlink_max_bytes_per_s=nvlink_max,
        )

    def _probe_nvlink(self, device: _Device) -> tuple[tuple[int, ...], int | None]:
        nvml = self._nvml
        links: list[int] = []
        version: int | None = None
        for link in range(NVLINK_MAX_LINKS):
            try:
                active = self._call(nvml.nvmlDeviceGetNvLinkState, device.handle, link)
            except nvml.NVMLError:
                break
            if active:
                links.append(link)
        if links:
            try:
                version = int(self._call(nvml.nvmlDeviceGetNvLinkVersion, device.handle, links[0]))
            except nvml.NVMLError:
                version = None
        return tuple(links), version

    def _probe_pcie_counters(self, device: _Device) -> bool:
        nvml = self._nvml
        try:
            values = self._call(
                nvml.nvmlDeviceGetFieldValues, device.handle, [FI_PCIE_COUNT_TX_BYTES, FI_PCIE_COUNT_RX_BYTES]
            )
        except nvml.NVMLError:
            return False
        return all(value.nvmlReturn == nvml.NVML_SUCCESS for value in values)

    def _field_ids(self, device: _Device) -> list[tuple[int, int]]:
        ids: list[tuple[int, int]] = []
        if device.pcie_counters:
            ids += [(FI_PCIE_COUNT_TX_BYTES, 0), (FI_PCIE_COUNT_RX_BYTES, 0)]
        for link in device.nvlink_links:
            ids += [(FI_NVLINK_THROUGHPUT_DATA_TX, link), (FI_NVLINK_THROUGHPUT_DATA_RX, link)]
        return ids

    def _optional(self, device: _Device, metric: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call ``fn(handle, *args)``; ``None`` when unsupported (remembered) or failing this time."""
        nvml = self._nvml
        if metric in device.unsupported:
            return None
        try:
            return self._call(fn, device.handle, *args)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add(metric)
        except nvml.NVMLError_GpuIsLost:
            raise _GpuLost from None
        except nvml.NVMLError:
            pass
        return None

    def read(self, timeout_s: float) -> tuple[GpuSample, ...]:
        """One sample per GPU, waiting at most ``timeout_s`` for the devices' reads.

        Devices are read in parallel; a device whose read has not finished in time (a slow or hung call)
        yields an empty sample this sweep and is not asked again until that read returns.
        """
        if self._pool is None:
            return ()
        for device in self._devices:
            if not device.lost and device.pending is None:
                device.pending = self._pool.submit(self._read_device, device)
        futures = [device.pending for device in self._devices if device.pending is not None]
        wait(futures, timeout=max(0.0, timeout_s))
        samples: list[GpuSample] = []
        for device in self._devices:
            future = device.pending
            if device.lost:
                samples.append(GpuSample(device.index, lost=True))
            elif future is not None and future.done():
                device.pending = None
                samples.append(future.result())
            else:
                samples.append(GpuSample(device.index))
        return tuple(samples)

    def _read_device(self, device: _Device) -> GpuSample:
        try:
            return self._read_values(device)
        except _GpuLost:
            device.lost = True
            return GpuSample(device.index, lost=True)

    def _read_values(self, device: _Device) -> GpuSample:
        nvml = self._nvml
        utilization = self._optional(device, "utilization", nvml.nvmlDeviceGetUtilizationRates)
        memory = self._optional(device, "memory", nvml.nvmlDeviceGetMemoryInfo)
        counters = self._read_counters(device)
        if device.pcie_counters:
            pcie_tx = counters.get((FI_PCIE_COUNT_TX_BYTES, 0))
            pcie_rx = counters.get((FI_PCIE_COUNT_RX_BYTES, 0))
        else:
            pcie_tx = self._pcie_throughput(device, PCIE_UTIL_TX_BYTES)
            pcie_rx = self._pcie_throughput(device, PCIE_UTIL_RX_BYTES)
        nvlink_tx = _sum_links(counters, FI_NVLINK_THROUGHPUT_DATA_TX, device.nvlink_links)
        nvlink_rx = _sum_links(counters, FI_NVLINK_THROUGHPUT_DATA_RX, device.nvlink_links)
        temperature = self._optional(device, "temperature", nvml.nvmlDeviceGetTemperature, TEMPERATURE_GPU)
        power_mw = self._optional(device, "power", nvml.nvmlDeviceGetPowerUsage)
        return GpuSample(
            index=device.index,
            utilization_pct=float(utilization.gpu) if utilization is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            pcie_tx_bytes_per_s=pcie_tx,
            pcie_rx_bytes_per_s=pcie_rx,
            nvlink_tx_bytes_per_s=nvlink_tx,
            nvlink_rx_bytes_per_s=nvlink_rx,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
        )

    def _pcie_throughput(self, device: _Device, counter: int) -> float | None:
        metric = "pcie_throughput_tx" if counter == PCIE_UTIL_TX_BYTES else "pcie_throughput_rx"
        kb_per_s = self._optional(device, metric, self._nvml.nvmlDeviceGetPcieThroughput, counter)
        return kb_per_s * 1000.0 if kb_per_s is not None else None

    def _read_counters(self, device: _Device) -> dict[tuple[int, int], float | None]:
        """Rates from the device's cumulative field counters, using each value's own timestamp."""
        if not device.field_ids:
            return {}
        values = self._optional(device, "field_values", self._nvml.nvmlDeviceGetFieldValues, device.field_ids)
        if values is None:
            return {}
        rates: dict[tuple[int, int], float | None] = {}
        for key, value in zip(device.field_ids, values, strict=True):
            if value.nvmlReturn != self._nvml.NVML_SUCCESS:
                rates[key] = None
                continue
            scale = 1024.0 if key[0] in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX) else 1.0
            rate = device.rates.setdefault(key, CounterRate(scale=scale))
            rates[key] = rate.update(int(value.value.ullVal), value.timestamp / 1e6)
        return rates

    def close(self) -> None:
        """Stop the read pool and shut NVML down (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._opened:
            self._opened = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._call(self._nvml.nvmlShutdown)


def _sum_links(rates: dict[tuple[int, int], float | None], field_id: int, links: tuple[int, ...]) -> float | None:
    """Sum of the per-link rates; ``None`` when no link has a rate yet."""
    known = [rate for link in links if (rate := rates.get((field_id, link))) is not None]
    return float(sum(known)) if known else None
