"""Which Jupyter kernel holds which GPU: the kernels file joined to NVML's processes at each process reading.

:class:`NotebookTracker` reads the kernels file (:mod:`nvdash.sampling.jupyter_kernels`) again only when its
``stat`` changes, gives each GPU process to its nearest ancestor kernel (:func:`~nvdash.sampling.process_tree.
nearest_known`: a kernel is its PID and start time, so a process that reused a kernel's PID is not that kernel),
sums per kernel and GPU (or MIG instance), and follows each kernel over time (1-minute SM mean, idle and holding
since). The semantics are in :mod:`nvdash.sampling.notebook_records`.

When the join cannot be made the view says why (:data:`~nvdash.sampling.notebook_records.NotebookState`). The
rule for ``no_processes`` beyond "no process readings": no GPU's process list is readable, or NVML lists no
process at all while some GPU holds more memory than an empty GPU does (:data:`HELD_BYTES` beyond the driver's
reserve; where NVML does not give the reserve, which ``memory_used_bytes`` then includes,
:data:`UNKNOWN_RESERVE_BYTES` more): memory that no listed process explains means NVML hides the processes (an
unprivileged container, a driver that does not list them), so kernels' use cannot be known. No process and no
memory held is simply ``ok`` with every kernel at 0.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvdash.sampling.jupyter_kernels import (
    JupyterKernel,
    JupyterKernels,
    KernelsFileError,
    read_boot_id,
    read_kernels_file,
)
from nvdash.sampling.notebook_records import KernelGpuUse, KernelUse, NotebookState, NotebookView
from nvdash.sampling.process_tree import ProcessTree, nearest_known
from nvdash.sampling.records import GpuSample
from nvdash.sampling.usage_records import GpuProcess, Usage

log = logging.getLogger(__name__)

MIB = 1 << 20
HELD_BYTES = 256 * MIB
"""GPU memory beyond the driver's reserve that an empty GPU never reports (a CUDA context alone takes more)."""
UNKNOWN_RESERVE_BYTES = 768 * MIB
"""Added to :data:`HELD_BYTES` where NVML does not report the reserve (``memory_used_bytes`` includes it then)."""
WINDOW_S = 60.0
"""The span of ``sm_pct_1min``."""
WAITING_FIRST = "nvdash has not read the GPU processes yet."
PROCESSES_OFF = "nvdash does not read the GPU processes (--process-interval 0), so it cannot tell which kernel holds " \
                "a GPU."

Unit = tuple[int, str, str | None]
"""A GPU or MIG instance: (GPU index, GPU UUID, MIG UUID or ``None``)."""
KernelKey = tuple[str, int | None, float | None]
"""A kernel's life: its id, PID and start time (a restart is a new life: its trend starts over)."""


@dataclass(slots=True)
class _Trend:
    """One kernel's readings of the last minute and the runs it is in."""

    readings: deque[tuple[float, float | None]] = field(default_factory=deque)
    idle_since_s: float | None = None
    holding_since_s: float | None = None


def processes_off_view(time_s: float = 0.0) -> NotebookView:
    """The view where nvdash reads no GPU processes."""
    return NotebookView("no_processes", PROCESSES_OFF, time_s)


class NotebookTracker:
    """Joins the kernels file at ``path`` to each new process reading (:meth:`update`); :attr:`view` is the latest.

    ``proc_root``: where the process tree is read; ``hostname`` and ``boot_id``: this host's (``None``: read them),
    compared with the file's to tell kernels on another machine; ``reader``: reads and parses the file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        proc_root: Path = Path("/proc"),
        hostname: str | None = None,
        boot_id: str | None = None,
        reader: Callable[[str], JupyterKernels] = read_kernels_file,
        follow_links: bool = False,
    ) -> None:
        self._path = os.fspath(path)
        self._tree = ProcessTree(proc_root, follow_links=follow_links)
        self._hostname = hostname if hostname is not None else socket.gethostname()
        self._boot_id = boot_id if boot_id is not None else read_boot_id(f"{proc_root}/sys/kernel/random/boot_id")
        self._reader = reader
        self._signature: tuple[int, ...] | None = None
        self._kernels: JupyterKernels | KernelsFileError | None = None
        self._trends: dict[KernelKey, _Trend] = {}
        self.view = NotebookView("waiting", WAITING_FIRST)
        self.reads = 0
        """How often the file was read (it is read again only when its ``stat`` changes)."""

    @property
    def path(self) -> str:
        """The kernels file."""
        return self._path

    def update(self, time_s: float, usage: Usage | None, gpus: Sequence[GpuSample] = ()) -> NotebookView:
        """Join the kernels file to the process reading ``usage`` (taken at ``time_s``; ``None``: process readings
        are off) and the sweep's ``gpus``; the new view is also kept as :attr:`view`."""
        self.view = self._join(time_s, usage, gpus)
        return self.view

    def _join(self, time_s: float, usage: Usage | None, gpus: Sequence[GpuSample]) -> NotebookView:
        kernels = self._read()
        if kernels is None:
            return NotebookView("waiting", f"The Jupyter server has not written its kernels file {self._path} yet.",
                                time_s)
        if isinstance(kernels, KernelsFileError):
            return NotebookView("unreadable", _sentence(str(kernels)), time_s)
        base_url = kernels.server.base_url
        unknown = tuple(KernelUse(kernel, memory_bytes=None) for kernel in kernels.kernels)

        def without(state: NotebookState, reason: str) -> NotebookView:
            return NotebookView(state, reason, time_s, unknown, base_url)

        elsewhere = self._elsewhere(kernels)
        if elsewhere is not None:
            return without("elsewhere", elsewhere)
        if usage is None:
            return without("no_processes", PROCESSES_OFF)
        if not usage.gpus and not gpus:
            return without("no_gpu", "NVML found no GPU on this machine.")
        hidden = _hidden_processes(usage, gpus)
        if hidden is not None:
            return without("no_processes", hidden)
        if usage.processes and not any(process.visible for process in usage.processes):
            return without("pid_namespace", "NVML lists GPU processes but none of their PIDs is visible to nvdash "
                           "(it runs in another PID namespace than the driver's), so kernels cannot be matched.")
        return NotebookView("ok", None, time_s, self._uses(time_s, kernels.kernels, usage), base_url)

    def _read(self) -> JupyterKernels | KernelsFileError | None:
        """The file's kernels (``None``: no file), read again only when its ``stat`` changed."""
        try:
            info = os.stat(self._path)
        except FileNotFoundError:
            self._signature, self._kernels = None, None
            return None
        except OSError as error:
            self._signature = None
            return KernelsFileError(f"cannot read the kernels file {self._path}: {error.strerror or error}")
        signature = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)
        if signature != self._signature:
            self.reads += 1
            try:
                self._kernels = self._reader(self._path)
            except KernelsFileError as error:
                self._kernels = error
            self._signature = signature
        return self._kernels

    def _elsewhere(self, kernels: JupyterKernels) -> str | None:
        server = kernels.server
        if server.hostname != self._hostname:
            return (f"The Jupyter server runs on {server.hostname}, not on {self._hostname} whose GPUs nvdash reads, "
                    "so its kernels cannot be matched to GPU processes.")
        if server.boot_id is not None and self._boot_id is not None and server.boot_id != self._boot_id:
            return (f"The Jupyter server runs on another boot of {server.hostname} than nvdash (the boot ids differ: "
                    "another machine or container host), so its kernels cannot be matched to GPU processes.")
        return None

    def _uses(self, time_s: float, kernels: Sequence[JupyterKernel], usage: Usage) -> tuple[KernelUse, ...]:
        """Each kernel's processes by unit, summed, with its trend brought up to ``time_s``."""
        processes = usage.processes
        alone = _instance_activity(usage)
        known: dict[int, float] = {}
        for kernel in kernels:
            if kernel.local and kernel.pid is not None and kernel.started_s is not None:
                known.setdefault(kernel.pid, kernel.started_s)
        visible = [process for process in processes if process.visible]
        owner = nearest_known({process.pid for process in visible}, known, self._tree) if known else {}
        held: dict[int, dict[Unit, list[GpuProcess]]] = {}
        for process in visible:
            kernel_pid = owner.get(process.pid)
            if kernel_pid is not None:
                unit = (process.gpu_index, process.gpu_uuid, process.mig_uuid)
                held.setdefault(kernel_pid, {}).setdefault(unit, []).append(process)
        trends: dict[KernelKey, _Trend] = {}
        uses: list[KernelUse] = []
        for kernel in kernels:
            if not kernel.local or kernel.pid is None or known.get(kernel.pid) != kernel.started_s:
                uses.append(KernelUse(kernel, memory_bytes=None if not kernel.local else 0))
                continue
            key = (kernel.id, kernel.pid, kernel.started_s)
            trend = trends.get(key) or self._trends.get(key) or _Trend()
            trends[key] = trend
            units = held.get(kernel.pid, {})
            uses.append(_follow(trend, time_s, kernel, tuple(_unit_use(unit, units[unit], alone) for unit in sorted(
                units, key=lambda unit: (unit[0], unit[2] or "")))))
        self._trends = trends
        return tuple(uses)


def _instance_activity(usage: Usage) -> dict[str, tuple[float, frozenset[int]]]:
    """Each MIG instance with a GPM activity reading: that activity (%, its GPU instance's, which the compute
    instances of one GPU instance share) and the PIDs NVML lists anywhere in that GPU instance."""
    pids: dict[str, set[int]] = {}
    for process in usage.processes:
        if process.mig_uuid is not None:
            pids.setdefault(process.mig_uuid, set()).add(process.pid)
    activity: dict[str, tuple[float, frozenset[int]]] = {}
    for gpu in usage.gpus:
        for instance in gpu.instances:
            if instance.sm_active_pct is None:
                continue
            shared = [other.uuid for other in gpu.instances if other.gpu_instance_id == instance.gpu_instance_id]
            activity[instance.uuid] = (instance.sm_active_pct,
                                       frozenset(pid for uuid in shared for pid in pids.get(uuid, ())))
    return activity


def _unit_use(unit: Unit, processes: Iterable[GpuProcess],
              alone: Mapping[str, tuple[float, frozenset[int]]] | None = None) -> KernelGpuUse:
    """One kernel's use of one unit. NVML gives no per-process utilization in a MIG instance; when the kernel's
    processes are all the instance runs, the instance's own activity (GPM, as DCGM's GR_ENGINE_ACTIVE) is theirs."""
    listed = list(processes)
    memory = [process.gpu_memory_bytes for process in listed]
    sm = [process.sm_pct for process in listed]
    activity = (alone or {}).get(unit[2] or "")
    if activity is not None and any(value is None for value in sm) and activity[1] == {p.pid for p in listed}:
        sm = [activity[0]]
    return KernelGpuUse(
        gpu_index=unit[0],
        gpu_uuid=unit[1],
        mig_uuid=unit[2],
        memory_bytes=None if any(value is None for value in memory) else sum(v for v in memory if v is not None),
        sm_pct=None if any(value is None for value in sm) else min(100.0, sum(v for v in sm if v is not None)),
        pids=tuple(sorted({process.pid for process in listed})),
    )


def _follow(trend: _Trend, time_s: float, kernel: JupyterKernel, gpus: tuple[KernelGpuUse, ...]) -> KernelUse:
    """The kernel's use now, its trend moved on by this reading."""
    memory = [unit.memory_bytes for unit in gpus]
    memory_bytes = None if any(value is None for value in memory) else sum(v for v in memory if v is not None)
    sm = [unit.sm_pct for unit in gpus]
    sm_pct = None if not sm or any(value is None for value in sm) else sum(v for v in sm if v is not None) / len(sm)
    use = KernelUse(kernel, gpus, memory_bytes, sm_pct)
    trend.readings.append((time_s, sm_pct))
    while trend.readings and trend.readings[0][0] < time_s - WINDOW_S:
        trend.readings.popleft()
    values = [value for _, value in trend.readings if value is not None]
    holding = use.holds_memory
    trend.holding_since_s = (trend.holding_since_s if trend.holding_since_s is not None else time_s) if holding \
        else None
    idle = holding and sm_pct is not None and all(unit.sm_pct == 0.0 for unit in gpus)
    trend.idle_since_s = (trend.idle_since_s if trend.idle_since_s is not None else time_s) if idle else None
    return KernelUse(kernel, gpus, memory_bytes, sm_pct,
                     sm_pct_1min=sum(values) / len(values) if values else None,
                     idle_since_s=trend.idle_since_s, holding_since_s=trend.holding_since_s)


def _hidden_processes(usage: Usage, gpus: Sequence[GpuSample]) -> str | None:
    """Why NVML's process list cannot be trusted to be complete (see the module docstring), or ``None``."""
    if usage.gpus and not any(gpu.processes_readable for gpu in usage.gpus):
        return ("NVML does not list the GPU processes to nvdash (not supported, or not permitted here), so which "
                "kernel holds memory cannot be known.")
    if usage.processes:
        return None
    readable = {gpu.index for gpu in usage.gpus if gpu.processes_readable} if usage.gpus else None
    for sample in gpus:
        if readable is not None and sample.index not in readable:
            continue
        used = sample.memory_used_bytes
        limit = HELD_BYTES + (UNKNOWN_RESERVE_BYTES if sample.memory_reserved_bytes is None else 0)
        if used is not None and used > limit:
            return (f"NVML lists no GPU processes although GPU {sample.index} holds {used // MIB} MiB (nvdash may "
                    "not be permitted to see them), so which kernel holds memory cannot be known.")
    return None


def _sentence(message: str) -> str:
    """A one-line error message as a sentence: capitalized, ending with a full stop."""
    text = message[:1].upper() + message[1:]
    return text if text.endswith(".") else text + "."
