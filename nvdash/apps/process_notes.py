"""The words of the GPU Processes page: what a usage reading covers and leaves out, and the pods that hold a
GPU without running anything on it ("allocated, idle")."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from nvdash.apps.process_usage import device_text
from nvdash.sampling.usage_records import Usage

COLLECTING = "Collecting processes..."
SHARING_NAMES = {"whole": "whole GPU", "mig": "MIG", "shared": "shared", "mps": "MPS", "vgpu": "vGPU"}
IDLE_COLUMNS = {"namespace": ("namespace", 120), "pod": ("pod", 180), "container": ("container", 140),
                "resource": ("resource", 210), "device": ("device", 330), "gpu": ("GPU", 190),
                "type": ("GPU type", 90)}
"""The idle allocations table's columns: title and width."""

_MUTED = "opacity: 0.7;"


def idle_columns(usage: Usage | None) -> dict[str, list[Any]]:
    """The "allocated, idle" table: devices the kubelet gave a pod on which that pod runs no process (a DRA device
    nvdash could not map to a GPU says why in the GPU column)."""
    data: dict[str, list[Any]] = {name: [] for name in IDLE_COLUMNS}
    if usage is None:
        return data
    for device in usage.idle_allocations():
        for name, value in (("namespace", device.namespace), ("pod", device.pod), ("container", device.container),
                            ("resource", device.resource_name), ("device", device.device_id),
                            ("gpu", f"unknown GPU: {device.note}" if device.note else device_text(usage, device.uuid)),
                            ("type", SHARING_NAMES.get(device.sharing, device.sharing))):
            data[name].append(value)
    return data


def _gpu_list(indices: Sequence[int]) -> str:
    names = [f"GPU {index}" for index in indices]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def status_lines(usage: Usage | None) -> list[str]:
    """Plain sentences on what the reading covers: its size, the kubelet's answer, and what NVML left out."""
    if usage is None:
        return [COLLECTING, "Who uses each GPU appears with the first reading, within a few seconds; until then "
                "the bars show each GPU's used memory as a whole."]
    count, on = len(usage.processes), len({p.gpu_index for p in usage.processes})
    lines = [f"{count} process{'' if count == 1 else 'es'} on {on} GPU{'' if on == 1 else 's'}." if count
             else "No process is using a GPU."]
    lines.append(usage.pods.status)
    unreadable = [gpu.index for gpu in usage.gpus if not gpu.processes_readable]
    if unreadable:
        lines.append(f"NVML would not list the processes of {_gpu_list(unreadable)}: "
                     "their used memory shows as not attributed.")
    unreported = [gpu.index for gpu in usage.gpus if gpu.processes_readable and not gpu.process_utilization]
    if unreported:
        lines.append(f"{_gpu_list(unreported)} do{'es' if len(unreported) == 1 else ''} not report per-process "
                     "utilization: SM % reads \"not reported\".")
    hidden = sum(1 for p in usage.processes if p.host is None)
    if hidden:
        lines.append(f"{hidden} process{'' if hidden == 1 else 'es'} not visible from here (another PID "
                     "namespace, or exited): user, command and host figures unknown.")
    return lines


def status_html(usage: Usage | None) -> str:
    """The status lines as HTML: the first stands out, the rest are muted."""
    first, *rest = status_lines(usage)
    muted = "".join(f'<br><span style="{_MUTED}">{escape(line)}</span>' for line in rest)
    return f"<b>{escape(first)}</b>{muted}"


def idle_note(usage: Usage | None, any_idle: bool) -> str:
    """What the idle section says when its table has no row."""
    if usage is None or any_idle:
        return ""
    if not usage.pods.available:
        return "Not known without the kubelet's list of pods (see the status above)."
    return "None: every GPU allocated to a pod runs a process of that pod."
