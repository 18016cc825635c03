"""The quotas table of the GPU Processes page: each vGPU or MPS quota against its use, and its finding.

One row per grant (:attr:`~nvdash.sampling.usage_records.Usage.grants`: GPU-Manager from the kubelet, HAMi and MPS
from the environment of a pod's processes): the compute quota against the pod's SM share of the GPU (the snapshot's
shares, else its processes' ``sm_pct``; see :func:`~nvdash.health.quotas.grant_use`), the memory quota against the
memory its processes hold, and the judged findings (:mod:`nvdash.health.quota_judge`) flagged. Then one row per MPS
client outside any pod whose environment sets MPS limits, against its PID (its memory over the pinned limit is
flagged; its compute is shown, not judged), and one row per use of a GPU nobody was allocated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from bokeh.models.widgets import HTMLTemplateFormatter, TableColumn

from nvdash.health.quota_judge import SUSTAIN_READINGS
from nvdash.health.quotas import COMPUTE_TOLERANCE_PCT, SCHEME_NAMES, QuotaFinding, grant_use
from nvdash.sampling.grants import limits_per_gpu
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.usage_records import GpuProcess, Grant, Usage
from nvdash.units import format_bytes, format_pct

QUOTA_COLUMNS = {
    "owner": ("pod / container", 230),
    "scheme": ("quota", 95),
    "source": ("read from", 105),
    "gpu": ("GPU", 70),
    "core": ("compute quota", 100),
    "sm": ("SM use", 75),
    "memory_quota": ("memory quota", 100),
    "memory": ("memory used", 95),
    "finding": ("finding", 420),
}
"""The shown columns: title and width; the numbers sort by their numeric twins (``core_pct``, ``sm_pct``,
``memory_quota_bytes``, ``memory_bytes``)."""
FINDING_NAMES = {"memory_over_quota": "memory over quota", "compute_over_quota": "compute above quota",
                 "quota_unused": "quota unused", "unallocated_use": "use without allocation"}
FLAG = "\u26a0 "
FLAG_COLOR = "#d62728"
PENDING = "above quota now (not sustained)"
PENDING_COLOR = "#8c8c8c"
_NUMBERS = {"core": "core_pct", "sm": "sm_pct", "memory_quota": "memory_quota_bytes", "memory": "memory_bytes"}
_EXTRA = ("finding_text", "flag_color")
_RIGHT = '<div style="text-align:right"><%- {} %></div>'
_FINDING = ('<span style="color:<%- flag_color %>" title="<%- finding_text %>"><%- finding %></span>')


def quota_table_columns() -> list[TableColumn]:
    """The table's columns; numbers are right-aligned text that sorts by its twin, findings coloured."""
    made = []
    for name, (title, width) in QUOTA_COLUMNS.items():
        numeric = _NUMBERS.get(name)
        if numeric is not None:
            made.append(TableColumn(field=numeric, title=title, width=width,
                                    formatter=HTMLTemplateFormatter(template=_RIGHT.format(name))))
        elif name == "finding":
            made.append(TableColumn(field=name, title=title, width=width,
                                    formatter=HTMLTemplateFormatter(template=_FINDING)))
        else:
            made.append(TableColumn(field=name, title=title, width=width))
    return made


def _who(namespace: str, pod: str, container: str) -> str:
    return "/".join(part for part in (namespace, pod, container) if part)


def _gpu(uuid: str | None, usage: Usage) -> str:
    if uuid is None:
        return "not named"
    return next((f"GPU {gpu.index}" for gpu in usage.gpus if gpu.uuid == uuid), uuid)


def _finding(found: Sequence[QuotaFinding]) -> tuple[str, str, str]:
    """The finding cell (flagged names), its tooltip (the sentences) and its colour."""
    if not found:
        return "", "", ""
    names = ", ".join(dict.fromkeys(FINDING_NAMES.get(f.kind, f.kind) for f in found))
    return FLAG + names, " ".join(f.text + "." for f in found), FLAG_COLOR


def _grant_findings(grant: Grant, findings: Sequence[QuotaFinding]) -> list[QuotaFinding]:
    return [f for f in findings if f.kind != "unallocated_use"
            and (f.namespace, f.pod, f.container, f.scheme) == (grant.namespace, grant.pod, grant.container,
                                                               grant.scheme)
            and (grant.gpu_uuid is None or f.gpu_uuid == grant.gpu_uuid)]


def _process_sm(process: GpuProcess, shares: Sequence[UnitShares]) -> float | None:
    """A process's SM % from the shares (owner ``pid N`` on its GPU), else its own reading."""
    for unit in shares:
        if unit.unit == process.gpu_uuid:
            for owner in unit.owners:
                if owner.owner.kind == "process" and owner.owner.pid == process.pid and owner.sm_pct is not None:
                    return owner.sm_pct
    return process.sm_pct


def quota_columns(usage: Usage | None, shares: Sequence[UnitShares],
                  findings: Sequence[QuotaFinding]) -> dict[str, list[Any]]:
    """The table's source: grants in their order, MPS clients outside pods by PID, then unallocated use; empty
    when there is nothing to show. Unknown numbers are NaN (``n/a``); no quota is NaN (``none``)."""
    data: dict[str, list[Any]] = {name: [] for name in (*QUOTA_COLUMNS, *_NUMBERS.values(), *_EXTRA)}
    if usage is None:
        return data

    for grant in usage.grants:
        use = grant_use(usage.processes, grant, shares)
        gpu = grant.gpu_uuid or (next(iter(use.gpus)) if len(use.gpus) == 1 else None)
        mine = _grant_findings(grant, findings)
        flagged = _finding(mine)
        if (not mine and grant.core_pct is not None and use.sm_pct is not None
                and use.sm_pct > grant.core_pct + COMPUTE_TOLERANCE_PCT):
            flagged = (PENDING, f"Above the core quota in this reading only; flagged after {SUSTAIN_READINGS} "
                       "readings in a row.", PENDING_COLOR)
        _add(data, _Row(_who(grant.namespace, grant.pod, grant.container), SCHEME_NAMES.get(grant.scheme, grant.scheme),
                        grant.source, _gpu(gpu, usage), grant.core_pct, use.sm_pct, grant.memory_bytes,
                        use.memory_bytes if use.processes else 0, flagged))
    for process in usage.processes:
        limits = process.host.limits if process.host is not None else None
        if limits is None or process.pod_name is not None:
            continue
        for uuid, core, memory_quota in limits_per_gpu(process, limits, limits.mps_pinned_memory_bytes,
                                                       limits.mps_thread_pct):
            if uuid != process.gpu_uuid:
                continue
            held = process.gpu_memory_bytes
            over = memory_quota is not None and held is not None and held > memory_quota
            flagged = (FLAG + FINDING_NAMES["memory_over_quota"],
                       f"pid {process.pid} holds {format_bytes(held)}, over its pinned memory limit of "
                       f"{format_bytes(memory_quota)}.", FLAG_COLOR) if over else ("", "", "")
            _add(data, _Row(f"pid {process.pid} (no pod)", SCHEME_NAMES["mps"], "environment", _gpu(uuid, usage),
                            core, _process_sm(process, shares), memory_quota, held, flagged))
    for found in findings:
        if found.kind == "unallocated_use":
            _add(data, _Row(_who(found.namespace, found.pod, found.container) or "outside any pod", "no allocation",
                            "", _gpu(found.gpu_uuid, usage), None, _unallocated_sm(usage, found), None,
                            int(found.used or 0), _finding([found])))
    return data


class _Row(NamedTuple):
    owner: str
    scheme: str
    source: str
    gpu: str
    core_pct: float | None
    sm_pct: float | None
    memory_quota_bytes: int | None
    memory_bytes: int | None
    flagged: tuple[str, str, str]
    """The finding cell, its tooltip and its colour."""


def _add(data: dict[str, list[Any]], row: _Row) -> None:
    finding, text, color = row.flagged
    for name, value in (
        ("owner", row.owner), ("scheme", row.scheme), ("source", row.source), ("gpu", row.gpu),
        ("core", "none" if row.core_pct is None else f"{row.core_pct:g} %"), ("sm", format_pct(row.sm_pct)),
        ("memory_quota", "none" if row.memory_quota_bytes is None else format_bytes(row.memory_quota_bytes)),
        ("memory", format_bytes(row.memory_bytes)), ("finding", finding),
        ("core_pct", _number(row.core_pct)), ("sm_pct", _number(row.sm_pct)),
        ("memory_quota_bytes", _number(row.memory_quota_bytes)), ("memory_bytes", _number(row.memory_bytes)),
        ("finding_text", text), ("flag_color", color),
    ):
        data[name].append(value)


def _unallocated_sm(usage: Usage, found: QuotaFinding) -> float | None:
    sms = [p.sm_pct for p in usage.processes if p.gpu_uuid == found.gpu_uuid
           and (p.pod_namespace or "", p.pod_name or "", p.container_name or "") == (found.namespace, found.pod,
                                                                                     found.container)
           and p.sm_pct is not None]
    return min(100.0, sum(sms)) if sms else None


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)
