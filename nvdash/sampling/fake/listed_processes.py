"""Real processes on simulated GPUs: a simulation aid for showing real processes (their users, cgroups, pods) on
the GPUs of ``--simulate``.

The simulated driver's own processes have PIDs no host can have, so nvdash cannot name their users, containers or
pods. Two items of the fault text form (``NVDASH_FAKE_FAULTS``) list host-visible processes instead:

``process:UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]]``
    lists process ``PID`` on ``UNIT``: a GPU index, or ``GPU/N`` for the ``N``-th MIG instance of the profile's
    layout for that GPU (from 0). It does ``SM_SHARE`` (0-1, default 0) of the unit's work, holds ``MEMORY_MIB``
    (default 256) and is of ``KINDS``: ``compute``, ``graphics`` or ``mps`` joined by ``+`` (default ``compute``;
    an MPS client is ``compute+mps``). With ``@SECONDS`` it is listed from the start but does its work only from
    ``SECONDS`` after start (idle before: a job that starts working later).
``clear_processes:GPU``
    stops listing the profile's own processes on ``GPU`` (its MIG instances included): the GPU's work goes on,
    and only the processes the ``process`` items list there explain it.

For example ``clear_processes:0;process:0:4242:0.5:1000;process:0:4243:0.3`` shows two real processes
time-slicing GPU 0, doing 50 % and 30 % of its work. The items are parsed strictly: a bad one stops the server
with a one-line error.

As the driver does, a listed process that exits is no longer listed and its memory is freed: once its PID was seen
alive under ``/proc`` and is gone (or a zombie, or reused), see :mod:`.liveness`. A PID never seen alive (made up,
or of another PID namespace) stays listed.

``NVDASH_FAKE_PROCESS_FILE=PATH`` lists processes while the simulated GPUs run, for PIDs known only then (a
notebook server's kernels): the file holds the same two items, one a line or separated by ``;``, and is read again
whenever it changes; the processes it lists are exactly its items. See :mod:`.process_file`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .usage_specs import ProcessSpec

PROCESS_KINDS = ("compute", "graphics", "mps")
DEFAULT_MEMORY_MIB = 256


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not an integer") from None


def _gpu(text: str, gpu_count: int) -> int:
    gpu = _integer(text, "device")
    if not 0 <= gpu < gpu_count:
        raise ValueError(f"device {gpu} out of range: the profile has {gpu_count} GPU(s)")
    return gpu


def _unit(text: str, gpu_count: int, mig_instances: Mapping[int, int]) -> tuple[int, int | None]:
    """(GPU, MIG instance index or None) of ``GPU`` or ``GPU/N``."""
    gpu_text, slash, mig_text = text.partition("/")
    gpu = _gpu(gpu_text, gpu_count)
    if not slash:
        return gpu, None
    mig = _integer(mig_text, "MIG instance")
    count = mig_instances.get(gpu, 0)
    if not 0 <= mig < count:
        raise ValueError(f"GPU {gpu} has no MIG instance {mig} in this profile's layout ({count} instances)")
    return gpu, mig


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise ValueError(f"SM share {text!r} is not a number") from None
    if not (math.isfinite(share) and 0.0 <= share <= 1.0):
        raise ValueError(f"SM share {text!r} must be between 0 and 1")
    return share


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(part.strip() for part in text.split("+"))
    for kind in kinds:
        if kind not in PROCESS_KINDS:
            raise ValueError(f"process kind {kind!r} must be one of {', '.join(PROCESS_KINDS)}")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"process kinds {text!r} name one kind twice")
    return kinds


def parse_process(params: list[str], gpu_count: int, mig_instances: Mapping[int, int], *,
                  busy_from_s: float = 0.0) -> ProcessSpec:
    """The process of ``process:UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]]`` (``params``: the fields after ``process``),
    idle until ``busy_from_s`` (the item's ``@SECONDS``).

    ``mig_instances``: the number of MIG instances of each GPU the profile has a layout for. Raises ValueError with
    a one-line message.
    """
    if not 2 <= len(params) <= 5:
        raise ValueError("process takes UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]]")
    gpu, mig = _unit(params[0], gpu_count, mig_instances)
    pid = _integer(params[1], "PID")
    if pid <= 0:
        raise ValueError(f"PID {pid} must be positive")
    share = _share(params[2]) if len(params) > 2 else 0.0
    memory_mib = _integer(params[3], "memory (MiB)") if len(params) > 3 else DEFAULT_MEMORY_MIB
    if memory_mib < 0:
        raise ValueError(f"memory {memory_mib} MiB must be >= 0")
    kinds = _kinds(params[4]) if len(params) > 4 else ("compute",)
    return ProcessSpec(gpu, pid, kinds, memory_mib=memory_mib, sm_share=share, mig=mig, busy_from_s=busy_from_s)


def parse_clear(params: list[str], gpu_count: int) -> int:
    """The GPU of ``clear_processes:GPU``."""
    if len(params) != 1:
        raise ValueError("clear_processes takes one GPU index")
    return _gpu(params[0], gpu_count)
