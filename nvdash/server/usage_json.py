"""``/api/processes.json``: who uses each GPU (processes, containers, pods, MIG instances, idle allocations), how
each GPU or MIG instance divides among them (``shares``, see :mod:`nvdash.server.shares_json`), the vGPU and MPS
quotas (``grants``) and where use and quota disagree (``quota_findings``).

Values come from the store's latest snapshot, units in the names; ``null`` means unknown or not reported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nvdash.health.quota_judge import store_findings
from nvdash.sampling.usage_records import GpuProcess, GpuUsage, MigInstance, Usage
from nvdash.server.shares_json import shares_json
from nvdash.store import Store


def mig_json(gpu: GpuUsage | None) -> dict[str, Any] | None:
    """A GPU's MIG mode and instances (``null`` before the first reading)."""
    if gpu is None:
        return None
    return {
        "enabled": gpu.mig_enabled,
        "pending": gpu.mig_pending,
        "instances": [instance_json(instance) for instance in gpu.instances],
    }


def instance_json(instance: MigInstance) -> dict[str, Any]:
    """One MIG instance; ``sm_active_pct`` is ``null`` where NVML does not report it per instance."""
    fields = dataclasses.asdict(instance)
    fields.pop("gpu_index")
    return fields


def process_json(process: GpuProcess, now_s: float) -> dict[str, Any]:
    """One process on one GPU, with its host, container and pod where known."""
    host = process.host
    cgroup = host.cgroup if host is not None else None
    container = None
    if cgroup is not None and cgroup.container_id is not None:
        container = {"runtime": cgroup.runtime, "id": cgroup.container_id}
    pod = None
    if process.pod_name is not None or (cgroup is not None and cgroup.pod_uid is not None):
        pod = {
            "uid": None if cgroup is None else cgroup.pod_uid,
            "namespace": process.pod_namespace,
            "name": process.pod_name,
            "container": process.container_name,
            "qos": None if cgroup is None else cgroup.qos,
        }
    started = None if host is None else host.started_s
    return {
        "gpu": process.gpu_index,
        "gpu_uuid": process.gpu_uuid,
        "mig_uuid": process.mig_uuid,
        "mig_profile": process.mig_profile,
        "pid": process.pid,
        "types": list(process.kinds),
        "gpu_memory_bytes": process.gpu_memory_bytes,
        "sm_pct": process.sm_pct,
        "memory_pct": process.memory_pct,
        "encoder_pct": process.encoder_pct,
        "decoder_pct": process.decoder_pct,
        "visible": process.visible,
        "user": None if host is None else host.user,
        "command": None if host is None else host.command,
        "cpu_pct": None if host is None else host.cpu_pct,
        "rss_bytes": None if host is None else host.rss_bytes,
        "started_s": started,
        "runtime_s": None if started is None else max(0.0, now_s - started),
        "container": container,
        "pod": pod,
        "slurm_job": None if cgroup is None else cgroup.slurm_job,
    }


def processes_json(store: Store) -> dict[str, Any]:
    """The document ``/api/processes.json`` serves."""
    latest = store.latest()
    usage: Usage | None = None if latest is None else latest.usage
    if usage is None:
        return {
            "time_s": None,
            "hostname": store.inventory.host.hostname,
            "collecting": True,
            "kubernetes": None,
            "gpus": [],
            "processes": [],
            "allocations": [],
            "shares": [],
            "grants": [],
            "quota_findings": [],
        }
    idle = set(usage.idle_allocations())
    findings = store_findings(store, latest)
    return {
        "time_s": usage.time_s,
        "hostname": store.inventory.host.hostname,
        "collecting": False,
        "kubernetes": {"available": usage.pods.available, "status": usage.pods.status},
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "processes_readable": gpu.processes_readable,
                "process_utilization": gpu.process_utilization,
                "mig": mig_json(gpu),
            }
            for gpu in usage.gpus
        ],
        "processes": [process_json(process, usage.time_s) for process in usage.processes],
        "allocations": [
            {
                "namespace": device.namespace,
                "pod": device.pod,
                "container": device.container,
                "resource_name": device.resource_name,
                "device_id": device.device_id,
                "uuid": device.uuid,
                "sharing": device.sharing,
                "idle": device in idle,
                "note": device.note,
            }
            for device in usage.pods.devices
        ],
        "shares": shares_json(latest.shares if latest is not None else ()),
        "grants": [dataclasses.asdict(grant) for grant in usage.grants],
        "quota_findings": [dataclasses.asdict(finding) for finding in findings],
    }
