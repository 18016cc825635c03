"""The GPU process table: one row per process and GPU, formatted for reading, filtered on the server.

Numbers keep a numeric column (for sorting by clicking a header) next to the text shown in the cell.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nvdash.apps.process_usage import process_mig_text
from nvdash.sampling.usage_records import PROCESS_KINDS, CgroupIdentity, GpuProcess, Usage
from nvdash.units import format_bytes, format_pct

ALL = "all"
"""A filter's value that keeps every row."""
NOT_VISIBLE = "not visible from here"
"""What the host-side cells say for a PID in another PID namespace (or one that has exited)."""
NOT_REPORTED = "not reported"
"""The SM % of a process on a GPU that does not report per-process utilization (e.g. MIG)."""
COMMAND_CHARS = 80
"""Commands longer than this are cut in the cell; the full text is in its tooltip."""
SHORT_ID_CHARS = 12

_KIND_NAMES = {"compute": "compute", "graphics": "graphics", "mps": "MPS"}

TABLE_COLUMNS = (
    "gpu", "mig", "pid", "user", "container", "container_full", "pod", "namespace", "type", "memory_bytes", "memory",
    "sm_pct", "sm", "cpu_pct", "cpu", "rss_bytes", "rss", "runtime_s", "runtime", "command", "command_full")


@dataclass(frozen=True, slots=True)
class ProcessFilter:
    """What the viewer chose to see: ``None`` (or ``ALL`` in the widgets) keeps every value."""

    gpu: int | None = None
    user: str | None = None
    namespace: str | None = None
    pod: str | None = None
    text: str = ""
    """A piece of the command line, matched without regard to case."""

    def keeps(self, process: GpuProcess) -> bool:
        """True when ``process`` passes every filter."""
        host = process.host
        command = "" if host is None or host.command is None else host.command
        return ((self.gpu is None or process.gpu_index == self.gpu)
                and (self.user is None or user_text(process) == self.user)
                and (self.namespace is None or process.pod_namespace == self.namespace)
                and (self.pod is None or process.pod_name == self.pod)
                and self.text.strip().lower() in command.lower())


KEEP_ALL = ProcessFilter()


def format_runtime(seconds: float | None) -> str:
    """How long a process has run: ``45 s``, ``12m 5s``, ``3h 12m``, ``2d 3h``; ``n/a`` when unknown."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    whole = max(0, int(seconds))
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs} s"


def kinds_text(kinds: Iterable[str]) -> str:
    """How a process uses its GPU, e.g. ``compute+graphics`` or ``MPS``."""
    present = set(kinds)
    return "+".join(_KIND_NAMES[kind] for kind in PROCESS_KINDS if kind in present)


def user_text(process: GpuProcess) -> str:
    """The process's user, or why it is not known."""
    if process.host is None:
        return NOT_VISIBLE
    return process.host.user or "n/a"


def _cgroup(process: GpuProcess) -> CgroupIdentity:
    return CgroupIdentity() if process.host is None else process.host.cgroup


def container_text(process: GpuProcess) -> str:
    """The container a process runs in as its runtime and short id (``containerd 0123456789ab``); else its
    name in the pod, or its Slurm job; blank outside containers and jobs."""
    cgroup = _cgroup(process)
    where = " ".join(part for part in (cgroup.runtime, (cgroup.container_id or "")[:SHORT_ID_CHARS]) if part)
    if where or process.container_name:
        return where or process.container_name or ""
    return "" if cgroup.slurm_job is None else f"Slurm job {cgroup.slurm_job}"


def container_detail(process: GpuProcess) -> str:
    """The container's name in its pod and its full id, for the cell's tooltip."""
    cgroup = _cgroup(process)
    return " ".join(part for part in (process.container_name, cgroup.runtime, cgroup.container_id) if part)


def short_command(command: str) -> str:
    """The command as the cell shows it: cut to ``COMMAND_CHARS`` with an ellipsis."""
    return command if len(command) <= COMMAND_CHARS else command[:COMMAND_CHARS - 1] + "…"


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _row(usage: Usage, process: GpuProcess) -> dict[str, Any]:
    host = process.host
    command = NOT_VISIBLE if host is None else host.command or "n/a"
    runtime = None if host is None or host.started_s is None else max(0.0, usage.time_s - host.started_s)
    cpu = None if host is None else host.cpu_pct
    rss = None if host is None else host.rss_bytes
    return {
        "gpu": process.gpu_index, "mig": process_mig_text(usage, process), "pid": process.pid,
        "user": user_text(process), "container": container_text(process),
        "container_full": container_detail(process), "pod": process.pod_name or "",
        "namespace": process.pod_namespace or "", "type": kinds_text(process.kinds),
        "memory_bytes": _number(process.gpu_memory_bytes), "memory": format_bytes(process.gpu_memory_bytes),
        "sm_pct": _number(process.sm_pct),
        "sm": NOT_REPORTED if process.sm_pct is None else format_pct(process.sm_pct),
        "cpu_pct": _number(cpu), "cpu": format_pct(cpu), "rss_bytes": _number(rss), "rss": format_bytes(rss),
        "runtime_s": _number(runtime), "runtime": format_runtime(runtime),
        "command": short_command(command), "command_full": command,
    }


def ordered(processes: Iterable[GpuProcess]) -> list[GpuProcess]:
    """By GPU, then the largest memory holder first, then PID."""
    return sorted(processes, key=lambda p: (p.gpu_index, -(p.gpu_memory_bytes or 0), p.pid))


def table_columns(usage: Usage | None, keep: ProcessFilter = KEEP_ALL) -> dict[str, list[Any]]:
    """The process table's source: the processes ``keep`` lets through, by GPU and memory; empty before the
    first usage reading. The runtime is counted up to the reading's own time."""
    data: dict[str, list[Any]] = {name: [] for name in TABLE_COLUMNS}
    if usage is None:
        return data
    for process in ordered(p for p in usage.processes if keep.keeps(p)):
        for name, value in _row(usage, process).items():
            data[name].append(value)
    return data


def choices(present: Iterable[str], selected: str) -> list[str]:
    """A filter's options: ``ALL``, the values present, and the selected one even when it has gone (so the
    viewer's choice survives an update)."""
    values = {value for value in present if value}
    if selected != ALL:
        values.add(selected)
    return [ALL, *sorted(values)]


def filter_values(usage: Usage | None) -> dict[str, list[str]]:
    """The values each text filter can take now: ``user``, ``namespace`` and ``pod``."""
    processes: Sequence[GpuProcess] = () if usage is None else usage.processes
    return {
        "user": sorted({user_text(p) for p in processes}),
        "namespace": sorted({p.pod_namespace for p in processes if p.pod_namespace}),
        "pod": sorted({p.pod_name for p in processes if p.pod_name}),
    }
