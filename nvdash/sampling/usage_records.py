"""Records of who uses the GPUs: processes, their containers and pods, MIG instances, pod allocations.

They are read at a slower cadence than the GPU metrics (see ``nvdash.sampling.usage``) and carried in every
:class:`~nvdash.sampling.records.Snapshot` as its ``usage``. Unknown values are ``None``, never zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROCESS_KINDS = ("compute", "graphics", "mps")
"""How a process uses a GPU, as NVML lists it: ``*ComputeRunningProcesses``, ``*GraphicsRunningProcesses``,
``*MPSComputeRunningProcesses`` (a client of the MPS server)."""
SHARING_KINDS = ("whole", "mig", "shared", "mps", "vgpu")
"""What a pod was given: a whole GPU (pGPU), a MIG instance, a time-sliced replica (``shared``), a replica of a GPU
run by an MPS server (``mps``: the device plugin names it like a time-sliced replica; NVML lists its processes as MPS
clients), or a vGPU slice with quotas (GPU-Manager, HAMi, KubeVirt's GRID types)."""
GRANT_SCHEMES = ("gpu-manager", "hami", "mps")
"""Who set a quota: GPU-Manager (``tencent.com/vcuda-*``), HAMi (``nvidia.com/gpumem``, ``gpucores``), or an MPS
client's own limits (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)."""
_HAMI_SPLIT = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}-[0-9]{1,4}")
"""A HAMi device plugin's device id: a GPU UUID and the share's number."""
GRANT_SOURCES = ("pod-resources", "environment")
"""Where nvdash read a quota: the kubelet's pod-resources answer, or the process environment (``/proc/PID/environ``,
only the quota variables are read)."""


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a process's ``/proc/PID/cgroup`` says about where it runs."""

    runtime: str | None = None
    """``"docker"``, ``"containerd"``, ``"cri-o"``, ``"podman"``, or ``None`` outside a container."""
    container_id: str | None = None
    """The container's full id (64 hex digits)."""
    pod_uid: str | None = None
    """The Kubernetes pod UID in its dashed form (cgroup paths write it with ``_`` on systemd)."""
    qos: str | None = None
    """``"guaranteed"``, ``"burstable"`` or ``"besteffort"`` for a pod."""
    slurm_job: str | None = None
    """The Slurm job id for a process in a Slurm step."""

    @property
    def in_container(self) -> bool:
        """True when the process runs in a container (or a pod)."""
        return self.container_id is not None or self.pod_uid is not None


@dataclass(frozen=True, slots=True)
class HostProcess:
    """What the host says about one PID (psutil and ``/proc``)."""

    pid: int
    user: str | None = None
    command: str | None = None
    """The command line, arguments joined by spaces (the process name when the command line is empty)."""
    cpu_pct: float | None = None
    """Host CPU use over the last interval, 100 % per fully used core; ``None`` on the first sight."""
    rss_bytes: int | None = None
    started_s: float | None = None
    """Start time, seconds since the epoch."""
    cgroup: CgroupIdentity = CgroupIdentity()
    limits: ProcessLimits | None = None
    """The quota variables of its environment; ``None`` when the environment could not be read."""


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    """The GPU quota variables a process's environment sets (all ``None``/empty: it sets none).

    Device-keyed values are by the CUDA device ordinal the process sees (0 is its first visible GPU);
    ``visible_devices`` says which GPUs those are when the environment names them.
    """

    mps_thread_pct: float | None = None
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the part of the SMs an MPS client may use, 0-100."""
    mps_pinned_memory_bytes: tuple[tuple[int, int], ...] = ()
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (e.g. ``0=1G,1=512M``): (ordinal, bytes) pairs."""
    hami_memory_bytes: tuple[tuple[int, int], ...] = ()
    """HAMi's ``CUDA_DEVICE_MEMORY_LIMIT_<n>`` (or ``CUDA_DEVICE_MEMORY_LIMIT`` for all): (ordinal, bytes) pairs."""
    hami_core_pct: float | None = None
    """HAMi's ``CUDA_DEVICE_SM_LIMIT``: the part of each GPU's compute the container may use, 0-100."""
    visible_devices: tuple[str, ...] = ()
    """``NVIDIA_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES`` when they name UUIDs, in ordinal order."""


@dataclass(frozen=True, slots=True)
class Grant:
    """A quota a container was granted on a GPU: a vGPU slice (GPU-Manager, HAMi) or an MPS client's limits."""

    namespace: str
    pod: str
    container: str
    scheme: str
    """One of :data:`GRANT_SCHEMES`."""
    source: str
    """One of :data:`GRANT_SOURCES`."""
    gpu_uuid: str | None = None
    """The GPU the quota is on; ``None`` when the grant does not name it (GPU-Manager's vcuda devices)."""
    core_pct: float | None = None
    """Compute granted, in percent of one GPU (``tencent.com/vcuda-core`` 50: 50 %; HAMi ``gpucores``; an MPS
    client's active thread percentage); ``None``: no compute quota."""
    memory_bytes: int | None = None
    """Memory granted (``tencent.com/vcuda-memory`` x 256 MiB; HAMi ``gpumem`` MiB; MPS pinned memory limit)."""


@dataclass(frozen=True, slots=True)
class PodDevice:
    """One device the kubelet allocated to a container (pod-resources ``List``)."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    """The extended resource, e.g. ``nvidia.com/gpu``, ``nvidia.com/mig-3g.20gb``, ``nvidia.com/gpu.shared``."""
    device_id: str
    """As the device plugin names it: a GPU UUID, a MIG UUID, or a shared replica ``GPU-...::2``."""
    sharing: str
    """One of :data:`SHARING_KINDS`."""
    note: str | None = None
    """Why nvdash could not tell which GPU this is (a DRA device it cannot map); ``None`` when it could."""

    @property
    def uuid(self) -> str:
        """The GPU or MIG UUID the device id names (a shared replica's ``::N`` suffix dropped, and HAMi's ``-N``
        split suffix: HAMi names the N-th share of a GPU ``GPU-<uuid>-N``)."""
        uuid = self.device_id.split("::", 1)[0]
        if _HAMI_SPLIT.fullmatch(uuid):
            return uuid.rsplit("-", 1)[0]
        return uuid


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device a container got through a DRA ResourceClaim (pod-resources ``dynamic_resources``), as the
    kubelet names it; :mod:`nvdash.sampling.kubelet.dra` maps it to a GPU."""

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    driver: str
    """The DRA driver, e.g. ``gpu.nvidia.com``; empty from kubelets before 1.31."""
    pool: str
    """The driver's resource pool (the NVIDIA GPU driver: the node's name)."""
    device: str
    """The driver's name for the device, e.g. ``gpu-0`` (by minor number) or ``gpu-0-mig-1g10gb-19-0``."""
    share_id: str | None = None
    """Set (Kubernetes 1.35+) when the device was one of several allocations of a device shared between claims."""
    cdi_devices: tuple[str, ...] = ()
    """The fully qualified CDI device names the container got for it."""
    class_name: str | None = None
    """The claim's DeviceClass, from kubelets 1.27-1.30 only (they name no driver or device)."""


@dataclass(frozen=True, slots=True)
class PodResources:
    """The kubelet's answer: allocated devices, or why there is none (``status`` is a plain sentence)."""

    devices: tuple[PodDevice, ...] = ()
    available: bool = False
    """True when the kubelet answered (its answer may list no GPU)."""
    quota_devices: tuple[PodDevice, ...] = ()
    """Quota units that name no GPU (GPU-Manager's ``tencent.com/vcuda-core``: 1 % of a GPU each, and
    ``tencent.com/vcuda-memory``: 256 MiB each); :mod:`nvdash.sampling.grants` counts them into grants."""
    claim_devices: tuple[ClaimDevice, ...] = ()
    """Devices allocated through DRA claims, as the kubelet named them; once mapped to GPUs they are in ``devices``
    too (see :func:`nvdash.sampling.kubelet.dra.with_claims`)."""
    status: str = "Kubernetes pod lookup is off."


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process on one GPU (or one MIG instance of it), with what the host knows of it."""

    gpu_index: int
    gpu_uuid: str
    pid: int
    kinds: tuple[str, ...]
    """Subset of :data:`PROCESS_KINDS`: a process can be both a compute and a graphics client."""
    gpu_memory_bytes: int | None = None
    """GPU memory the process holds; ``None`` where NVML cannot say (e.g. without privileges)."""
    mig_uuid: str | None = None
    """The MIG instance the process runs in, or ``None`` on a GPU without MIG."""
    mig_profile: str | None = None
    sm_pct: float | None = None
    """Per-process utilization from ``nvmlDeviceGetProcessUtilization`` since the previous reading, clamped to
    0-100; ``None`` where NVML does not report it (e.g. MIG)."""
    memory_pct: float | None = None
    encoder_pct: float | None = None
    decoder_pct: float | None = None
    host: HostProcess | None = None
    """``None`` when the PID is not visible from here (another PID namespace) or has exited."""
    pod_namespace: str | None = None
    pod_name: str | None = None
    container_name: str | None = None

    @property
    def visible(self) -> bool:
        """True when the host could see this PID."""
        return self.host is not None


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device: a compute instance inside a GPU instance."""

    gpu_index: int
    uuid: str
    """``MIG-...``: what CUDA_VISIBLE_DEVICES and the device plugin name it by."""
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    """E.g. ``3g.20gb`` (GPU instance), or ``1c.3g.20gb`` for a compute instance smaller than its GPU instance."""
    placement_start: int | None = None
    placement_size: int | None = None
    """The GPU instance's memory slices (``nvmlGpuInstanceInfo_t.placement``)."""
    sm_count: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    sm_active_pct: float | None = None
    """The GPU instance's utilization: its graphics engine activity from GPM (``nvmlGpmMigSampleGet``,
    ``NVML_GPM_METRIC_GRAPHICS_UTIL``, what DCGM calls ``GR_ENGINE_ACTIVE``), 0-100 %, over the interval since the
    previous usage reading; compute instances of one GPU instance share it. ``None`` means "not reported" (no GPM:
    before Hopper, or the first reading)."""
    gpm_sm_active_pct: float | None = None
    """The GPU instance's SM activity (``NVML_GPM_METRIC_SM_UTIL``), 0-100 %; ``None``: not reported."""
    gpm_sm_occupancy_pct: float | None = None
    """The GPU instance's SM occupancy (``NVML_GPM_METRIC_SM_OCCUPANCY``), 0-100 %; ``None``: not reported."""


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's MIG state and whether NVML answers for its processes."""

    index: int
    uuid: str
    mig_enabled: bool | None = None
    """``None`` on a GPU without MIG support."""
    mig_pending: bool | None = None
    """The mode after the next GPU reset."""
    instances: tuple[MigInstance, ...] = ()
    processes_readable: bool = True
    """False when NVML would not list the processes (unsupported, lost, or no answer in time)."""
    process_utilization: bool = False
    """True when NVML reports per-process utilization on this GPU."""
    minor_number: int | None = None
    """The N of ``/dev/nvidiaN``, by which DRA drivers name GPUs; ``None``: unknown."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Who uses the GPUs, as of ``time_s`` (seconds since the epoch)."""

    time_s: float
    gpus: tuple[GpuUsage, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    pods: PodResources = PodResources()
    grants: tuple[Grant, ...] = ()
    """The quotas known for the pods' containers, from the kubelet and the process environments."""

    def idle_allocations(self) -> tuple[PodDevice, ...]:
        """Devices allocated to a pod on which that pod runs no process now ("allocated, idle").

        A process attributed to a pod makes only that pod's device busy; a process nvdash could not attribute
        makes every allocation of its GPU (or MIG instance) count as busy, since it may be any of them.
        """
        owned: set[tuple[str, str, str]] = set()
        unattributed: set[str] = set()
        for process in self.processes:
            uuid = process.mig_uuid or process.gpu_uuid
            if process.pod_name is not None and process.pod_namespace is not None:
                owned.add((process.pod_namespace, process.pod_name, uuid))
            else:
                unattributed.add(uuid)
        return tuple(
            device
            for device in self.pods.devices
            if (device.namespace, device.pod, device.uuid) not in owned and device.uuid not in unattributed
        )
