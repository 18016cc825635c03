"""What the host knows of the processes NVML lists: user, command line, CPU, memory, start time, cgroup.

It reads ``/proc`` directly rather than through psutil: a warm lookup costs one small read of
``/proc/PID/stat`` per process, several times less than psutil's ``Process`` objects for 400 PIDs (see
``benchmarks/process_lookup.py``). What does not change over a process's life is read once and cached per
(PID, start time), so a recycled PID is a new process. NVML reports host-namespace PIDs; a PID this
``/proc`` does not show (another PID namespace) or that exits during the lookup is simply left out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from nvdash.sampling.bounded_read import read_bounded_or_none
from nvdash.sampling.cgroups import read_cgroup
from nvdash.sampling.process_limits import read_limits
from nvdash.sampling.usage_records import CgroupIdentity, HostProcess, ProcessLimits
from nvdash.sampling.user_names import NameResolver

_SMALL_FILE_BYTES = 4096
_CMDLINE_MAX_BYTES = 1 << 16


class _Stat(NamedTuple):
    """The fields of ``/proc/PID/stat`` that nvdash reads each time, in the kernel's units."""

    cpu_ticks: int
    """User plus system CPU time, in clock ticks."""
    start_ticks: int
    """Start time after boot, in clock ticks: with the PID, it names one process."""
    rss_pages: int
    name: bytes
    """``comm``: set from the executable on ``exec``, so a change means the command line may have changed."""


@dataclass(slots=True)
class _Known:
    """A process seen before: what does not change, and the CPU reading to take the next delta from."""

    start_ticks: int
    name: bytes
    uid: int | None
    command: str
    started_s: float | None
    cgroup: CgroupIdentity
    limits: ProcessLimits | None
    cpu_ticks: int
    seen_s: float


class HostProcessTable:
    """Looks up PIDs in ``proc_root``; host CPU % is the delta since this table last saw the same process.

    User, command line, start time, cgroup and the environment's quota variables (:mod:`nvdash.sampling.process_limits`)
    are read once per (PID, start time); they are read again when
    the process's name changes (an ``exec``), since a process seen between ``fork`` and ``exec`` still
    shows its parent's. User names come from ``names`` (looked up off this thread): ``uid 1234`` until resolved,
    and for a UID the system cannot name. Files are read with bounds (:mod:`nvdash.sampling.bounded_read`): links
    are not followed (``/proc`` has none where nvdash reads) unless ``follow_links`` (a test's stand-in for
    ``/proc`` that links to the real one).
    """

    def __init__(self, proc_root: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic,
                 names: NameResolver | None = None, *, follow_links: bool = False) -> None:
        self._proc_root = proc_root
        self._follow_links = follow_links
        self._names = names if names is not None else NameResolver()
        self._root = str(proc_root)
        self._clock = clock
        self._ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
        self._page_bytes = int(os.sysconf("SC_PAGE_SIZE"))
        self._boot_s: float | None = None
        self._known: dict[int, _Known] = {}
        self._host_pids: bool | None = None

    @property
    def sees_host_pids(self) -> bool:
        """False when this ``/proc`` belongs to a child PID namespace (a container without ``--pid=host``).

        NVML reports host PIDs; in a child namespace the same numbers name other processes (or none), so
        nothing is looked up there. Decided once from ``NSpid`` in ``proc_root/self/status`` (one PID: the
        initial namespace); without that line (old kernels, test roots) the PIDs are taken as host PIDs.
        """
        if self._host_pids is None:
            status = self._read_path(self._proc_root / "self" / "status") or b""
            for line in status.splitlines():
                if line.startswith(b"NSpid:"):
                    self._host_pids = len(line.split()) <= 2
                    break
            else:
                self._host_pids = True
        return self._host_pids

    def lookup(self, pids: Iterable[int], *, prune: bool = True) -> dict[int, HostProcess]:
        """HostProcess for each PID the host can see.

        With ``prune`` (the default) the cache keeps only the PIDs asked about this time; without it, this call
        only adds to the cache (for a second lookup of the same round, e.g. of PIDs first seen in it).
        """
        if not self.sees_host_pids:
            return {}
        now = self._clock()
        found: dict[int, HostProcess] = {}
        known: dict[int, _Known] = {}
        for pid in pids:
            if pid in found or pid <= 0:
                continue
            stat = self._read_stat(pid)
            if stat is None:
                continue
            previous = self._known.get(pid)
            if previous is None or previous.start_ticks != stat.start_ticks:
                entry, cpu_pct = self._identify(pid, stat, stat.cpu_ticks, now), None
            else:
                cpu_pct = self._cpu_pct(previous, stat.cpu_ticks, now)
                same = previous.name == stat.name
                entry = previous if same else self._identify(pid, stat, previous.cpu_ticks, previous.seen_s)
            if entry is None:
                continue
            known[pid] = entry
            found[pid] = HostProcess(
                pid=pid,
                user=None if entry.uid is None else self._user_name(entry.uid),
                command=entry.command,
                cpu_pct=cpu_pct,
                rss_bytes=stat.rss_pages * self._page_bytes,
                started_s=entry.started_s,
                cgroup=entry.cgroup,
                limits=entry.limits,
            )
        if prune:
            self._known = known
        else:
            self._known.update(known)
        return found

    def _cpu_pct(self, entry: _Known, cpu_ticks: int, now: float) -> float | None:
        """CPU % since the entry's reading, which moves to this one; ``None`` if no time has passed."""
        elapsed_s = now - entry.seen_s
        if elapsed_s <= 0:
            return None
        busy_s = max(0, cpu_ticks - entry.cpu_ticks) / self._ticks_per_s
        entry.cpu_ticks, entry.seen_s = cpu_ticks, now
        return 100.0 * busy_s / elapsed_s

    def _identify(self, pid: int, stat: _Stat, cpu_ticks: int, seen_s: float) -> _Known | None:
        """Read what stays fixed for the process's life; ``None`` if the PID changed hands meanwhile."""
        uid = _real_uid(self._read(pid, "status"))
        argv = self._read(pid, "cmdline", _CMDLINE_MAX_BYTES)
        cgroup = read_cgroup(self._proc_root, pid, follow_links=self._follow_links)
        limits = read_limits(self._root, pid, follow_links=self._follow_links)
        again = self._read_stat(pid)
        if again is None or again.start_ticks != stat.start_ticks:
            return None
        boot_s = self._boot_time_s()
        return _Known(
            start_ticks=stat.start_ticks,
            name=again.name,
            uid=uid,
            command=_command(argv) or again.name.decode("utf-8", errors="replace"),
            started_s=None if boot_s is None else boot_s + stat.start_ticks / self._ticks_per_s,
            cgroup=cgroup,
            limits=limits,
            cpu_ticks=cpu_ticks,
            seen_s=seen_s,
        )

    def _read_stat(self, pid: int) -> _Stat | None:
        """The process's CPU time, start time, RSS and name; ``None`` once it is gone."""
        return _parse_stat(self._read_path(f"{self._root}/{pid}/stat"))

    def _read(self, pid: int, name: str, limit: int = _SMALL_FILE_BYTES) -> bytes | None:
        """One ``/proc/PID/<name>`` file, or ``None`` when the process is gone or the file unreadable."""
        return self._read_path(f"{self._root}/{pid}/{name}", limit)

    def _read_path(self, path: str | Path, limit: int = _SMALL_FILE_BYTES) -> bytes | None:
        """Up to ``limit`` bytes of a regular file, or ``None`` when it cannot be read (or is refused)."""
        return read_bounded_or_none(path, limit, follow_links=self._follow_links)

    def _boot_time_s(self) -> float | None:
        """Boot time (epoch seconds) from ``btime`` in ``proc_root/stat``, as ``ps`` and psutil take it."""
        if self._boot_s is None:
            self._boot_s = _btime(self._read_path(self._proc_root / "stat"))
        return self._boot_s

    def _user_name(self, uid: int) -> str:
        """The user's name once the resolver has it; ``uid 1234`` meanwhile or when the system has none."""
        return self._names.user(uid) or f"uid {uid}"


def _parse_stat(data: bytes | None) -> _Stat | None:
    """``pid (comm) state ...``: comm may hold spaces and parentheses, so the fields start after the last ``)``.

    Counted from 1 in proc(5): utime 14, stime 15, starttime 22, rss 24; ``fields`` starts at field 3.
    """
    if not data:
        return None
    open_paren = data.find(b"(")
    close_paren = data.rfind(b")")
    if open_paren < 0 or close_paren < open_paren:
        return None
    fields = data[close_paren + 2 :].split(None, 22)  # fields 3 to 24 apart; the rest stays in one piece
    try:
        cpu_ticks = int(fields[11]) + int(fields[12])
        return _Stat(cpu_ticks, int(fields[19]), max(0, int(fields[21])), data[open_paren + 1 : close_paren])
    except (IndexError, ValueError):
        return None


def _btime(stat: bytes | None) -> float | None:
    """``btime`` (boot time, whole epoch seconds) from the system-wide ``/proc/stat``."""
    for line in (stat or b"").splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == b"btime" and fields[1].isdigit():
            return float(fields[1])
    return None


def _real_uid(status: bytes | None) -> int | None:
    """The real uid from ``/proc/PID/status`` (``Uid:`` real, effective, saved, filesystem)."""
    if status is None:
        return None
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def _command(argv: bytes | None) -> str:
    """The command line with its NUL-separated arguments joined by spaces; ``""`` when there is none."""
    if not argv:
        return ""
    return " ".join(argv.rstrip(b"\0").decode("utf-8", errors="replace").split("\0"))
