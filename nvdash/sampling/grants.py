"""The quotas granted to the pods' containers on the GPUs, from what nvdash can read on the node.

- GPU-Manager (``tencent.com/vcuda-core``, ``tencent.com/vcuda-memory``): the kubelet's pod-resources answer lists
  one device id per unit, so the count of a container's ids is its amount (100 cores = one GPU; 256 MiB per memory
  unit). The ids name no GPU: which GPU GPU-Manager chose is in pod annotations (``tencent.com/predicate-gpu-idx-<n>``)
  that only the API server has, and nvdash does not call it; such a grant has no ``gpu_uuid``.
- HAMi (``CUDA_DEVICE_MEMORY_LIMIT_<n>``, ``CUDA_DEVICE_SM_LIMIT``) and MPS clients
  (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``): the environment of a process
  attributed to a pod (:mod:`nvdash.sampling.process_limits`). A CUDA ordinal names the GPU at that place in the
  process's ``*_VISIBLE_DEVICES`` UUIDs; without them, a process whose limits name one ordinal only is taken to be
  limited on the GPU NVML lists it on, and other ordinals are left out. HAMi's grant itself
  (``nvidia.com/gpumem``, ``gpucores``, the ``hami.io/vgpu-devices-allocated`` annotation) is not in pod-resources.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nvdash.sampling.usage_records import GpuProcess, Grant, PodDevice, PodResources, ProcessLimits

CORE_RESOURCE = "tencent.com/vcuda-core"
MEMORY_RESOURCE = "tencent.com/vcuda-memory"
MEMORY_UNIT_BYTES = 256 << 20
"""GPU-Manager's ``tencent.com/vcuda-memory`` unit (``MemoryBlockSize``, 268435456 bytes)."""


def collect_grants(pods: PodResources, processes: Sequence[GpuProcess]) -> tuple[Grant, ...]:
    """Every grant known now: the kubelet's GPU-Manager units, then the environment's quotas (each once)."""
    found: dict[tuple[str, str, str, str, str, str | None], Grant] = {}
    for grant in (*pod_resource_grants(pods.quota_devices), *environment_grants(processes)):
        key = (grant.namespace, grant.pod, grant.container, grant.scheme, grant.source, grant.gpu_uuid)
        found.setdefault(key, grant)
    return tuple(found.values())


def pod_resource_grants(devices: Iterable[PodDevice]) -> tuple[Grant, ...]:
    """One GPU-Manager grant per container holding vcuda units: cores in % of a GPU, memory in bytes."""
    cores: dict[tuple[str, str, str], int] = {}
    memory: dict[tuple[str, str, str], int] = {}
    for device in devices:
        key = (device.namespace, device.pod, device.container)
        if device.resource_name == CORE_RESOURCE:
            cores[key] = cores.get(key, 0) + 1
        elif device.resource_name == MEMORY_RESOURCE:
            memory[key] = memory.get(key, 0) + 1
    return tuple(
        Grant(*key, scheme="gpu-manager", source="pod-resources", gpu_uuid=None,
              core_pct=float(cores[key]) if key in cores else None,
              memory_bytes=memory[key] * MEMORY_UNIT_BYTES if key in memory else None)
        for key in sorted({*cores, *memory})
    )


def environment_grants(processes: Iterable[GpuProcess]) -> tuple[Grant, ...]:
    """The HAMi and MPS quotas of the processes attributed to a pod, per GPU (see the module docstring)."""
    found: list[Grant] = []
    for process in processes:
        limits = process.host.limits if process.host is not None else None
        if limits is None or process.pod_namespace is None or process.pod_name is None:
            continue
        owner = (process.pod_namespace, process.pod_name, process.container_name or "")
        hami = limits_per_gpu(process, limits, limits.hami_memory_bytes, limits.hami_core_pct)
        mps = limits_per_gpu(process, limits, limits.mps_pinned_memory_bytes, limits.mps_thread_pct)
        found += [Grant(*owner, scheme="hami", source="environment", gpu_uuid=uuid, core_pct=core, memory_bytes=mem)
                  for uuid, core, mem in hami]
        found += [Grant(*owner, scheme="mps", source="environment", gpu_uuid=uuid, core_pct=core, memory_bytes=mem)
                  for uuid, core, mem in mps]
    return tuple(found)


def limits_per_gpu(process: GpuProcess, limits: ProcessLimits, memory: tuple[tuple[int, int], ...],
             core_pct: float | None) -> list[tuple[str, float | None, int | None]]:
    """(GPU UUID, core %, memory bytes) for each GPU the limits reach; empty when they set nothing (the GPU page
    also shows an MPS client outside any pod against these)."""
    if not memory and core_pct is None:
        return []
    by_ordinal = dict(memory)
    visible = limits.visible_devices
    if visible:
        ordinals = sorted(set(by_ordinal) | (set(range(len(visible))) if core_pct is not None else set()))
        gpus = {ordinal: visible[ordinal] for ordinal in ordinals if ordinal < len(visible)}
    elif len(by_ordinal) <= 1:
        gpus = {next(iter(by_ordinal), 0): process.gpu_uuid}
    else:
        gpus = {}
    return [(uuid, core_pct, by_ordinal.get(ordinal)) for ordinal, uuid in sorted(gpus.items())]
