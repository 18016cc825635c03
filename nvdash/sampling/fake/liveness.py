"""Whether a listed host process has exited, as the driver knows it: NVML stops listing a process (and frees its
memory) once the process exits.

A PID counts as exited once it was seen alive under the proc root and later is gone, is a zombie (the driver
frees a process's contexts as its files close on exit, before its parent reaps it), or has another start time in
``/proc/PID/stat`` (the PID was reused: the process seen is gone). A PID never seen alive (a made-up one, or one in
another PID namespace) is never taken for exited. Exited is final. Each PID's check is cached for ``ttl_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

TTL_S = 0.2
"""How long one look at ``/proc/PID`` stands: a listing call costs a dictionary lookup in between."""
_STAT_LIMIT = 4096
_GONE_STATES = frozenset("ZXx")
"""Zombie and dead: the process has exited (``proc(5)``: state, the field after the command's closing parenthesis)."""


def start_time(proc_root: Path, pid: int) -> int | None:
    """The start time (clock ticks after boot) of a running ``pid``; None when it does not exist or has exited."""
    try:
        with (proc_root / str(pid) / "stat").open("rb") as stat:
            text = stat.read(_STAT_LIMIT)
    except OSError:
        return None
    fields = text.rpartition(b")")[2].split()
    # After the command: state (field 3) ... starttime (field 22), so index 0 and 19 of what follows.
    if len(fields) < 20 or fields[0].decode(errors="replace") in _GONE_STATES:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


class ProcessLiveness:
    """Tells exited PIDs from those alive or never seen (thread-safe)."""

    def __init__(self, proc_root: str | Path = "/proc", clock: Callable[[], float] = time.monotonic,
                 ttl_s: float = TTL_S) -> None:
        self._proc_root = Path(proc_root)
        self._clock = clock
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._started: dict[int, int] = {}
        """Start time of each PID seen alive."""
        self._checked: dict[int, float] = {}
        self._exited: set[int] = set()

    def exited(self, pid: int) -> bool:
        """Whether ``pid`` was seen alive and has exited since (looks again at most every ``ttl_s``)."""
        now = self._clock()
        with self._lock:
            if pid in self._exited:
                return True
            checked = self._checked.get(pid)
            if checked is not None and 0 <= now - checked < self._ttl_s:
                return False
            self._checked[pid] = now
        started = start_time(self._proc_root, pid)
        with self._lock:
            seen = self._started.get(pid)
            if seen is None:
                if started is not None:
                    self._started[pid] = started
                return False
            if started != seen:
                self._exited.add(pid)
                self._checked.pop(pid, None)
                return True
            return False
