"""Who uses one GPU, as NVML says: its processes, their per-process utilization, and its MIG instances.

Read at the usage cadence (every couple of seconds), never on the event loop. Per-process utilization is read
with the timestamp of the newest sample seen before, so no sample is counted twice; each value is clamped to
0-100 % (drivers now and then answer garbage such as 37,100 %).

The driver keeps one sample per process per sample period, and only for periods in which the process had non-zero
utilization. A process's figure is therefore time weighted: the sum of its sample values times the sample period,
divided by the window (from the previous reading's newest sample timestamp to this one's; on the first reading, the
span of the buffer plus one period). A process with no sample in the window was idle (0). The period is learnt from
the timestamps: the smallest positive gap between two samples of the same process, remembered per GPU (until it is
known, the plain mean of the samples stands in, which overstates a process that was idle part of the time).

Error bound: the window ends at the newest sample, so idle periods after it count in the next window instead (about
one sample period per window, 1/6 s of a 2 s window with a 167 ms period, moves between windows, none is lost); a
process that came and went between two readings is counted in full while it had samples but is not listed then,
and its part shows up as work no listed process explains.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nvdash.sampling.gpm_mig import MigGpmReader
from nvdash.sampling.nvml_device import Device, GpuLost, NvmlCaller, text_of
from nvdash.sampling.usage_records import GpuUsage, MigInstance

INSTANCE_ID_NONE = 0xFFFFFFFF
"""``gpuInstanceId``/``computeInstanceId`` of a process on a GPU without MIG."""
_PROCESS_FUNCTIONS = (
    ("compute", ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")),
    ("graphics", ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2")),
    ("mps", ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2")),
)
"""Each list, newest struct version first (older drivers lack the ``_v3`` entry points)."""
MIG_MEMORY_V2 = "mig_memory_v2"
"""The name under which a GPU remembers that its MIG devices do not answer ``nvmlDeviceGetMemoryInfo_v2``."""


@dataclass(frozen=True, slots=True)
class NvmlProcess:
    """One PID on one GPU as NVML lists it."""

    pid: int
    kinds: tuple[str, ...]
    memory_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """A process's utilization since the previous reading, each 0-100 % of the window (time weighted: its busy
    sample periods over the window, so idle periods count as 0)."""

    sm_pct: float
    memory_pct: float
    encoder_pct: float
    decoder_pct: float


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One GPU's MIG state and processes, before the host side is looked up."""

    gpu: GpuUsage
    processes: tuple[NvmlProcess, ...] = ()
    utilization: Mapping[int, ProcessUtilization] = field(default_factory=dict)
    """By PID; empty when the GPU does not report per-process utilization (see ``gpu.process_utilization``)."""


@dataclass(frozen=True, slots=True)
class _MigStatic:
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    placement_start: int | None
    placement_size: int | None
    sm_count: int | None
    memory_total_bytes: int | None


def clamp_pct(value: float) -> float:
    """A percentage forced into 0-100."""
    return min(100.0, max(0.0, float(value)))


def learn_period_us(known_us: int, stamps: Iterable[list[int]]) -> int:
    """The driver's sample period: the smallest positive gap between two samples of one process, in ``stamps``
    (each process's timestamps) or ``known_us`` (0: unknown), whichever is smaller."""
    best = known_us
    for seen in stamps:
        ordered = sorted(set(seen))
        for earlier, later in itertools.pairwise(ordered):
            gap = later - earlier
            if best <= 0 or gap < best:
                best = gap
    return best


def mig_profile(name: str) -> str:
    """``3g.20gb`` from a MIG device name such as ``NVIDIA A100-PCIE-40GB MIG 3g.20gb``."""
    _, found, profile = name.rpartition(" MIG ")
    return profile.strip() if found else name


class UsageReader:
    """Reads a :class:`DeviceUsage` of a device through an :class:`NvmlCaller`."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._nvml = caller.nvml
        self._mig_static: dict[str, _MigStatic] = {}
        self._mig_gpm = MigGpmReader(caller)

    def close(self) -> None:
        """Free the per-instance GPM sample buffers."""
        self._mig_gpm.close()

    def read(self, device: Device) -> DeviceUsage:
        """The device's usage now; raises ``GpuLost`` when NVML says it is gone."""
        nvml = self._nvml
        mode = self._caller.optional(device, "mig_mode", nvml.nvmlDeviceGetMigMode)
        mig_enabled = None if mode is None else bool(mode[0])
        mig_pending = None if mode is None else bool(mode[1])
        handles = self._mig_handles(device) if mig_enabled else []
        instances = self._with_activity(device, tuple(instance for instance, _ in handles))
        processes = self._processes(device)
        if processes is None and handles:
            # Without privileges NVML lists no processes for the whole GPU in MIG mode: ask each instance.
            processes = self._instance_processes(handles)
        utilization: dict[int, ProcessUtilization] | None = None
        if not mig_enabled:
            utilization = self._utilization(device)
        gpu = GpuUsage(
            index=device.index,
            uuid=device.info.uuid,
            minor_number=device.info.minor_number,
            mig_enabled=mig_enabled,
            mig_pending=mig_pending,
            instances=instances,
            processes_readable=processes is not None,
            process_utilization=utilization is not None,
        )
        return DeviceUsage(gpu, processes or (), utilization or {})

    # Processes

    def _processes(self, device: Device) -> tuple[NvmlProcess, ...] | None:
        """Every PID of the three lists, merged (one PID can be compute and graphics); ``None`` if none answered."""
        merged: dict[int, NvmlProcess] = {}
        answered = False
        for kind, names in _PROCESS_FUNCTIONS:
            listed = self._list(device, kind, names)
            if listed is None:
                continue
            answered = True
            for entry in listed:
                pid = int(entry.pid)
                memory = entry.usedGpuMemory
                gi, ci = getattr(entry, "gpuInstanceId", INSTANCE_ID_NONE), getattr(entry, "computeInstanceId", 0)
                known = merged.get(pid)
                kinds = (kind,) if known is None else (*known.kinds, kind)
                if known is not None and known.memory_bytes is not None:
                    memory = known.memory_bytes if memory is None else max(int(memory), known.memory_bytes)
                merged[pid] = NvmlProcess(
                    pid,
                    kinds,
                    None if memory is None else int(memory),
                    None if gi == INSTANCE_ID_NONE else int(gi),
                    None if gi == INSTANCE_ID_NONE else int(ci),
                )
        return tuple(merged.values()) if answered else None

    def _list(self, device: Device, kind: str, names: tuple[str, ...]) -> list[Any] | None:
        for name in names:
            metric = f"processes:{name}"
            if not self._caller.supported(device, metric):
                continue
            fn: Callable[..., list[Any]] | None = getattr(self._nvml, name, None)
            if fn is None:
                device.unsupported.add(metric)
                continue
            listed = self._caller.optional(device, metric, fn)
            if listed is not None or self._caller.supported(device, metric):
                return listed
        return None

    def _utilization(self, device: Device) -> dict[int, ProcessUtilization] | None:
        """Per PID, the time-weighted mean of its samples since the last reading (see the module docstring);
        ``None`` when NVML does not report it."""
        nvml = self._nvml
        metric = "process_utilization"
        if not self._caller.supported(device, metric):
            return None
        try:
            samples = self._caller.call(nvml.nvmlDeviceGetProcessUtilization, device.handle, device.util_last_seen_us)
        except nvml.NVMLError_NotFound:
            return {}
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add(metric)
            return None
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            return None
        previous = device.util_last_seen_us
        sums: dict[int, list[float]] = {}
        stamps: dict[int, list[int]] = {}
        for sample in samples:
            stamp = int(sample.timeStamp)
            if stamp <= previous:
                continue
            pid = int(sample.pid)
            stamps.setdefault(pid, []).append(stamp)
            totals = sums.setdefault(pid, [0.0, 0.0, 0.0, 0.0, 0.0])
            totals[0] += clamp_pct(sample.smUtil)
            totals[1] += clamp_pct(sample.memUtil)
            totals[2] += clamp_pct(sample.encUtil)
            totals[3] += clamp_pct(sample.decUtil)
            totals[4] += 1
        if not sums:
            return {}
        device.util_period_us = learn_period_us(device.util_period_us, stamps.values())
        oldest = min(min(seen) for seen in stamps.values())
        newest = max(max(seen) for seen in stamps.values())
        device.util_last_seen_us = newest
        period = device.util_period_us
        window = (newest - previous) if previous else (newest - oldest + period)
        if period <= 0 or window <= 0:
            return {
                pid: ProcessUtilization(*(clamp_pct(v / t[4]) for v in t[:4])) for pid, t in sums.items()
            }
        scale = period / window
        return {pid: ProcessUtilization(*(clamp_pct(v * scale) for v in t[:4])) for pid, t in sums.items()}

    # MIG

    def _mig_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A call about a MIG device or instance: ``None`` on an NVML error, ``GpuLost`` if the parent is gone."""
        nvml = self._nvml
        try:
            return self._caller.call(fn, *args)
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost from None
        except nvml.NVMLError:
            return None

    def _instance_processes(self, handles: list[tuple[MigInstance, Any]]) -> tuple[NvmlProcess, ...] | None:
        """Each MIG device's own process lists, tagged with its instance ids; ``None`` if none answered."""
        found: list[NvmlProcess] = []
        answered = False
        for instance, handle in handles:
            kinds: dict[int, NvmlProcess] = {}
            for kind, names in _PROCESS_FUNCTIONS:
                fn = getattr(self._nvml, names[0], None)
                listed = None if fn is None else self._mig_call(fn, handle)
                if listed is None:
                    continue
                answered = True
                for entry in listed:
                    pid, memory = int(entry.pid), entry.usedGpuMemory
                    known = kinds.get(pid)
                    kinds[pid] = NvmlProcess(
                        pid,
                        (kind,) if known is None else (*known.kinds, kind),
                        None if memory is None else int(memory),
                        instance.gpu_instance_id,
                        instance.compute_instance_id,
                    )
            found.extend(kinds.values())
        return tuple(found) if answered else None

    def _with_activity(self, device: Device, instances: tuple[MigInstance, ...]) -> tuple[MigInstance, ...]:
        """The instances with their GPU instance's GPM activity filled in where GPM reports it."""
        activity = self._mig_gpm.read(device, {instance.gpu_instance_id for instance in instances})
        return tuple(
            instance
            if (found := activity.get(instance.gpu_instance_id)) is None
            else dataclasses.replace(
                instance,
                sm_active_pct=found.graphics_active_pct,
                gpm_sm_active_pct=found.sm_active_pct,
                gpm_sm_occupancy_pct=found.sm_occupancy_pct,
            )
            for instance in instances
        )

    def _mig_handles(self, device: Device) -> list[tuple[MigInstance, Any]]:
        """The MIG devices of a GPU in MIG mode with their handles, static parts learnt once per MIG UUID."""
        nvml = self._nvml
        count = self._caller.optional(device, "mig_count", nvml.nvmlDeviceGetMaxMigDeviceCount)
        instances: list[tuple[MigInstance, Any]] = []
        for index in range(int(count or 0)):
            handle = self._mig_call(nvml.nvmlDeviceGetMigDeviceHandleByIndex, device.handle, index)
            if handle is None:
                continue
            uuid_value = self._mig_call(nvml.nvmlDeviceGetUUID, handle)
            if uuid_value is None:
                continue
            uuid = text_of(uuid_value)
            static = self._mig_static.get(uuid) or self._learn_mig(device, handle, uuid)
            if static is None:
                continue
            memory = self._mig_memory(device, handle)
            instances.append((MigInstance(
                gpu_index=device.index,
                uuid=uuid,
                gpu_instance_id=static.gpu_instance_id,
                compute_instance_id=static.compute_instance_id,
                profile=static.profile,
                placement_start=static.placement_start,
                placement_size=static.placement_size,
                sm_count=static.sm_count,
                memory_used_bytes=None if memory is None else int(memory.used),
                memory_total_bytes=static.memory_total_bytes if memory is None else int(memory.total),
                sm_active_pct=None,
            ), handle))
        return instances

    def _mig_memory(self, device: Device, handle: Any) -> Any:
        """A MIG device's ``nvmlMemory_v2_t`` (used excludes the driver's reservation, as nvidia-smi shows it);
        ``nvmlMemory_t`` (v1, which counts the reservation as used) on a driver without v2, remembered per GPU."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and MIG_MEMORY_V2 not in device.unsupported:
            try:
                return self._caller.call(functools.partial(nvml.nvmlDeviceGetMemoryInfo, version=version), handle)
            except (
                nvml.NVMLError_NotSupported,
                nvml.NVMLError_FunctionNotFound,
                nvml.NVMLError_ArgumentVersionMismatch,
            ):
                device.unsupported.add(MIG_MEMORY_V2)
            except nvml.NVMLError_GpuIsLost:
                raise GpuLost from None
            except nvml.NVMLError:
                return None
        return self._mig_call(nvml.nvmlDeviceGetMemoryInfo, handle)

    def _learn_mig(self, device: Device, handle: Any, uuid: str) -> _MigStatic | None:
        nvml = self._nvml
        gpu_instance_id = self._mig_call(nvml.nvmlDeviceGetGpuInstanceId, handle)
        compute_instance_id = self._mig_call(nvml.nvmlDeviceGetComputeInstanceId, handle)
        if gpu_instance_id is None or compute_instance_id is None:
            return None
        name = self._mig_call(nvml.nvmlDeviceGetName, handle)
        attributes = self._mig_call(nvml.nvmlDeviceGetAttributes_v2, handle)
        start = size = None
        # Placement needs the GPU instance handle, which NVML gives to privileged users only.
        instance = self._mig_call(nvml.nvmlDeviceGetGpuInstanceById, device.handle, int(gpu_instance_id))
        info = None if instance is None else self._mig_call(nvml.nvmlGpuInstanceGetInfo, instance)
        if info is not None:
            start, size = int(info.placement.start), int(info.placement.size)
        static = _MigStatic(
            gpu_instance_id=int(gpu_instance_id),
            compute_instance_id=int(compute_instance_id),
            profile=mig_profile(text_of(name)) if name is not None else "unknown",
            placement_start=start,
            placement_size=size,
            sm_count=None if attributes is None else int(attributes.multiprocessorCount),
            memory_total_bytes=None if attributes is None else int(attributes.memorySizeMB) * 1024 * 1024,
        )
        self._mig_static[uuid] = static
        return static
