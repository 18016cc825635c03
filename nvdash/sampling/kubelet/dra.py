"""GPUs allocated through Dynamic Resource Allocation: the kubelet's ``dynamic_resources``, mapped to GPUs.

The kubelet's pod-resources ``List`` answers, per container, the ResourceClaims it prepared and each claim's
devices as (driver, pool, device) names (Kubernetes 1.31+; 1.27-1.30 named a class and CDI devices only). NVIDIA's
DRA driver (driver ``gpu.nvidia.com``, pool = the node's name) names its devices after the GPU's minor number
(the N of ``/dev/nvidiaN``, not NVML's index):

- a whole GPU: ``gpu-<minor>``;
- a MIG device (releases 25.12 on): ``gpu-<parent minor>-mig-<profile>-<profile id>-<placement start>``, the
  profile lower-cased without dots (``1g.10gb`` -> ``1g10gb``, ``1g.10gb+me`` -> ``1g10gb-me``);
- a MIG device (releases 25.3 and 25.8): ``gpu-<parent minor>-mig-<profile id>-<placement start>-<placement size>``;
- a GPU handed to a virtual machine (VFIO): ``gpu-vfio-<index>``: no host process can run on it.

Its CDI device names (``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0``) carry no UUID. A device nvdash cannot map
(another driver, a name of another form, no GPU with that minor number here) is kept as an allocation with a
``note`` saying why and a ``device_id`` that names no GPU, so it is listed but never put on a GPU by guess.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from nvdash.sampling.usage_records import ClaimDevice, GpuUsage, MigInstance, PodDevice, PodResources

NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
_WHOLE = re.compile(r"gpu-(\d+)")
_MIG_BY_SIZE = re.compile(r"gpu-(\d+)-mig-(\d+)-(\d+)-(\d+)")
"""Profile id, placement start, placement size (driver releases 25.3, 25.8)."""
_MIG_BY_PROFILE = re.compile(r"gpu-(\d+)-mig-(.+)-(\d+)-(\d+)")
"""Profile name, profile id, placement start (driver releases 25.12 on)."""
_VFIO = re.compile(r"gpu-vfio-(\d+)")


def claim_devices(response: Any) -> tuple[ClaimDevice, ...]:
    """The DRA devices of a ``ListPodResourcesResponse``, one per (pod, container, claim, device), in its order."""
    seen: set[ClaimDevice] = set()
    found: list[ClaimDevice] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    device = ClaimDevice(
                        pod.namespace, pod.name, container.name, claim.claim_namespace or pod.namespace,
                        claim.claim_name, resource.driver_name, resource.pool_name, resource.device_name,
                        resource.share_id or None, tuple(cdi.name for cdi in resource.cdi_devices),
                        claim.class_name or None)
                    if device not in seen:
                        seen.add(device)
                        found.append(device)
    return tuple(found)


def resource_name(claim: ClaimDevice) -> str:
    """What nvdash shows as the allocation's resource, e.g. ``gpu.nvidia.com (DRA claim ml/train-gpu)``."""
    return f"{claim.driver or 'unknown driver'} (DRA claim {claim.claim_namespace}/{claim.claim_name})"


def profile_key(profile: str) -> str:
    """A MIG profile as the NVIDIA DRA driver writes it in device names: ``1g.10gb+me`` -> ``1g10gb-me``."""
    name = re.sub(r"[^a-z0-9.-]", "-", profile.lower()).strip("-")
    return name.removesuffix(".").replace(".", "")


def _unmapped(claim: ClaimDevice, note: str) -> PodDevice:
    if claim.device:
        where = "/".join(part for part in (claim.driver, claim.pool, claim.device) if part)
    else:
        where = ",".join(claim.cdi_devices) or f"DRA claim {claim.claim_namespace}/{claim.claim_name}"
    return PodDevice(claim.namespace, claim.pod, claim.container, resource_name(claim), where, "whole", note)


def _mig(claim: ClaimDevice, parent: GpuUsage, match: Iterable[MigInstance]) -> PodDevice:
    found = list(match)
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        return _unmapped(claim, f"DRA device {claim.device}: {what} MIG devices of GPU {parent.index} match it")
    return PodDevice(claim.namespace, claim.pod, claim.container, resource_name(claim), found[0].uuid, "mig")


def map_claim(claim: ClaimDevice, gpus: Sequence[GpuUsage]) -> PodDevice:
    """The allocation ``claim`` is on ``gpus`` (NVML's view now), or an unmapped one with a note saying why."""
    if claim.driver != NVIDIA_GPU_DRIVER:
        if not claim.driver:
            of_class = f" of class {claim.class_name}" if claim.class_name else ""
            return _unmapped(claim, f"DRA claim{of_class} from a kubelet older than 1.31, which names no device")
        return _unmapped(claim, f"DRA device {claim.device} of driver {claim.driver}: not an NVIDIA GPU driver")
    if _VFIO.fullmatch(claim.device):
        return _unmapped(claim, f"DRA device {claim.device}: a GPU passed through to a virtual machine (VFIO)")
    whole = _WHOLE.fullmatch(claim.device)
    mig = _MIG_BY_SIZE.fullmatch(claim.device) or _MIG_BY_PROFILE.fullmatch(claim.device)
    minor_text = whole.group(1) if whole else mig.group(1) if mig else None
    if minor_text is None:
        return _unmapped(claim, f"DRA device {claim.device}: not a name the NVIDIA DRA driver gives")
    parents = [gpu for gpu in gpus if gpu.minor_number == int(minor_text)]
    if len(parents) != 1:
        return _unmapped(claim, f"DRA device {claim.device}: no GPU with minor number {minor_text} here")
    parent = parents[0]
    sharing = "shared" if claim.share_id else "whole"
    if whole:
        return PodDevice(claim.namespace, claim.pod, claim.container, resource_name(claim), parent.uuid, sharing)
    assert mig is not None
    if mig.re is _MIG_BY_SIZE:
        start, size = int(mig.group(3)), int(mig.group(4))
        return _mig(claim, parent, (instance for instance in parent.instances
                                    if (instance.placement_start, instance.placement_size) == (start, size)))
    key, start = mig.group(2), int(mig.group(4))
    return _mig(claim, parent, (instance for instance in parent.instances
                                if instance.placement_start == start and profile_key(instance.profile) == key))


def with_claims(pods: PodResources, gpus: Sequence[GpuUsage]) -> PodResources:
    """``pods`` with its DRA devices mapped onto ``gpus`` and added to ``devices`` (each container's device once);
    the status says how many could not be mapped."""
    if not pods.claim_devices:
        return pods
    known = {(device.namespace, device.pod, device.container, device.device_id) for device in pods.devices}
    added: list[PodDevice] = []
    for claim in pods.claim_devices:
        device = map_claim(claim, gpus)
        key = (device.namespace, device.pod, device.container, device.device_id)
        if key not in known:
            known.add(key)
            added.append(device)
    unmapped = sum(1 for device in added if device.note is not None)
    status = pods.status
    if unmapped:
        status += f"; {unmapped} DRA device{'s' if unmapped != 1 else ''} not mapped to a GPU here"
    return dataclasses.replace(pods, devices=pods.devices + tuple(added), status=status)
