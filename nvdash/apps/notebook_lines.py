"""The points of the "GPU Memory by Notebook" lines: readings of which kernel holds how much GPU memory (from the
live snapshots' notebook views and the history's minutes), turned into each kernel's new points.

A kernel's line starts at the first reading in which it holds memory; when a reading finds it holding nothing (or
gone), the line drops to 0 there and ends; holding again later, it rises from 0 at that reading.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from nvdash.history.notebook_table import BUCKET_S, NotebookMinute
from nvdash.sampling.records import Snapshot

WINDOW_S = 1800.0
"""What the page shows when it opens: the last 30 minutes."""


class Held(NamedTuple):
    """What one kernel held at a reading."""

    title: str
    """The notebook's path, or ``Kernel <name> <id prefix>`` for a kernel without a session."""
    memory_bytes: float
    """NaN when NVML did not give the memory of one of its processes."""


class Reading(NamedTuple):
    """The kernels holding GPU memory at one time (seconds since the epoch)."""

    time_s: float
    held: Mapping[str, Held]
    """By kernel id, in the kernels file's order."""


def live_readings(rows: Sequence[Snapshot]) -> list[Reading]:
    """One reading per process reading in ``rows`` (a reading carried by several snapshots once), oldest first;
    snapshots whose view is missing or not ``ok`` give none (nothing is known then)."""
    readings: list[Reading] = []
    for row in rows:
        view = row.notebooks
        if view is None or view.state != "ok" or (readings and readings[-1].time_s == view.time_s):
            continue
        held = {use.kernel.id: Held(use.kernel.title, math.nan if use.memory_bytes is None else float(use.memory_bytes))
                for use in view.kernels if use.holds_memory}
        readings.append(Reading(view.time_s, held))
    return readings


def history_readings(minutes: Iterable[NotebookMinute], before_s: float) -> list[Reading]:
    """One reading per recorded minute, at its middle, for the minutes whose middle is before ``before_s`` (where
    the live readings take over): each kernel's mean memory over the minute, summed over its GPUs (NaN when one is
    unknown)."""
    by_minute: dict[float, dict[str, Held]] = {}
    for minute in minutes:
        middle = minute.minute_s + BUCKET_S / 2
        if middle >= before_s:
            continue
        held = by_minute.setdefault(middle, {})
        memory = math.nan if minute.memory_bytes_mean is None else minute.memory_bytes_mean
        before = held.get(minute.kernel_id)
        held[minute.kernel_id] = Held(minute.title, memory if before is None else before.memory_bytes + memory)
    return [Reading(time_s, held) for time_s, held in sorted(by_minute.items())]


@dataclass
class Points:
    """New points of one line: times (epoch ms) and memory (bytes)."""

    time: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)

    def add(self, time_ms: float, memory_bytes: float) -> None:
        self.time.append(time_ms)
        self.memory.append(memory_bytes)


@dataclass
class Changes:
    """What a batch of readings changes: the kernels seen for the first time (in order), each line's new points,
    and the lines whose title changed (a notebook renamed or its session closed)."""

    new: list[str] = field(default_factory=list)
    points: dict[str, Points] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)


@dataclass
class NotebookLines:
    """Each kernel's line so far: its title and whether it holds memory at the newest reading."""

    titles: dict[str, str] = field(default_factory=dict)
    holding: set[str] = field(default_factory=set)
    newest_s: float = -math.inf

    def add(self, readings: Iterable[Reading]) -> Changes:
        """The changes of the readings newer than the newest one seen (older ones are skipped)."""
        changes = Changes()
        for reading in readings:
            if reading.time_s <= self.newest_s:
                continue
            self.newest_s = reading.time_s
            time_ms = reading.time_s * 1000.0
            for kernel, held in reading.held.items():
                points = changes.points.setdefault(kernel, Points())
                if kernel not in self.titles:
                    changes.new.append(kernel)
                elif kernel not in self.holding:
                    points.add(time_ms, 0.0)
                if self.titles.get(kernel, held.title) != held.title:
                    changes.titles[kernel] = held.title
                self.titles[kernel] = held.title
                points.add(time_ms, held.memory_bytes)
            for kernel in sorted(self.holding - reading.held.keys(), key=list(self.titles).index):
                changes.points.setdefault(kernel, Points()).add(time_ms, 0.0)
            self.holding = set(reading.held)
        return changes
