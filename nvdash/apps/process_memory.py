"""Who fills each GPU: one stacked bar per GPU (and per MIG instance, under its GPU) with a segment per process,
largest first, the small tail as "other", the used memory no listed process accounts for, and the free part.

Bars run on a 0-100 % of-own-total axis (GPUs and MIG instances differ in size); hovers carry the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from nvdash.apps.figures import BACKGROUND_ALPHA, LOST_COLOR, gpu_label
from nvdash.apps.process_table import short_command, user_text
from nvdash.apps.process_usage import GPU_BAR_HEIGHT, MIG_BAR_HEIGHT, gpu_usage, mig_rows
from nvdash.apps.rows import gpu_memory_total, gpu_reading
from nvdash.sampling.records import GpuInfo, Snapshot
from nvdash.sampling.usage_records import GpuProcess, Usage
from nvdash.units import format_bytes, format_bytes_of, format_pct

TOP_PROCESSES = 6
"""Processes drawn one by one on a bar; the rest are summed as "other"."""
INSIDE_LABEL_PCT = 12.0
"""A process segment at least this wide (in % of the bar) carries its PID and user inside."""
PROCESS_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#e377c2")
"""By a process's rank on its GPU's bar (so neighbours differ), kept on its MIG instance's bar; brown and grey
mean "not attributed" and "other"."""
OTHER_COLOR = "#7f7f7f"
UNATTRIBUTED_COLOR = "#8c564b"

PROCESS, OTHER, UNATTRIBUTED, FREE, LOST = "process", "other", "not attributed", "free", "lost"

SEGMENT_COLUMNS = ("row", "height", "part", "left", "right", "bytes", "color", "alpha", "hatch", "pid", "user",
                   "command", "memory", "inside")
LABEL_COLUMNS = ("row", "label")


class Segment(NamedTuple):
    """One piece of a bar: a process, the "other" tail, the unattributed part, the free part, or a lost GPU."""

    part: str
    bytes: float | None
    process: GpuProcess | None = None
    note: str = ""
    """What the hover says in the command field for a segment that is not one process."""


def bar_segments(processes: Sequence[GpuProcess], used: int | None, total: int | None,
                 unattributed_note: str) -> list[Segment]:
    """The segments of one bar, in drawing order; process memory beyond the used figure (readings taken a moment
    apart) leaves no unattributed part rather than a negative one."""
    known = sorted((p for p in processes if p.gpu_memory_bytes), key=lambda p: -(p.gpu_memory_bytes or 0))
    segments = [Segment(PROCESS, float(p.gpu_memory_bytes or 0), p) for p in known[:TOP_PROCESSES]]
    tail = known[TOP_PROCESSES:]
    if tail:
        count = len(tail)
        segments.append(Segment(OTHER, float(sum(p.gpu_memory_bytes or 0 for p in tail)),
                                note=f"{count} smaller process{'es' if count > 1 else ''}"))
    attributed = sum(p.gpu_memory_bytes or 0 for p in known)
    if used is not None:
        segments.append(Segment(UNATTRIBUTED, float(max(0, used - attributed)), note=unattributed_note))
        if total is not None:
            segments.append(Segment(FREE, float(max(0, total - max(used, attributed))), note="free memory"))
    return segments


def _unattributed_note(usage: Usage | None, index: int) -> str:
    gpu = gpu_usage(usage, index)
    if usage is None:
        return "used memory (processes not read yet)"
    if gpu is not None and not gpu.processes_readable:
        return "used memory (NVML did not list the processes)"
    return "used memory no listed process accounts for"


def _color(segment: Segment, ranks: dict[int, int]) -> tuple[str, float, str]:
    """``(colour, alpha, hatch)`` of a segment; ``ranks`` numbers the processes of its GPU by memory."""
    if segment.process is not None:
        return PROCESS_COLORS[ranks.get(segment.process.pid, 0) % len(PROCESS_COLORS)], 0.9, " "
    if segment.part == OTHER:
        return OTHER_COLOR, 0.8, " "
    if segment.part == UNATTRIBUTED:
        return UNATTRIBUTED_COLOR, 0.5, "/"
    return LOST_COLOR, 1.0 if segment.part == LOST else BACKGROUND_ALPHA, " "


def _inside(process: GpuProcess) -> str:
    """The text inside a wide process segment: its PID, and its user where known."""
    user = None if process.host is None else process.host.user
    return f"{process.pid} {user}" if user else str(process.pid)


def _add_bar(data: dict[str, list[Any]], row: str, segments: Sequence[Segment], total: int | None, *,
             height: float, ranks: dict[int, int]) -> None:
    left = 0.0
    for segment in segments:
        share = 100.0 if segment.part == LOST else 100.0 * (segment.bytes or 0.0) / total if total else 0.0
        color, alpha, hatch = _color(segment, ranks)
        process = segment.process
        pid = "" if process is None else str(process.pid)
        user = "" if process is None else user_text(process)
        command = segment.note
        if process is not None:
            command = user_text(process) if process.host is None else short_command(process.host.command or "n/a")
        values = {
            "row": row, "height": height, "part": segment.part, "left": left, "right": left + share,
            "bytes": math.nan if segment.bytes is None else segment.bytes,
            "color": color, "alpha": alpha, "hatch": hatch, "pid": pid, "user": user, "command": command,
            "memory": "n/a" if segment.part == LOST else f"{format_bytes(segment.bytes)} ({format_pct(share)})",
            "inside": _inside(process) if process is not None and share >= INSIDE_LABEL_PCT else "",
        }
        for name, value in values.items():
            data[name].append(value)
        left += share


def _label(used: int | None, total: int | None, processes: Sequence[GpuProcess], usage: Usage | None,
           index: int) -> str:
    text = format_bytes_of(used, total)
    gpu = gpu_usage(usage, index)
    if usage is None:
        return text
    if gpu is not None and not gpu.processes_readable:
        return f"{text}, processes not listed"
    count = len(processes)
    return f"{text}, {count} process{'' if count == 1 else 'es'}"


def memory_columns(gpus: Sequence[GpuInfo], snapshot: Snapshot | None) -> tuple[dict[str, list[Any]],
                                                                                  dict[str, list[Any]]]:
    """``(segments, labels)``: the bars' segments, and one label per row (``used / total, N processes``).

    GPU rows use the newest snapshot's memory figures; processes and MIG instances come from its usage reading.
    """
    segments: dict[str, list[Any]] = {name: [] for name in SEGMENT_COLUMNS}
    labels: dict[str, list[Any]] = {name: [] for name in LABEL_COLUMNS}
    usage = None if snapshot is None else snapshot.usage
    processes = () if usage is None else usage.processes
    for gpu in gpus:
        sample, lost = gpu_reading(snapshot, gpu.index)
        on_gpu = [p for p in processes if p.gpu_index == gpu.index]
        used = None if sample is None else sample.memory_used_bytes
        total = gpu_memory_total(gpu, sample)
        note = _unattributed_note(usage, gpu.index)
        ranks = {p.pid: rank for rank, p in enumerate(sorted(on_gpu, key=lambda p: -(p.gpu_memory_bytes or 0)))}
        rows = [(gpu_label(gpu), on_gpu, used, total, GPU_BAR_HEIGHT)]
        rows += [(label, [p for p in on_gpu if p.mig_uuid == inst.uuid], inst.memory_used_bytes,
                  inst.memory_total_bytes, MIG_BAR_HEIGHT) for label, inst in mig_rows(usage, gpu.index)]
        for row, listed, row_used, row_total, height in rows:
            bar = [Segment(LOST, None, note="GPU lost")] if lost else bar_segments(listed, row_used, row_total, note)
            _add_bar(segments, row, bar, row_total, height=height, ranks=ranks)
            labels["row"].append(row)
            labels["label"].append("lost" if lost else _label(row_used, row_total, listed, usage, gpu.index))
    return segments, labels
