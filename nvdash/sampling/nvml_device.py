"""One GPU as the NVML source sees it: its handle, what it supports, and the way every call is made.

Nothing here imports pynvml: the module object is handed in, so the fake library can stand in for the real
one. Every call goes through :class:`NvmlCaller`, which counts calls and turns NVML's errors into the three
outcomes the readers care about: a value, "not supported here" (remembered, never asked again), or a lost GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from nvdash.sampling.rates import CounterRate
from nvdash.sampling.records import GpuInfo

T = TypeVar("T")


class GpuLost(Exception):
    """Raised inside a device read when NVML reports the GPU lost (fallen off the bus)."""


@dataclass
class Device:
    """One GPU's cached handle, learnt capabilities and counter state."""

    index: int
    handle: Any
    info: GpuInfo
    unsupported: set[str] = field(default_factory=set)
    pcie_counters: bool = False
    nvlink_links: tuple[int, ...] = ()
    """Links whose state NVML answers for (up or down): their state and errors are watched."""
    nvlink_active: tuple[int, ...] = ()
    """Links that were up at start: they carry the throughput counters and make the NVLink maximum."""
    field_ids: list[tuple[int, int]] = field(default_factory=list)
    rates: dict[tuple[int, int], CounterRate] = field(default_factory=dict)
    lost: bool = False
    pending: dict[str, Future[Any]] = field(default_factory=dict)
    """Calls in flight on the read pool, by job (``"read"``, ``"usage"``): a device is not asked again meanwhile."""
    slow_values: dict[str, Any] = field(default_factory=dict)
    """The readings taken at the slow cadence (ECC, remapped rows, link errors), carried between reads."""
    slow_due_s: float = 0.0
    """Monotonic time at which the slow readings are next taken."""
    gpm_previous: Any = None
    """The previous GPM sample (an NVML sample handle), the start of the next metrics interval."""
    error_logged: bool = False
    util_last_seen_us: int = 0
    """Timestamp of the newest per-process utilization sample read so far (NVML's ``lastSeenTimeStamp``)."""
    util_period_us: int = 0
    """The driver's per-process sample period as learnt from the sample timestamps (0: not known yet)."""


class NvmlCaller:
    """Calls NVML functions on behalf of the source: counts them and classifies their errors."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self._calls = 0
        self._closed = False
        self._closer: int | None = None
        """While closing: the closing thread, the only one whose calls are still let through."""
        self._in_flight = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    @property
    def calls(self) -> int:
        """How many NVML functions were called so far."""
        with self._lock:
            return self._calls

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn`` and count it; NVML errors propagate. Once closed, every call fails as NVML does after
        ``nvmlShutdown`` (``NVMLError_Uninitialized``) without reaching the library."""
        with self._lock:
            if self._closed or (self._closer is not None and self._closer != threading.get_ident()):
                raise self.nvml.NVMLError(self.nvml.NVML_ERROR_UNINITIALIZED)
            self._calls += 1
            self._in_flight += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.notify_all()

    def quiesce(self, timeout_s: float) -> bool:
        """Refuse the calls of every thread but this one, and wait (at most ``timeout_s``) until the calls other
        threads had begun have returned: NVML's buffers are freed and the library shut down only once no read is
        inside it (a call that passed the check just before would otherwise reach a shut-down library). False when
        a call was still under way at the deadline (a hung read)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._closer = threading.get_ident()
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        """Refuse every later call: a read that hung past the source's close must not call into NVML when it wakes
        (the library may have been shut down, or replaced)."""
        with self._lock:
            self._closed = True

    def optional(self, device: Device, metric: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(handle, *args)``, or ``None`` when unsupported (remembered per device) or failing this time.

        A lost GPU raises :class:`GpuLost`. A function missing from the driver counts as unsupported.
        """
        nvml = self.nvml
        if metric in device.unsupported:
            return None
        try:
            return self.call(fn, device.handle, *args)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add(metric)
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            pass
        return None

    def supported(self, device: Device, metric: str) -> bool:
        """False once ``metric`` was found unsupported on ``device``."""
        return metric not in device.unsupported


_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""``nvmlValueType_t`` -> the member of ``nvmlValue_t`` that holds the value."""


def field_number(value: Any) -> float | None:
    """A field value's number, read from the union member its ``valueType`` names."""
    attribute = _VALUE_FIELDS.get(int(value.valueType))
    return None if attribute is None else float(getattr(value.value, attribute))


def text_of(value: object) -> str:
    """NVML strings arrive as bytes or str depending on the wrapper: always str."""
    return value.decode() if isinstance(value, bytes) else str(value)
