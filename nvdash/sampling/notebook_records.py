"""Records of which Jupyter kernels (notebooks) hold the GPUs: the join of the kernels file with NVML's processes.

Filled by the sampler at each process reading (:class:`~nvdash.sampling.notebooks.NotebookTracker`) and carried in
every :class:`~nvdash.sampling.records.Snapshot` (``Snapshot.notebooks``), so the JSON API, the lab extension's
sidebar, the "GPU Memory by Notebook" pane and the history all see the same values.

Semantics:

- A GPU process belongs to the kernel that is its nearest ancestor (the process itself when it is a kernel): a
  kernel's data-loader workers and pools count for it; a process under two kernels counts once, for the nearer.
- A kernel's memory on a GPU is the sum of its processes' ``usedGpuMemory`` there (``None`` when NVML gave none
  for any of them); its SM % on a GPU is the sum of its processes' time-weighted SM % there (capped at 100). In a
  MIG instance (no per-process utilization) a kernel whose processes are all its GPU instance runs has the
  instance's GPM activity; otherwise its SM % there is ``None``.
- ``sm_pct_1min``: the mean of the kernel's SM % (over its GPUs, the mean of the per-GPU sums) over the process
  readings of the last 60 s; ``None`` when no reading in that minute had a value.
- ``idle_since_s``: the start of the current run of readings in which the kernel held GPU memory (> 0) and its SM
  % was exactly 0 on every GPU it holds; ``None`` while it is busy, holds nothing, or its SM % is unknown.
- ``holding_since_s``: the start of the current run of readings in which it held GPU memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nvdash.sampling.jupyter_kernels import JupyterKernel

NotebookState = Literal["ok", "waiting", "unreadable", "elsewhere", "no_gpu", "no_processes", "pid_namespace"]
"""What the join can say:

``ok``: the kernels were joined to the GPU processes. ``waiting``: the Jupyter server has not written its kernels
file yet. ``unreadable``: the kernels file is malformed (``reason`` says how). ``elsewhere``: the kernels run on
another machine than the one nvdash reads (hostname or boot id differ). ``no_gpu``: NVML found no GPU.
``no_processes``: NVML lists no GPU processes to nvdash (process readings off, unprivileged, or not supported),
so which kernel holds memory cannot be known. ``pid_namespace``: NVML lists GPU processes but none of their PIDs
is visible here (nvdash sees another PID namespace than the driver's), so kernels cannot be matched.
"""


@dataclass(frozen=True, slots=True)
class KernelGpuUse:
    """One kernel's use of one GPU (or MIG instance)."""

    gpu_index: int
    gpu_uuid: str
    mig_uuid: str | None
    memory_bytes: int | None
    sm_pct: float | None
    pids: tuple[int, ...]
    """The kernel's processes on this unit, sorted."""


@dataclass(frozen=True, slots=True)
class KernelUse:
    """One kernel of the Jupyter server and what it holds now (nothing: ``gpus`` empty)."""

    kernel: JupyterKernel
    gpus: tuple[KernelGpuUse, ...] = ()
    memory_bytes: int | None = 0
    """Sum over ``gpus``; ``None`` when a process's memory is unknown."""
    sm_pct: float | None = None
    """The latest reading: the mean over the units it holds of its SM % there; ``None`` when unknown or none."""
    sm_pct_1min: float | None = None
    idle_since_s: float | None = None
    holding_since_s: float | None = None

    @property
    def holds_memory(self) -> bool:
        """True when the kernel holds GPU memory (or has a process on a GPU whose memory NVML does not give)."""
        return bool(self.gpus) and (self.memory_bytes is None or self.memory_bytes > 0)


@dataclass(frozen=True, slots=True)
class NotebookView:
    """This Jupyter server's kernels joined to the GPU processes, as of one process reading."""

    state: NotebookState
    reason: str | None = None
    """One plain sentence for every state but ``ok``."""
    time_s: float = 0.0
    """The process reading's time (seconds since the epoch)."""
    kernels: tuple[KernelUse, ...] = ()
    """Every kernel of the server (local or not), in the file's order."""
    base_url: str | None = None
    """The Jupyter server's base URL (from the kernels file)."""
