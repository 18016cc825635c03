"""The XID event thread: waits on an NVML event set for critical XID errors and records each one.

``nvmlEventSetWait_v2`` blocks for up to its timeout, so it gets a thread of its own: never the event loop,
never the sampler. Waiting costs no polling: one call per timeout (or per event).
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

log = logging.getLogger(__name__)

EVENT_TYPE_XID_CRITICAL = 0x8
"""``nvmlEventTypeXidCriticalError``."""
WAIT_TIMEOUT_MS = 500
NO_INSTANCE = 0xFFFFFFFF


class XidWatcher:
    """Registers every GPU for XID events and hands each event to ``on_event`` from its own thread."""

    def __init__(
        self,
        caller: NvmlCaller,
        devices: Sequence[Device],
        on_event: Callable[[GpuEvent], None],
        wall_clock: Callable[[], float] = time.time,
        timeout_ms: int = WAIT_TIMEOUT_MS,
    ) -> None:
        self._caller = caller
        self._nvml: ModuleType = caller.nvml
        self._devices = list(devices)
        self._on_event = on_event
        self._wall_clock = wall_clock
        self._timeout_ms = timeout_ms
        self._stop = threading.Event()
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
        self._thread = threading.Thread(target=self._run, name="nvdash-xid", daemon=True)
        self._thread.start()
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
        nvml = self._nvml
        failures = 0
        while not self._stop.is_set():
            event_set = self._event_set
            if event_set is None:
                return
            try:
                data = self._caller.call(nvml.nvmlEventSetWait_v2, event_set, self._timeout_ms)
            except nvml.NVMLError_Timeout:
                failures = 0
                continue
            except nvml.NVMLError as error:
                failures += 1
                if failures == 1:
                    log.warning("waiting for XID events failed: %s", error)
                if self._stop.wait(min(5.0, 0.1 * failures)):
                    return
                continue
            failures = 0
            if self._stop.is_set():
                return
            self._deliver(data)

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
