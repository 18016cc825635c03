"""Putting together who uses the GPUs: NVML's processes and MIG, the host's view of each PID, and the pods.

Runs on the sampler thread at its own cadence (see :class:`~nvdash.sampling.sampler.Sampler`). A process is
named after a pod when the evidence is unambiguous:

- its cgroup names a pod UID and the kubelet's pod log directories name that UID; or
- the kubelet allocated its GPU (or MIG instance) to exactly one pod, and its cgroup puts it in a pod (or the
  host cannot see the PID at all); a process whose cgroup says it is not in a pod is never named after one.

A GPU or MIG device a pod got through a DRA claim counts as allocated to it like a device plugin's (see
:mod:`nvdash.sampling.kubelet.dra`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from nvdash.sampling.grants import collect_grants
from nvdash.sampling.kubelet.dra import with_claims
from nvdash.sampling.nvml_usage import DeviceUsage, NvmlProcess
from nvdash.sampling.usage_records import GpuProcess, HostProcess, MigInstance, PodDevice, PodResources, Usage

DEFAULT_INTERVAL_S = 2.0
"""Seconds between process readings: slower than the GPU metrics, fast enough to see a job start."""


class UsageSource(Protocol):
    """Anything that reads each GPU's processes and MIG state within a time budget (the NVML source)."""

    def read_usage(self, timeout_s: float, meanwhile: Callable[[], object] | None = None) -> tuple[DeviceUsage, ...]:
        ...


class HostLookup(Protocol):
    """The host's view of PIDs (``HostProcessTable``)."""

    def lookup(self, pids: Iterable[int], *, prune: bool = True) -> dict[int, HostProcess]: ...


class PodSource(Protocol):
    """The kubelet's latest answer (``PodResourcesWatcher``)."""

    def latest(self) -> PodResources: ...


class UsageCollector:
    """Reads a :class:`Usage` from the NVML source, the host, and (optionally) the kubelet."""

    def __init__(
        self,
        gpus: UsageSource | None,
        host: HostLookup,
        pods: PodSource | None = None,
        pod_names: Callable[[], Mapping[str, tuple[str, str]]] | None = None,
    ) -> None:
        self._gpus = gpus
        self._host = host
        self._pods = pods
        self._pod_names = pod_names
        self._previous_pids: list[int] = []

    def collect(self, time_s: float, timeout_s: float) -> Usage:
        """Everything known now; ``timeout_s`` bounds the wait for NVML.

        The host lookup of the PIDs seen last time runs while NVML answers; PIDs new in this round are looked up
        after it.
        """
        hosts: dict[int, HostProcess] = {}

        def look_up_known() -> None:
            hosts.update(self._host.lookup(self._previous_pids))

        devices = self._gpus.read_usage(timeout_s, look_up_known) if self._gpus is not None else ()
        pods = with_claims(self._pods.latest() if self._pods is not None else PodResources(), [d.gpu for d in devices])
        pids = sorted({process.pid for device in devices for process in device.processes})
        known = set(self._previous_pids)
        new = [pid for pid in pids if pid not in known]
        if new:
            hosts.update(self._host.lookup(new, prune=False))
        self._previous_pids = pids
        needs_names = self._pod_names is not None and any(h.cgroup.pod_uid for h in hosts.values())
        names = self._pod_names() if self._pod_names is not None and needs_names else {}
        allocated: dict[str, list[PodDevice]] = {}
        for device in pods.devices:
            allocated.setdefault(device.uuid, []).append(device)
        processes = [
            _process(device, process, hosts.get(process.pid), allocated, names)
            for device in devices
            for process in device.processes
        ]
        pods = with_mps(pods, processes)
        return Usage(time_s=time_s, gpus=tuple(d.gpu for d in devices), processes=tuple(processes), pods=pods,
                     grants=collect_grants(pods, processes))


def with_mps(pods: PodResources, processes: Iterable[GpuProcess]) -> PodResources:
    """``pods`` with each shared replica of a GPU (or MIG instance) that NVML lists MPS clients on called ``mps``:
    the device plugin names MPS replicas like time-sliced ones."""
    served = {process.mig_uuid or process.gpu_uuid for process in processes if "mps" in process.kinds}
    if not served or not any(device.sharing == "shared" and device.uuid in served for device in pods.devices):
        return pods
    devices = tuple(
        dataclasses.replace(device, sharing="mps") if device.sharing == "shared" and device.uuid in served else device
        for device in pods.devices
    )
    return dataclasses.replace(pods, devices=devices)


def _instance(device: DeviceUsage, process: NvmlProcess) -> MigInstance | None:
    if process.gpu_instance_id is None:
        return None
    for instance in device.gpu.instances:
        if (instance.gpu_instance_id, instance.compute_instance_id) == (
            process.gpu_instance_id,
            process.compute_instance_id,
        ):
            return instance
    return None


def _process(
    device: DeviceUsage,
    process: NvmlProcess,
    host: HostProcess | None,
    allocated: Mapping[str, list[PodDevice]],
    names: Mapping[str, tuple[str, str]],
) -> GpuProcess:
    instance = _instance(device, process)
    utilization = device.utilization.get(process.pid)
    measured = device.gpu.process_utilization
    pod = _pod_of(host, allocated.get(instance.uuid if instance else device.gpu.uuid, []), names)
    return GpuProcess(
        gpu_index=device.gpu.index,
        gpu_uuid=device.gpu.uuid,
        pid=process.pid,
        kinds=process.kinds,
        gpu_memory_bytes=process.memory_bytes,
        mig_uuid=None if instance is None else instance.uuid,
        mig_profile=None if instance is None else instance.profile,
        sm_pct=None if not measured else utilization.sm_pct if utilization else 0.0,
        memory_pct=None if not measured else utilization.memory_pct if utilization else 0.0,
        encoder_pct=None if not measured else utilization.encoder_pct if utilization else 0.0,
        decoder_pct=None if not measured else utilization.decoder_pct if utilization else 0.0,
        host=host,
        pod_namespace=None if pod is None else pod[0],
        pod_name=None if pod is None else pod[1],
        container_name=None if pod is None else pod[2],
    )


def _pod_of(
    host: HostProcess | None, candidates: list[PodDevice], names: Mapping[str, tuple[str, str]]
) -> tuple[str, str, str | None] | None:
    """(namespace, pod, container) of a process, when the evidence names one pod (see the module docstring)."""
    uid = host.cgroup.pod_uid if host is not None else None
    if host is not None and uid is None:
        return None
    if uid is not None and uid in names:
        namespace, pod = names[uid]
        containers = {d.container for d in candidates if (d.namespace, d.pod) == (namespace, pod)}
        return namespace, pod, containers.pop() if len(containers) == 1 else None
    owners = {(d.namespace, d.pod, d.container) for d in candidates}
    if len(owners) != 1:
        return None
    only = next(iter(owners))
    if host is None and any(d.sharing == "shared" for d in candidates):
        return None
    return only
