"""What runs on the simulated GPUs: processes (compute, graphics, MPS clients) and MIG instance layouts.

PIDs of the built-in processes start at :data:`GHOST_PID_BASE`, above the largest ``pid_max`` Linux allows
(2**22), so the host never has them: they stand for processes in another PID namespace, which NVML reports by
their host PIDs. Tests that need host-visible PIDs start real processes and add them with
``FakeNvmlLibrary.add_process``.

MIG profiles follow ``nvidia-smi mig -lgip`` on an A100 40GB and on an H100 80GB: profile name, profile id
(``nvmlGpuInstanceInfo_t.profileId``), SMs and memory (MiB), and the valid placements (start slice, size in memory
slices). Both GPUs have 7 compute and 8 memory slices, so the placements are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

GHOST_PID_BASE = 4_200_000
"""Above Linux's largest ``pid_max`` (4,194,304): such a PID cannot exist on the host."""


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of a MIG-capable GPU."""

    name: str
    profile_id: int
    slices: int
    """Compute slices (the ``Ng`` of the name)."""
    sm_count: int
    memory_mib: int
    placement_size: int
    starts: tuple[int, ...]
    """Valid placement starts, in memory slices."""


A100_40GB_MIG_PROFILES: dict[str, MigProfile] = {
    profile.name: profile
    for profile in (
        MigProfile("1g.5gb", 19, 1, 14, 4864, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("2g.10gb", 14, 2, 28, 9984, 2, (0, 2, 4)),
        MigProfile("3g.20gb", 9, 3, 42, 20096, 4, (0, 4)),
        MigProfile("4g.20gb", 5, 4, 56, 20096, 4, (0,)),
        MigProfile("7g.40gb", 0, 7, 98, 40192, 8, (0,)),
    )
}
H100_80GB_MIG_PROFILES: dict[str, MigProfile] = {
    profile.name: profile
    for profile in (
        MigProfile("1g.10gb", 19, 1, 16, 9984, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("2g.20gb", 14, 2, 32, 20096, 2, (0, 2, 4)),
        MigProfile("3g.40gb", 9, 3, 60, 40448, 4, (0, 4)),
        MigProfile("4g.40gb", 5, 4, 64, 40448, 4, (0,)),
        MigProfile("7g.80gb", 0, 7, 132, 81152, 8, (0,)),
    )
}
"""H100 80GB HBM3 (SXM5): 9.75, 19.62, 39.50 and 79.25 GiB as ``nvidia-smi mig -lgip`` prints them."""


def mig_profiles(gpu_name: str) -> dict[str, MigProfile]:
    """The MIG profile table of a GPU model, by its product name (an A100 40GB's unless it is an H100)."""
    return H100_80GB_MIG_PROFILES if "H100" in gpu_name else A100_40GB_MIG_PROFILES


MIG_MEMORY_SLICES = 8
MIG_EMPTY_INSTANCE_MIB = 13
"""What an instance with no process reports as used (its own context), as nvidia-smi shows it."""


@dataclass(frozen=True)
class MigSpec:
    """One MIG device: a GPU instance with one compute instance spanning it."""

    profile: str
    gpu_instance_id: int
    placement_start: int
    compute_instance_id: int = 0


@dataclass(frozen=True)
class ProcessSpec:
    """One process on one GPU.

    Memory is either a share of the training job's memory on that GPU (``memory_share``, for the job's
    ranks) or a fixed amount (``memory_mib``, added to the GPU's used memory). Its utilization is
    ``sm_share`` of the GPU's; ``garbage_every`` makes every Nth utilization sample read 37,100 %, the way
    some drivers answer now and then.
    """

    gpu: int
    pid: int
    kinds: tuple[str, ...] = ("compute",)
    memory_share: float = 0.0
    memory_mib: int = 0
    sm_share: float = 1.0
    mig: int | None = None
    """Index into the GPU's MIG layout, for a process inside a MIG instance."""
    garbage_every: int = 0
    busy_from_s: float = 0.0
    """Seconds after start before which the process does no work: it is listed and holds its memory, idle."""

    def busy_at(self, t: float) -> bool:
        """Whether the process does its ``sm_share`` of the work at ``t`` s after start."""
        return t >= self.busy_from_s


def validate_layout(layout: tuple[MigSpec, ...], profiles: dict[str, MigProfile] = A100_40GB_MIG_PROFILES) -> None:
    """Raise ``ValueError`` unless each instance sits at a valid placement and none overlap."""
    used: set[int] = set()
    slices = 0
    for spec in layout:
        profile = profiles[spec.profile]
        if spec.placement_start not in profile.starts:
            raise ValueError(f"{spec.profile} cannot start at slice {spec.placement_start}")
        span = set(range(spec.placement_start, spec.placement_start + profile.placement_size))
        if span & used or max(span) >= MIG_MEMORY_SLICES:
            raise ValueError(f"{spec.profile} at {spec.placement_start} overlaps another instance")
        used |= span
        slices += profile.slices
    if slices > 7:
        raise ValueError("the layout uses more than 7 compute slices")


def ranks(gpus: range | tuple[int, ...], garbage_on: int | None = None) -> tuple[ProcessSpec, ...]:
    """One training rank per GPU, holding nearly all of the job's memory there."""
    return tuple(
        ProcessSpec(gpu, GHOST_PID_BASE + 100 + gpu, memory_share=0.97, garbage_every=25 if gpu == garbage_on else 0)
        for gpu in gpus
    )
