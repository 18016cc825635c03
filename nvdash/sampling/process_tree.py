"""Which process is whose: parent PIDs and start times from ``/proc/PID/stat``, and each PID's nearest ancestor
among a set of known processes (the Jupyter kernels).

A known process is named by its PID *and* its start time (seconds since the epoch), so that a later process that
reused the PID is not taken for it. Start times are computed as :mod:`nvdash.sampling.host_processes` (and ``ps``,
psutil) compute them: the boot time (``btime`` of ``/proc/stat``) plus the start ticks over ``CLK_TCK``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from nvdash.sampling.bounded_read import read_bounded_or_none

MAX_DEPTH = 64
"""Parents walked up from one process at most (a deeper tree, or a loop in a hostile stand-in, stops there)."""
START_TOLERANCE_S = 0.5
"""How far a process's start time may be from the known one and still be that process (both are read from the
same ticks; the tolerance covers rounding in whoever wrote the known time)."""
_STAT_BYTES = 4096


class ProcessFacts(NamedTuple):
    """What ``/proc/PID/stat`` says of a process's place in the tree."""

    ppid: int
    started_s: float | None
    """Seconds since the epoch; ``None`` when the boot time is unknown."""


class ProcessTree:
    """Reads parents and start times under ``proc_root`` (a stand-in directory in tests)."""

    def __init__(self, proc_root: Path = Path("/proc"), *, follow_links: bool = False) -> None:
        self._root = str(proc_root)
        self._follow_links = follow_links
        self._ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
        self._boot_s: float | None = None

    def facts(self, pid: int) -> ProcessFacts | None:
        """The parent and start time of ``pid``; ``None`` when there is no such process (or its stat is garbled)."""
        data = read_bounded_or_none(f"{self._root}/{pid}/stat", _STAT_BYTES, follow_links=self._follow_links)
        parsed = parse_stat(data)
        if parsed is None:
            return None
        ppid, start_ticks = parsed
        boot_s = self._boot_time_s()
        return ProcessFacts(ppid, None if boot_s is None else boot_s + start_ticks / self._ticks_per_s)

    def parents(self) -> dict[int, int]:
        """Every process's parent PID now (a process that vanished while the table was read is left out)."""
        try:
            names = os.listdir(self._root)
        except OSError:
            return {}
        parents: dict[int, int] = {}
        for name in names:
            if name.isdigit():
                facts = self.facts(int(name))
                if facts is not None:
                    parents[int(name)] = facts.ppid
        return parents

    def _boot_time_s(self) -> float | None:
        if self._boot_s is None:
            data = read_bounded_or_none(f"{self._root}/stat", 1 << 16, follow_links=self._follow_links)
            for line in (data or b"").splitlines():
                fields = line.split()
                if len(fields) == 2 and fields[0] == b"btime" and fields[1].isdigit():
                    self._boot_s = float(fields[1])
                    break
        return self._boot_s


def parse_stat(data: bytes | None) -> tuple[int, int] | None:
    """``(ppid, start ticks)`` of a ``/proc/PID/stat`` line: fields 4 and 22 of proc(5), counted after the last
    ``)`` since the command name may hold spaces and parentheses."""
    if not data:
        return None
    close_paren = data.rfind(b")")
    if close_paren < 0:
        return None
    fields = data[close_paren + 2 :].split()
    try:
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def nearest_known(pids: Iterable[int], known: Mapping[int, float], tree: ProcessTree,
                  max_depth: int = MAX_DEPTH, tolerance_s: float = START_TOLERANCE_S) -> dict[int, int]:
    """For each of ``pids``, the nearest of itself and its ancestors that is a ``known`` process (PID -> start time,
    matched within ``tolerance_s``); PIDs under none are left out. The walk stops at PID 1, at a process that is
    gone, and after ``max_depth`` parents; a stat is read once per call even when many PIDs share ancestors."""
    wanted = tuple(pids)
    found: dict[int, int | None] = {}
    for start in wanted:
        path: list[int] = []
        pid = start
        result: int | None = None
        for _ in range(max_depth):
            if pid in found:
                result = found[pid]
                break
            facts = tree.facts(pid)
            if facts is None:
                break
            path.append(pid)
            expected = known.get(pid)
            if expected is not None and facts.started_s is not None and abs(facts.started_s - expected) <= tolerance_s:
                result = pid
                break
            if pid <= 1 or facts.ppid <= 0 or facts.ppid == pid:
                break
            pid = facts.ppid
        else:
            # Cut short: what lies above is unknown, and a walk from a nearer start may still reach a kernel.
            found.setdefault(start, None)
            continue
        for step in path:
            found[step] = result
    return {pid: owner for pid in wanted if (owner := found.get(pid)) is not None}
