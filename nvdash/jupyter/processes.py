"""The host's processes as the extension sees them (the one module of :mod:`nvdash.jupyter` that reads them).

Read from ``/proc`` by :class:`nvdash.sampling.process_tree.ProcessTree`, the reader nvdash joins GPU processes to
kernels with, so a kernel's start time written here is computed exactly as nvdash computes it when it checks that
a PID is still that kernel's (a process that reused the id is not taken for it). Each kernel's process tree now
(the processes it started, for the nearest kernel only) is read from one snapshot of the process table (every
process's parent), so a kernel's tree and another's agree: a process below two kernels (a kernel started from a
kernel) belongs to the nearer one, and the walk down from a kernel stops at another kernel's process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nvdash.sampling.process_tree import ProcessTree


def process_start_s(pid: int, tree: ProcessTree | None = None) -> float | None:
    """The start time of process ``pid`` (seconds since the epoch), ``None`` when it is gone or hidden."""
    facts = (tree or ProcessTree()).facts(pid)
    return None if facts is None else facts.started_s


def process_parents(tree: ProcessTree | None = None) -> dict[int, int]:
    """Every process's parent process id, as the host reports them now (a process that vanished is left out)."""
    return (tree or ProcessTree()).parents()


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
