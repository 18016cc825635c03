"""The host's processes as the extension sees them (the one module of :mod:`nvdash.jupyter` that reads them).

A process's start time tells a kernel from a later process that reused its id. Each kernel's process tree now
(the processes it started, for the nearest kernel only) is read from one snapshot of the process table (every
process's parent), so a kernel's tree and another's agree: a process below two kernels (a kernel started from a
kernel) belongs to the nearer one, and the walk down from a kernel stops at another kernel's process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import psutil


def process_start_s(pid: int) -> float | None:
    """The start time of process ``pid`` (seconds since the epoch), ``None`` when it is gone or hidden."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_parents() -> dict[int, int]:
    """Every process's parent process id, as the host reports them now (a process that vanished is left out)."""
    parents: dict[int, int] = {}
    for process in psutil.process_iter(["ppid"]):
        parent = process.info.get("ppid")
        if isinstance(parent, int):
            parents[process.pid] = parent
    return parents


def kernel_descendants(kernel_pids: Iterable[int], parents: Mapping[int, int]) -> dict[int, list[int]]:
    """For each kernel process, the processes below it (sorted), not descending into another kernel's tree."""
    kernels = set(kernel_pids)
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        if pid != parent:
            children.setdefault(parent, []).append(pid)
    result: dict[int, list[int]] = {}
    for kernel in kernels:
        found: list[int] = []
        pending = list(children.get(kernel, ()))
        seen = {kernel}
        while pending:
            pid = pending.pop()
            if pid in seen or pid in kernels:
                continue
            seen.add(pid)
            found.append(pid)
            pending.extend(children.get(pid, ()))
        result[kernel] = sorted(found)
    return result
