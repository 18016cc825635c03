"""``/api/notebooks.json``: which of the Jupyter server's kernels (notebooks) hold which GPU, from the latest
snapshot's :class:`~nvdash.sampling.notebook_records.NotebookView`.

Served only by an nvdash started with ``--jupyter-kernels`` (404 otherwise). Memory in bytes, SM in percent,
times in seconds since the epoch; ``null`` means unknown. The top-level ``memory_bytes`` adds up the local kernels
(a remote kernel holds nothing here); it is ``null`` when one of them is unknown or the join could not be made.
"""

from __future__ import annotations

from typing import Any

from nvdash.sampling.notebook_records import KernelGpuUse, KernelUse, NotebookView
from nvdash.sampling.notebooks import WAITING_FIRST, processes_off_view
from nvdash.server.pages import JsonAnswer
from nvdash.settings import Settings
from nvdash.store import Store

NOT_STARTED_BY_JUPYTER = ("nvdash was not started with --jupyter-kernels (by a Jupyter server), so it knows no "
                          "notebooks.")
JOIN_FAILED = "nvdash could not join the kernels to the latest process reading (see its log)."


def gpu_json(unit: KernelGpuUse) -> dict[str, Any]:
    """One kernel's use of one GPU or MIG instance."""
    return {"index": unit.gpu_index, "uuid": unit.gpu_uuid, "mig_uuid": unit.mig_uuid,
            "memory_bytes": unit.memory_bytes, "sm_pct": unit.sm_pct, "pids": list(unit.pids)}


def kernel_json(use: KernelUse, time_s: float) -> dict[str, Any]:
    """One kernel: what Jupyter says of it and what it holds."""
    kernel = use.kernel
    idle_since = use.idle_since_s
    return {
        "id": kernel.id,
        "name": kernel.name,
        "title": kernel.title,
        "local": kernel.local,
        "pid": kernel.pid,
        "execution_state": kernel.execution_state,
        "sessions": [{"path": s.path, "name": s.name, "type": s.type} for s in kernel.sessions],
        "memory_bytes": use.memory_bytes,
        "sm_pct": use.sm_pct,
        "sm_pct_1min": use.sm_pct_1min,
        "idle_since": idle_since,
        "idle_s": None if idle_since is None else max(0.0, time_s - idle_since),
        "holding_since": use.holding_since_s,
        "gpus": [gpu_json(unit) for unit in use.gpus],
        "pids": sorted({pid for unit in use.gpus for pid in unit.pids}),
    }


def view_json(view: NotebookView) -> dict[str, Any]:
    """The document for one view."""
    local = [use.memory_bytes for use in view.kernels if use.kernel.local]
    known = view.state == "ok" and all(value is not None for value in local)
    return {
        "state": view.state,
        "reason": view.reason,
        "time": view.time_s or None,
        "base_url": view.base_url,
        "memory_bytes": sum(value for value in local if value is not None) if known else None,
        "kernels": [kernel_json(use, view.time_s) for use in view.kernels],
    }


def notebooks_json(store: Store, settings: Settings) -> dict[str, Any] | JsonAnswer:
    """The document ``/api/notebooks.json`` serves; a 404 answer without ``--jupyter-kernels``."""
    if settings.jupyter_kernels is None:
        return JsonAnswer({"error": NOT_STARTED_BY_JUPYTER}, 404)
    if settings.process_interval_s <= 0:
        return view_json(processes_off_view())
    latest = store.latest()
    if latest is None or latest.usage is None:
        return view_json(NotebookView("waiting", WAITING_FIRST))
    if latest.notebooks is None:
        return view_json(NotebookView("waiting", JOIN_FAILED))
    return view_json(latest.notebooks)
