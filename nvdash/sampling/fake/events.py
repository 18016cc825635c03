"""Event sets: ``nvmlEventSetCreate``/``nvmlDeviceRegisterEvents``/``nvmlEventSetWait_v2``/``nvmlEventSetFree``.

As NVML documents it: a set records only events that happen after a device is registered with it, each
event is delivered once per set, and a wait returns at once when an event is ready, otherwise sleeps until
one arrives or the timeout passes (``NVML_ERROR_TIMEOUT``). Waiting sleeps on a condition variable, so a
waiting thread holds no lock of the library and costs nothing while it waits. Events come from a timeline
(the profile's scenario, produced a minute ahead as time goes on) plus events injected at run time.
"""

from __future__ import annotations

import bisect
import ctypes
import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import constants as c
from .scenario import Event

SUPPORTED_EVENT_TYPES = (
    c.NVML_EVENT_TYPE_SINGLE_BIT_ECC_ERROR
    | c.NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR
    | c.NVML_EVENT_TYPE_PSTATE
    | c.NVML_EVENT_TYPE_XID_CRITICAL_ERROR
)
"""What ECC-enabled Volta-and-later boards support (``nvmlEventTypeClock`` is Kepler only)."""
_LOOKAHEAD_S = 60.0
POLL_S = 0.05
"""Longest sleep between looks at a clock that does not run in real time (tests move theirs by hand)."""


@dataclass
class _EventSet:
    storage: ctypes.Array[ctypes.c_char]
    registered: dict[tuple[int, int], float] = field(default_factory=dict)
    """(device, event type bit) -> when it was registered."""
    queue: list[tuple[float, int, Event]] = field(default_factory=list)
    queued: set[int] = field(default_factory=set)

    def wants(self, event: Event, seq: int) -> bool:
        since = self.registered.get((event.device, event.event_type))
        return since is not None and event.t >= since and seq not in self.queued

    def push(self, event: Event, seq: int) -> None:
        self.queued.add(seq)
        heapq.heappush(self.queue, (event.t, seq, event))


class EventHub:
    """Every event set of one library and the timeline they draw from.

    ``timeline(t0, t1)`` gives the scheduled events in [t0, t1); ``now()`` the current time in the
    timeline's seconds. ``poll_s``: how often a waiter looks at ``now()`` again; None when ``now()`` runs in
    real time, so that a waiter sleeps right up to its next event (or an injected one wakes it).
    """

    def __init__(
        self,
        timeline: Callable[[float, float], list[Event]],
        now: Callable[[], float],
        poll_s: float | None = POLL_S,
    ) -> None:
        self._timeline = timeline
        self._now = now
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._events: list[tuple[float, int, Event]] = []
        self._next_seq = 0
        self._horizon = 0.0
        self._sets: dict[int, _EventSet] = {}
        self.blocking = True
        """False: a wait with nothing due answers ``NVML_ERROR_TIMEOUT`` at once (a driver whose wait does not
        block, as some do under virtualisation), rather than sleeping for its timeout."""

    # Locked helpers

    def _insert(self, event: Event) -> None:
        seq = self._next_seq
        self._next_seq += 1
        bisect.insort(self._events, (event.t, seq, event))
        for event_set in self._sets.values():
            if event_set.wants(event, seq):
                event_set.push(event, seq)

    def _produce(self, until: float) -> None:
        while self._horizon < until:
            end = self._horizon + _LOOKAHEAD_S
            for event in self._timeline(self._horizon, end):
                self._insert(event)
            self._horizon = end

    # Entry points

    def create(self) -> int:
        """A new set; its handle (an address pynvml stores in ``c_nvmlEventSet_t``)."""
        storage = ctypes.create_string_buffer(8)
        with self._cond:
            address = ctypes.addressof(storage)
            self._sets[address] = _EventSet(storage=storage)
        return address

    def register(self, address: int, device: int, event_types: int) -> int:
        """Record ``event_types`` of ``device`` in the set from now on; NVML return code."""
        with self._cond:
            event_set = self._sets.get(address)
            if event_set is None:
                return c.NVML_ERROR_INVALID_ARGUMENT
            if event_types & ~SUPPORTED_EVENT_TYPES:
                return c.NVML_ERROR_NOT_SUPPORTED
            now = self._now()
            self._produce(now + _LOOKAHEAD_S)
            bits = [1 << i for i in range(event_types.bit_length()) if event_types >> i & 1]
            for bit in bits:
                event_set.registered.setdefault((device, bit), now)
            start = bisect.bisect_left(self._events, (now, -1))
            for _when, seq, event in self._events[start:]:
                if event_set.wants(event, seq):
                    event_set.push(event, seq)
            return c.NVML_SUCCESS

    def add(self, events: list[Event]) -> None:
        """Queue events injected at run time and wake the waiters."""
        with self._cond:
            for event in events:
                self._insert(event)
            self._cond.notify_all()

    def wait(self, address: int, timeout_ms: int) -> Event | int:
        """The set's next due event, waiting up to ``timeout_ms`` of real time; else an NVML error code."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            while True:
                event_set = self._sets.get(address)
                if event_set is None:
                    return c.NVML_ERROR_INVALID_ARGUMENT
                now = self._now()
                self._produce(now + _LOOKAHEAD_S)
                if event_set.queue and event_set.queue[0][0] <= now:
                    return heapq.heappop(event_set.queue)[2]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.blocking:
                    return c.NVML_ERROR_TIMEOUT
                sleep = min(remaining, _LOOKAHEAD_S / 2 if self._poll_s is None else self._poll_s)
                if event_set.queue:
                    sleep = min(sleep, max(event_set.queue[0][0] - now, 1e-3))
                self._cond.wait(sleep)

    def free(self, address: int) -> int:
        """Drop the set; a thread waiting on it wakes and gets ``NVML_ERROR_INVALID_ARGUMENT``."""
        with self._cond:
            if self._sets.pop(address, None) is None:
                return c.NVML_ERROR_INVALID_ARGUMENT
            self._cond.notify_all()
            return c.NVML_SUCCESS
