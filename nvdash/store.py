"""The bounded, thread-safe ring buffer of recent snapshots shared by every dashboard."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Protocol

from nvdash.sampling.records import GpuEvent, Inventory, Snapshot

DEFAULT_CAPACITY = 1200
DEFAULT_EVENT_CAPACITY = 1000


class StoreListener(Protocol):
    """Something that keeps what the store receives (the history writer); called on the appending thread."""

    def submit(self, snapshot: Snapshot) -> None: ...

    def submit_events(self, events: Iterable[GpuEvent]) -> None: ...


class Store:
    """Holds the last ``capacity`` snapshots; one writer (the sampler), any number of readers.

    Each appended snapshot gets the next sequence number, starting at 1. A reader keeps the last number
    it saw and asks for what came after it, so each reader gets each row once.
    """

    def __init__(
        self, inventory: Inventory, capacity: int = DEFAULT_CAPACITY, event_capacity: int = DEFAULT_EVENT_CAPACITY
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if event_capacity < 1:
            raise ValueError("event capacity must be at least 1")
        self._inventory = inventory
        self._capacity = capacity
        self._rows: deque[Snapshot] = deque(maxlen=capacity)
        self._last_seq = 0
        self._events: deque[GpuEvent] = deque(maxlen=event_capacity)
        self._info_events: deque[GpuEvent] = deque(maxlen=event_capacity)
        self._event_seq = 0
        self._lock = threading.Lock()
        self._listeners: list[StoreListener] = []

    def add_listener(self, listener: StoreListener) -> None:
        """Hand every snapshot and event appended from now on to ``listener`` as well (it must not block)."""
        self._listeners.append(listener)

    @property
    def inventory(self) -> Inventory:
        """The hardware found at start."""
        return self._inventory

    @property
    def capacity(self) -> int:
        """The most snapshots kept."""
        return self._capacity

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest snapshot (0 when empty)."""
        with self._lock:
            return self._last_seq

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def append(self, snapshot: Snapshot) -> int:
        """Add a snapshot, dropping the oldest beyond capacity; returns its sequence number."""
        with self._lock:
            self._rows.append(snapshot)
            self._last_seq += 1
            seq = self._last_seq
        for listener in self._listeners:
            listener.submit(snapshot)
        return seq

    def since(self, seq: int) -> tuple[list[Snapshot], int]:
        """The snapshots newer than ``seq`` (oldest first) and the newest sequence number.

        A reader that fell more than ``capacity`` rows behind gets the rows still kept.
        """
        with self._lock:
            newer = self._last_seq - seq
            if newer <= 0:
                return [], self._last_seq
            count = min(newer, len(self._rows))
            rows = [self._rows[i] for i in range(len(self._rows) - count, len(self._rows))]
            return rows, self._last_seq

    def latest(self) -> Snapshot | None:
        """The newest snapshot, or ``None`` before the first."""
        with self._lock:
            return self._rows[-1] if self._rows else None

    def add_events(self, events: list[GpuEvent]) -> int:
        """Record events (from any thread); returns how many events were ever added.

        Informational events and warnings/critical ones are kept in separate rings of ``event_capacity`` each, so
        a flood of routine events (power-cap episodes) never pushes an XID out of the log.
        """
        with self._lock:
            for event in events:
                (self._info_events if event.severity == "info" else self._events).append(event)
            self._event_seq += len(events)
            seq = self._event_seq
        if events:
            for listener in self._listeners:
                listener.submit_events(events)
        return seq

    @property
    def event_seq(self) -> int:
        """How many events were ever added (a reader compares it to see whether anything is new)."""
        with self._lock:
            return self._event_seq

    def events(self, limit: int | None = None) -> list[GpuEvent]:
        """The kept events, oldest first; only the newest ``limit`` when given."""
        with self._lock:
            kept = sorted([*self._events, *self._info_events], key=lambda event: event.time_s)
        return kept if limit is None else kept[-limit:] if limit > 0 else []
