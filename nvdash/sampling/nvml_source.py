"""The NVML source: the only module that imports ``pynvml``.

It takes the pynvml module as a parameter (``NvmlSource(nvml)``), so the fake NVML library can be installed
under the real wrapper for simulation and tests. NVML is initialised in :meth:`NvmlSource.open`, never at
import; handles are cached and each device's capabilities are learnt once. Every NVML error is handled per
metric and per device: a metric a device does not support is ``None`` from then on, a lost GPU is reported
lost while the others keep updating.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from types import ModuleType
from typing import Any, TypeVar

from nvdash.sampling.daemon_pool import DaemonPool
from nvdash.sampling.nvml_device import Device, GpuLost, NvmlCaller
from nvdash.sampling.nvml_modes import ENERGY_WENT_BACK, MIG_CHANGED, ModeWatch, Reprobe
from nvdash.sampling.nvml_probe import PCIE_LANE_BYTES_PER_S, DeviceProber
from nvdash.sampling.nvml_read import DeviceReader
from nvdash.sampling.nvml_usage import DeviceUsage, UsageReader
from nvdash.sampling.records import GpuEvent, GpuInfo, GpuSample
from nvdash.sampling.topology import TopologyReader
from nvdash.sampling.usage_records import GpuUsage
from nvdash.sampling.xid_watcher import XidWatcher
from nvdash.supervision import Supervisor

__all__ = ["PCIE_LANE_BYTES_PER_S", "NvmlSource", "NvmlUnavailable", "install_library", "load_nvml"]

log = logging.getLogger(__name__)
T = TypeVar("T")
SHUTDOWN_TIMEOUT_S = 2.0
"""How long closing waits for ``nvmlShutdown`` (a hung driver call must not hold up the process's exit)."""


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


class NvmlSource:
    """Reads every GPU through pynvml: static inventory once, a :class:`GpuSample` per GPU per sweep.

    A GPU whose mode changed is probed again (see :mod:`nvml_modes`); ``wall_clock`` stamps those re-probes.
    """

    def __init__(
        self,
        nvml: ModuleType,
        max_workers: int = 16,
        slow_interval_s: float | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self._clock = wall_clock
        self._caller = NvmlCaller(nvml)
        self._max_workers = max_workers
        self._reader = (
            DeviceReader(self._caller) if slow_interval_s is None else DeviceReader(self._caller, slow_interval_s)
        )
        self._usage_reader = UsageReader(self._caller)
        self._modes = ModeWatch(self._caller)
        self._devices: list[Device] = []
        self._pool: DaemonPool | None = None
        self._driver_version: str | None = None
        self._topology: tuple[tuple[str, ...], ...] = ()
        self._xid: XidWatcher | None = None
        self._opened = False
        self.skipped_reads = 0
        """Device reads a sweep did not ask for because the device's read of an earlier sweep was still running."""
        self.relearned = 0
        """Times a GPU's capabilities were learnt again because its mode changed (see :mod:`nvml_modes`)."""
        self.last_relearn: Reprobe | None = None
        """The newest of those re-probes (``None`` before the first)."""
        self._relearn_lock = threading.Lock()

    @property
    def calls(self) -> int:
        """How many NVML functions this source has called."""
        return self._caller.calls

    @property
    def driver_version(self) -> str | None:
        """The driver version NVML reported, once opened."""
        return self._driver_version

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        """The GPUs found by :meth:`open`."""
        return tuple(device.info for device in self._devices)

    @property
    def topology(self) -> tuple[tuple[str, ...], ...]:
        """How each pair of GPUs is connected (see ``Inventory.topology``), learnt by :meth:`open`."""
        return self._topology

    def open(self) -> tuple[GpuInfo, ...]:
        """Initialise NVML and learn each GPU; raises :class:`NvmlUnavailable` with a plain reason."""
        nvml = self._nvml
        try:
            self._caller.call(nvml.nvmlInit)
        except nvml.NVMLError as error:
            raise NvmlUnavailable(explain_init_error(nvml, error)) from None
        self._opened = True
        try:
            self._driver_version = str(self._caller.call(nvml.nvmlSystemGetDriverVersion))
        except nvml.NVMLError:
            self._driver_version = None
        try:
            count = int(self._caller.call(nvml.nvmlDeviceGetCount))
        except nvml.NVMLError as error:
            self.close()
            raise NvmlUnavailable(f"NVML could not count the GPUs: {error}.") from None
        self._devices = [self._open_device(index) for index in range(count)]
        self._topology = TopologyReader(self._caller).matrix(self._devices)
        if self._devices:
            workers = max(1, min(self._max_workers, len(self._devices)))
            self._pool = DaemonPool(workers, name="nvdash-nvml")
        return self.gpus

    def _open_device(self, index: int) -> Device:
        nvml = self._nvml
        try:
            handle = self._caller.call(nvml.nvmlDeviceGetHandleByIndex, index)
            name = str(self._caller.call(nvml.nvmlDeviceGetName, handle))
        except nvml.NVMLError as error:
            info = GpuInfo(index, f"GPU {index} (unavailable: {error})", "", None, None, None, None, 0, None)
            return Device(index, None, info, lost=True)
        device = Device(index, handle, GpuInfo(index, name, "", None, None, None, None, 0, None))
        try:
            device.info = DeviceProber(self._caller).learn(device)
        except GpuLost:
            device.lost = True
        return device

    def watch_xids(self, on_event: Callable[[GpuEvent], None], supervisor: Supervisor | None = None) -> str | None:
        """Start the XID event thread (under ``supervisor``); returns why XIDs cannot be watched, or ``None``."""
        if not self._opened or not self._devices:
            return "no GPU"
        if self._xid is not None:
            return self._xid.unavailable_reason
        self._xid = XidWatcher(self._caller, self._devices, on_event, supervisor=supervisor)
        if not self._xid.start():
            return self._xid.unavailable_reason
        return None

    def read(self, timeout_s: float) -> tuple[GpuSample, ...]:
        """One sample per GPU, waiting at most ``timeout_s`` for the devices' reads.

        Devices are read in parallel; a device whose read has not finished in time (a slow or hung call)
        yields an empty sample this sweep and is not asked again until that read returns. Later sweeps do not
        wait for it again.
        """
        samples: list[GpuSample] = []
        for device, sample in self._each_device("read", self._read_device, timeout_s):
            if device.lost:
                samples.append(GpuSample(device.index, lost=True))
            else:
                samples.append(sample if sample is not None else GpuSample(device.index))
        return tuple(samples)

    def _each_device(
        self,
        job: str,
        work: Callable[[Device], T],
        timeout_s: float,
        meanwhile: Callable[[], object] | None = None,
    ) -> list[tuple[Device, T | None]]:
        """``work`` on every device in parallel; each device's result, or ``None`` if it has not finished in time.

        A device still busy with this ``job`` from an earlier round (a slow or hung call) is not asked again until
        that call returns, and only this round's calls are waited for. ``meanwhile`` runs on the calling thread
        while the calls are in flight.
        """
        pool = self._pool
        if pool is None:
            return []
        fresh: list[Future[Any]] = []
        for device in self._devices:
            if not device.lost and job not in device.pending:
                submitted = pool.submit(work, device)
                device.pending[job] = submitted
                fresh.append(submitted)
            elif not device.lost and job == "read":
                self.skipped_reads += 1
        started = time.monotonic()
        if meanwhile is not None:
            meanwhile()
        wait(fresh, timeout=max(0.0, timeout_s - (time.monotonic() - started)))
        results: list[tuple[Device, T | None]] = []
        for device in self._devices:
            pending = device.pending.get(job)
            result: T | None = None
            if pending is not None and pending.done():
                del device.pending[job]
                result = pending.result()
            results.append((device, result))
        return results

    def _read_device(self, device: Device) -> GpuSample:
        """The device's sample; a lost GPU or an unexpected failure costs only this device's reading."""
        try:
            if self._modes.mig_changed(device):
                self._relearn(device, MIG_CHANGED)
            sample = self._reader.read(device)
            if self._modes.energy_went_back(device, sample.energy_mj):
                self._relearn(device, ENERGY_WENT_BACK)
            return sample
        except GpuLost:
            device.lost = True
            return GpuSample(device.index, lost=True)
        except Exception as error:
            if not device.error_logged:
                device.error_logged = True
                log.exception("reading GPU %d failed; its reading is skipped this sweep", device.index)
            return GpuSample(device.index, error=f"{type(error).__name__}: {error}")

    def _relearn(self, device: Device, reason: str) -> None:
        """Forget what was learnt about ``device`` (unsupported readings, counter and sample state) and probe it again.

        The sweep that notices a driver reload has already read with the old state; its counters' rates are left
        out by their reset rule, and the next sweep starts them afresh.
        """
        log.info("GPU %d: %s; asking again which readings it supports", device.index, reason)
        device.unsupported.clear()
        device.rates.clear()
        device.slow_values = {}
        device.slow_due_s = 0.0
        device.gpm_previous = None
        device.info = DeviceProber(self._caller).learn(device)
        with self._relearn_lock:  # devices are read in parallel: a driver reload re-probes them all at once
            self.relearned += 1
            self.last_relearn = Reprobe(device.index, reason, self._clock())

    def read_usage(self, timeout_s: float, meanwhile: Callable[[], object] | None = None) -> tuple[DeviceUsage, ...]:
        """Each GPU's processes and MIG instances, read in parallel like :meth:`read`, waiting at most ``timeout_s``.

        ``meanwhile`` runs on the calling thread while the reads are in flight (NVML calls release the GIL, so
        host lookups overlap them). A GPU that is lost, or whose read has not finished in time, is reported with
        ``processes_readable=False``.
        """
        return tuple(
            usage
            if usage is not None and not device.lost
            else DeviceUsage(GpuUsage(device.index, device.info.uuid, processes_readable=False,
                                   minor_number=device.info.minor_number))
            for device, usage in self._each_device("usage", self._read_usage, timeout_s, meanwhile)
        )

    def _read_usage(self, device: Device) -> DeviceUsage | None:
        """The device's usage; ``None`` when it is lost or the read failed unexpectedly (logged once)."""
        try:
            return self._usage_reader.read(device)
        except GpuLost:
            device.lost = True
        except Exception:
            if not device.error_logged:
                device.error_logged = True
                log.exception("reading the processes of GPU %d failed; they are skipped this time", device.index)
        return None

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the device reads an earlier round stopped waiting for (they keep calling NVML
        after the round gave up on them); ``True`` when none is left running.

        :attr:`calls` counts each call as it enters the library, on the thread that makes it, so once settled it is
        exactly what the library was asked (a count compared while reads still run would be a race).
        """
        running = [future for device in self._devices for future in device.pending.values()]
        return not wait(running, timeout=timeout_s).not_done

    def close(self) -> None:
        """Stop the XID thread and the read pool and shut NVML down (idempotent, bounded in time)."""
        if self._xid is not None:
            self._xid.stop()
            self._xid = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._opened:
            self._opened = False
            nvml = self._nvml
            done = threading.Event()

            def shutdown() -> None:
                try:
                    self._caller.quiesce(SHUTDOWN_TIMEOUT_S / 2)
                    self._reader.close()
                    self._usage_reader.close()
                    self._caller.call(nvml.nvmlShutdown)
                except nvml.NVMLError:
                    pass
                finally:
                    self._caller.close()
                    done.set()

            threading.Thread(target=shutdown, name="nvdash-nvml-shutdown", daemon=True).start()
            if not done.wait(SHUTDOWN_TIMEOUT_S):
                self._caller.close()
                log.warning("nvmlShutdown did not return within %.0f s; exiting without it", SHUTDOWN_TIMEOUT_S)
