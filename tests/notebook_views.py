"""Hand-made notebook views (what the sampler's notebook tracker fills ``Snapshot.notebooks`` with) for tests."""

from __future__ import annotations

from nvdash.sampling.jupyter_kernels import JupyterKernel, KernelSession
from nvdash.sampling.notebook_records import KernelGpuUse, KernelUse, NotebookView
from nvdash.sampling.records import HostSample, Snapshot

MIB = 1 << 20
GPU0 = "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
GPU1 = "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"
UUIDS = (GPU0, GPU1)


def kernel(kernel_id: str, path: str | None, pid: int = 4301) -> JupyterKernel:
    """A local kernel serving the notebook ``path`` (none: a kernel without a session)."""
    sessions = () if path is None else (KernelSession(path, path.rsplit("/", 1)[-1], "notebook"),)
    return JupyterKernel(kernel_id, "python3", pid, 1_700_000_000.0, True, "idle", sessions)


def use(kernel_id: str, path: str | None, *held: tuple[int, int | None, float | None]) -> KernelUse:
    """The kernel holding ``(gpu index, memory bytes, SM %)`` on each GPU of ``held`` (none: it holds nothing)."""
    gpus = tuple(KernelGpuUse(index, UUIDS[index], None, memory, sm, (4301,)) for index, memory, sm in held)
    memories = [memory for _index, memory, _sm in held]
    total = None if None in memories else sum(memory or 0 for memory in memories)
    sms = [sm for _index, _memory, sm in held if sm is not None]
    return KernelUse(kernel(kernel_id, path), gpus, total, sum(sms) / len(sms) if sms else None)


def view(time_s: float, *kernels: KernelUse) -> NotebookView:
    """An ``ok`` view of a reading at ``time_s``."""
    return NotebookView("ok", None, time_s, tuple(kernels), "/user/alice/")


def snapshot(time_s: float, notebooks: NotebookView | None) -> Snapshot:
    """A snapshot carrying ``notebooks`` (no GPU readings: the notebook pages read only the view)."""
    return Snapshot(time_s, gpus=(), host=HostSample(), notebooks=notebooks)
