"""Reading the usage records for the apps: each GPU's MIG instances, how they are named, where a process runs."""

from __future__ import annotations

from nvdash.sampling.usage_records import GpuProcess, GpuUsage, MigInstance, Usage

GPU_BAR_HEIGHT = 0.8
MIG_BAR_HEIGHT = 0.55
"""A MIG instance's bar is thinner than its GPU's, so it reads as a part of the row above."""


def gpu_usage(usage: Usage | None, index: int) -> GpuUsage | None:
    """The usage entry of GPU ``index``, or ``None`` when there is no reading for it."""
    if usage is None:
        return None
    return next((gpu for gpu in usage.gpus if gpu.index == index), None)


def mig_instances(usage: Usage | None, index: int) -> tuple[MigInstance, ...]:
    """The MIG instances of GPU ``index`` in GPU instance order; empty unless the GPU is in MIG mode."""
    gpu = gpu_usage(usage, index)
    if gpu is None or not gpu.mig_enabled:
        return ()
    return tuple(sorted(gpu.instances, key=lambda inst: (inst.gpu_instance_id, inst.compute_instance_id)))


def _shares_gpu_instance(instance: MigInstance, siblings: tuple[MigInstance, ...]) -> bool:
    return sum(1 for other in siblings if other.gpu_instance_id == instance.gpu_instance_id) > 1


def mig_row_label(instance: MigInstance, siblings: tuple[MigInstance, ...] = ()) -> str:
    """A MIG instance's bar row, e.g. ``GPU 0 / MIG 3g.20gb (GI 1)``; the CI is added where a GPU instance
    holds several compute instances, so every row keeps its own name."""
    ids = f"GI {instance.gpu_instance_id}"
    if _shares_gpu_instance(instance, siblings):
        ids += f", CI {instance.compute_instance_id}"
    return f"GPU {instance.gpu_index} / MIG {instance.profile} ({ids})"


def mig_rows(usage: Usage | None, index: int) -> list[tuple[str, MigInstance]]:
    """``(row label, instance)`` for each MIG instance of GPU ``index``, to draw under the GPU's own row."""
    instances = mig_instances(usage, index)
    return [(mig_row_label(instance, instances), instance) for instance in instances]


def find_instance(usage: Usage, uuid: str | None) -> MigInstance | None:
    """The MIG instance named by ``uuid`` (``MIG-...``), or ``None``."""
    if uuid is None:
        return None
    return next((inst for gpu in usage.gpus for inst in gpu.instances if inst.uuid == uuid), None)


def instance_text(instance: MigInstance) -> str:
    """A MIG instance's profile and ids, e.g. ``3g.20gb GI 1 / CI 0``."""
    return f"{instance.profile} GI {instance.gpu_instance_id} / CI {instance.compute_instance_id}"


def process_mig_text(usage: Usage, process: GpuProcess) -> str:
    """Where a process runs inside its GPU, e.g. ``3g.20gb GI 1 / CI 0``; blank on a GPU without MIG."""
    if process.mig_uuid is None:
        return ""
    instance = find_instance(usage, process.mig_uuid)
    if instance is None:
        return process.mig_profile or process.mig_uuid
    return instance_text(instance)


def device_text(usage: Usage, uuid: str) -> str:
    """Which GPU (and MIG instance) a UUID names, e.g. ``GPU 0 / MIG 3g.20gb (GI 1)``; blank when unknown."""
    instance = find_instance(usage, uuid)
    if instance is not None:
        return mig_row_label(instance, mig_instances(usage, instance.gpu_index))
    gpu = next((gpu for gpu in usage.gpus if gpu.uuid == uuid), None)
    return "" if gpu is None else f"GPU {gpu.index}"
