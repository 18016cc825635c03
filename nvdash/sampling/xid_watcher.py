"""The XID event thread: waits on an NVML event set for critical XID errors and records each one.

``nvmlEventSetWait_v2`` blocks for up to its timeout, so it gets a thread of its own: never the event loop,
never the sampler. Waiting costs no polling: one call per timeout (or per event).

A driver whose wait does not block (it fails, or answers "timeout" long before the timeout passed) would turn that
loop into a spin at full CPU: such a wait counts as a failure, and failures back off, doubling from
:data:`FIRST_BACKOFF_S` to :data:`MAX_BACKOFF_S` (elapsed time is measured on the monotonic clock). The loop runs
under a :class:`~nvdash.supervision.Supervisor` and beats after each round.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from nvdash.sampling.nvml_device import Device, NvmlCaller
from nvdash.sampling.records import GpuEvent
from nvdash.supervision import Supervisor

log = logging.getLogger(__name__)

EVENT_TYPE_XID_CRITICAL = 0x8
"""``nvmlEventTypeXidCriticalError``."""
WAIT_TIMEOUT_MS = 500
NO_INSTANCE = 0xFFFFFFFF
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
EARLY_FRACTION = 0.5
"""A timeout that came before this share of the wait's timeout had passed is a wait that did not block."""
THREAD_NAME = "nvdash-xid"


def backoff_s(failures: int) -> float:
    """The pause after ``failures`` failed waits in a row (1 or more): doubling, capped."""
    return float(min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** min(failures - 1, 32)))


class XidWatcher:
    """Registers every GPU for XID events and hands each event to ``on_event`` from its own thread."""

    def __init__(
        self,
        caller: NvmlCaller,
        devices: Sequence[Device],
        on_event: Callable[[GpuEvent], None],
        wall_clock: Callable[[], float] = time.time,
        timeout_ms: int = WAIT_TIMEOUT_MS,
        *,
        supervisor: Supervisor | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        pause: Callable[[float], bool] | None = None,
    ) -> None:
        """``pause(seconds)`` waits between failed waits and returns True when the watcher is to stop (default:
        waiting on the stop event); ``monotonic`` measures how long each wait took."""
        self._caller = caller
        self._nvml: ModuleType = caller.nvml
        self._devices = list(devices)
        self._on_event = on_event
        self._wall_clock = wall_clock
        self._timeout_ms = timeout_ms
        self._stop = threading.Event()
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._monotonic = monotonic
        self._pause = pause if pause is not None else self._stop.wait
        self._failures = 0
        self._early_logged = False
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._registered: list[int] = []
        self.unavailable_reason: str | None = None
        """Why XIDs cannot be watched here (no event support), else ``None``."""

    @property
    def registered(self) -> list[int]:
        """Indexes of the GPUs whose XIDs are watched."""
        return list(self._registered)

    def start(self) -> bool:
        """Create the event set, register the GPUs and start the thread; False when no GPU can report XIDs."""
        nvml = self._nvml
        try:
            self._event_set = self._caller.call(nvml.nvmlEventSetCreate)
        except nvml.NVMLError as error:
            self.unavailable_reason = f"NVML events are not available: {error}"
            return False
        for device in self._devices:
            if device.lost or device.handle is None:
                continue
            try:
                register = nvml.nvmlDeviceRegisterEvents
                self._caller.call(register, device.handle, EVENT_TYPE_XID_CRITICAL, self._event_set)
            except nvml.NVMLError:
                continue
            self._registered.append(device.index)
        if not self._registered:
            self.unavailable_reason = "no GPU here reports XID events"
            self._free()
            return False
        expect_every_s = max(self._timeout_ms / 1000, MAX_BACKOFF_S)
        self._thread = self._supervisor.spawn(THREAD_NAME, self._run, self._stop, expect_every_s=expect_every_s)
        return True

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop waiting; returns within about one wait timeout (the thread is a daemon either way)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self._free()
        else:
            self._free()

    def _free(self) -> None:
        if self._event_set is None:
            return
        nvml = self._nvml
        event_set, self._event_set = self._event_set, None
        with contextlib.suppress(nvml.NVMLError):
            self._caller.call(nvml.nvmlEventSetFree, event_set)

    def _device_index(self, handle: Any) -> int | None:
        import ctypes  # noqa: PLC0415 - only to compare opaque handles

        def address(value: Any) -> int | None:
            try:
                return ctypes.cast(value, ctypes.c_void_p).value
            except (TypeError, ctypes.ArgumentError):
                return None

        wanted = address(handle)
        for device in self._devices:
            if device.handle is not None and address(device.handle) == wanted:
                return device.index
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            event_set = self._event_set
            if event_set is None:
                return
            data = self._wait(event_set)
            self._supervisor.beat(THREAD_NAME)
            if data is None:
                if self._failures and self._pause(backoff_s(self._failures)):
                    return
                continue
            if self._stop.is_set():
                return
            self._deliver(data)

    def _wait(self, event_set: Any) -> Any:
        """One wait: the event, or ``None`` after a timeout or a failure (counted in ``_failures``)."""
        nvml = self._nvml
        began = self._monotonic()
        try:
            data = self._caller.call(nvml.nvmlEventSetWait_v2, event_set, self._timeout_ms)
        except nvml.NVMLError_Timeout:
            elapsed_s = self._monotonic() - began
            if elapsed_s >= EARLY_FRACTION * self._timeout_ms / 1000:
                self._failures = 0
                return None
            self._failures += 1
            if not self._early_logged:
                self._early_logged = True
                log.warning("NVML's XID event wait returned after %.0f ms of its %d ms timeout: backing off up to "
                            "%g s between waits", elapsed_s * 1000, self._timeout_ms, MAX_BACKOFF_S)
            return None
        except nvml.NVMLError as error:
            self._failures += 1
            if self._failures == 1:
                log.warning("waiting for XID events failed: %s", error)
            return None
        self._failures = 0
        return data

    def _deliver(self, data: Any) -> None:
        if int(data.eventType) & EVENT_TYPE_XID_CRITICAL == 0:
            return
        code = int(data.eventData)
        index = self._device_index(data.device)
        instance = ""
        gi = int(getattr(data, "gpuInstanceId", NO_INSTANCE))
        if gi != NO_INSTANCE:
            instance = f" (MIG GPU instance {gi})"
        event = GpuEvent(
            time_s=self._wall_clock(),
            gpu_index=index,
            kind="xid",
            message=f"XID {code}{instance}",
            severity="critical",
            code=code,
        )
        try:
            self._on_event(event)
        except Exception:
            log.exception("recording XID event failed")
