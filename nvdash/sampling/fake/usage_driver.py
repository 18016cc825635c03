"""The simulated driver's process and MIG functions, with the C signatures pynvml calls them with.

Each body gets the resolved parent GPU index in ``call.device`` (a MIG device handle resolves to its parent)
and looks at the raw handle to tell a MIG device from the whole GPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from . import constants as c
from .cargs import address_of, as_int, store_address, target
from .mig import MAX_MIG_DEVICES, MigLayouts
from .processes import ProcessTable
from .profiles import Profile
from .usage_specs import ProcessSpec

_OK = c.NVML_SUCCESS
_MIB = 1024 * 1024
_PROCESS_LISTS = {
    "nvmlDeviceGetComputeRunningProcesses_v3": "compute",
    "nvmlDeviceGetGraphicsRunningProcesses_v3": "graphics",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": "mps",
}
MIG_HANDLE_FUNCTIONS = frozenset({
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetAttributes_v2",
    *_PROCESS_LISTS,
})
"""What a MIG device handle may be asked; anything else answers NOT_SUPPORTED (e.g. temperature, power)."""


class UsageFunctions:
    """Process lists, per-process utilization and MIG queries over a :class:`ProcessTable` and MIG layouts."""

    def __init__(
        self,
        profile: Profile,
        processes: ProcessTable,
        mig: MigLayouts,
        device_address: Callable[[int], int],
        created_at: float,
    ) -> None:
        self._profile = profile
        self.processes = processes
        self.mig = mig
        self._device_address = device_address
        self._created_at = created_at
        self.privileged = True
        """False: the caller is not root. On a GPU in MIG mode the whole-GPU process lists and the GPU instance
        handles then answer NO_PERMISSION (nvml.h: aggregate information needs privileges; per-instance
        information comes from the MIG device handles)."""

    def bodies(self) -> dict[str, Callable[..., int]]:
        """Entry point name -> body, all taking a device handle first except ``nvmlGpuInstanceGetInfo``."""
        bodies: dict[str, Callable[..., int]] = {name: self._list_for(kind) for name, kind in _PROCESS_LISTS.items()}
        bodies |= {
            "nvmlDeviceGetProcessUtilization": self.device_get_process_utilization,
            "nvmlDeviceGetMigMode": self.device_get_mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": self.device_get_max_mig_device_count,
            "nvmlDeviceGetMigDeviceHandleByIndex": self.device_get_mig_device_handle_by_index,
            "nvmlDeviceIsMigDeviceHandle": self.device_is_mig_device_handle,
            "nvmlDeviceGetGpuInstanceId": self.device_get_gpu_instance_id,
            "nvmlDeviceGetComputeInstanceId": self.device_get_compute_instance_id,
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": self.device_get_device_handle_from_mig,
            "nvmlDeviceGetGpuInstanceById": self.device_get_gpu_instance_by_id,
            "nvmlDeviceGetAttributes_v2": self.device_get_attributes,
        }
        return bodies

    def mig_of(self, handle: object) -> tuple[int, int] | None:
        """(GPU, instance index) when ``handle`` is a MIG device handle."""
        address = address_of(handle)
        return None if address is None else self.mig.device_of(address)

    # Processes

    def _list_for(self, kind: str) -> Callable[..., int]:
        def body(call: Any, handle: object, count: object, infos: object) -> int:
            return self._list(call, handle, kind, count, infos)

        body.__name__ = f"device_get_{kind}_running_processes"
        return body

    def _list(self, call: Any, handle: object, kind: str, count: object, infos: object) -> int:
        """The size query (``infos`` NULL) and the filled-in list, as nvml.h documents both."""
        gpu, t = call.device, call.now - self._created_at
        mig = self.mig_of(handle)
        if mig is None and not self.privileged and self.mig.enabled(gpu):
            return c.NVML_ERROR_NO_PERMISSION
        listed = [s for s in self.running(gpu) if kind in s.kinds and (mig is None or s.mig == mig[1])]
        size = target(count)
        if infos is None or size.value < len(listed):
            size.value = len(listed)
            return _OK if not listed else c.NVML_ERROR_INSUFFICIENT_SIZE
        out = target(infos)
        for i, spec in enumerate(listed):
            out[i].pid = spec.pid
            out[i].usedGpuMemory = self.processes.memory_bytes(spec, t)
            out[i].gpuInstanceId, out[i].computeInstanceId = self._instance_ids(gpu, spec)
        size.value = len(listed)
        return _OK

    def running(self, gpu: int) -> list[ProcessSpec]:
        """The processes on ``gpu`` now: those pinned to a MIG instance run only while MIG is on."""
        mig_on = self.mig.enabled(gpu)
        return [spec for spec in self.processes.on_gpu(gpu) if spec.mig is None or mig_on]

    def whole_gpu_fixed_bytes(self, gpu: int) -> int:
        """Fixed-size memory of the processes running on ``gpu`` with MIG off."""
        return sum(spec.memory_mib * _MIB for spec in self.processes.on_gpu(gpu) if spec.mig is None)

    def _instance_ids(self, gpu: int, spec: ProcessSpec) -> tuple[int, int]:
        if spec.mig is None or not self.mig.enabled(gpu):
            return c.NVML_INSTANCE_ID_NONE, c.NVML_INSTANCE_ID_NONE
        instance, _ = self.mig.spec(gpu, spec.mig)
        return instance.gpu_instance_id, instance.compute_instance_id

    def device_get_process_utilization(
        self, call: Any, handle: object, samples: object, count: object, last_seen: object
    ) -> int:
        """Samples newer than ``last_seen`` (µs); NOT_FOUND when there is none; not on MIG (nvidia-smi: N/A)."""
        if self.mig.enabled(call.device) or self.mig_of(handle) is not None:
            return c.NVML_ERROR_NOT_SUPPORTED
        found = self.processes.utilization_samples(call.device, call.now, as_int(last_seen))
        if not found:
            return c.NVML_ERROR_NOT_FOUND
        size = target(count)
        if samples is None or size.value < len(found):
            size.value = len(found)
            return c.NVML_ERROR_INSUFFICIENT_SIZE
        out = target(samples)
        for i, sample in enumerate(found):
            out[i].pid, out[i].timeStamp = sample.pid, sample.timestamp_us
            out[i].smUtil, out[i].memUtil = sample.sm, sample.memory
            out[i].encUtil, out[i].decUtil = sample.encoder, sample.decoder
        size.value = len(found)
        return _OK

    # MIG

    def _mig_capable(self, handle: object) -> bool:
        return self._profile.mig_capable and self.mig_of(handle) is None

    def device_get_mig_mode(self, call: Any, handle: object, current: object, pending: object) -> int:
        if not self._mig_capable(handle):
            return c.NVML_ERROR_NOT_SUPPORTED
        mode = int(self.mig.enabled(call.device))
        target(current).value = mode
        target(pending).value = mode
        return _OK

    def device_get_max_mig_device_count(self, _call: Any, handle: object, count: object) -> int:
        if not self._mig_capable(handle):
            return c.NVML_ERROR_NOT_SUPPORTED
        target(count).value = MAX_MIG_DEVICES
        return _OK

    def device_get_mig_device_handle_by_index(self, call: Any, handle: object, index: object, out: object) -> int:
        """NOT_FOUND for an index with no MIG device (or MIG mode off), as nvml.h documents."""
        if not self._mig_capable(handle):
            return c.NVML_ERROR_NOT_SUPPORTED
        which = as_int(index)
        if not 0 <= which < MAX_MIG_DEVICES:
            return c.NVML_ERROR_INVALID_ARGUMENT
        address = self.mig.device_address(call.device, which)
        if address is None:
            return c.NVML_ERROR_NOT_FOUND
        store_address(out, address)
        return _OK

    def device_is_mig_device_handle(self, _call: Any, handle: object, is_mig: object) -> int:
        target(is_mig).value = int(self.mig_of(handle) is not None)
        return _OK

    def device_get_gpu_instance_id(self, _call: Any, handle: object, out: object) -> int:
        mig = self.mig_of(handle)
        if mig is None:
            return c.NVML_ERROR_NOT_SUPPORTED
        target(out).value = self.mig.spec(*mig)[0].gpu_instance_id
        return _OK

    def device_get_compute_instance_id(self, _call: Any, handle: object, out: object) -> int:
        mig = self.mig_of(handle)
        if mig is None:
            return c.NVML_ERROR_NOT_SUPPORTED
        target(out).value = self.mig.spec(*mig)[0].compute_instance_id
        return _OK

    def device_get_device_handle_from_mig(self, call: Any, handle: object, out: object) -> int:
        if self.mig_of(handle) is None:
            return c.NVML_ERROR_INVALID_ARGUMENT
        store_address(out, self._device_address(call.device))
        return _OK

    def device_get_gpu_instance_by_id(self, call: Any, handle: object, instance_id: object, out: object) -> int:
        if not self._mig_capable(handle):
            return c.NVML_ERROR_NOT_SUPPORTED
        if not self.mig.enabled(call.device):
            return c.NVML_ERROR_INVALID_ARGUMENT
        if not self.privileged:
            return c.NVML_ERROR_NO_PERMISSION
        address = self.mig.instance_address(call.device, as_int(instance_id))
        if address is None:
            return c.NVML_ERROR_NOT_FOUND
        store_address(out, address)
        return _OK

    def gpu_instance_get_info(self, _call: Any, instance: object, info: object) -> int:
        """``nvmlGpuInstanceInfo_t``: parent device, id, profile id and placement (memory slices)."""
        address = address_of(instance)
        found = None if address is None else self.mig.instance_of(address)
        if found is None:
            return c.NVML_ERROR_INVALID_ARGUMENT
        spec, profile = self.mig.spec(*found)
        out = target(info)
        ctypes.c_void_p.from_address(ctypes.addressof(out) + type(out).device.offset).value = self._device_address(
            found[0]
        )
        out.id = spec.gpu_instance_id
        out.profileId = profile.profile_id
        out.placement.start = spec.placement_start
        out.placement.size = profile.placement_size
        return _OK

    def device_get_attributes(self, call: Any, handle: object, attributes: object) -> int:
        """``nvmlDeviceAttributes_t`` of a MIG device, or of the whole GPU."""
        out = target(attributes)
        mig = self.mig_of(handle)
        if mig is not None:
            _, profile = self.mig.spec(*mig)
            out.multiprocessorCount = profile.sm_count
            out.gpuInstanceSliceCount = profile.slices
            out.computeInstanceSliceCount = profile.slices
            out.memorySizeMB = profile.memory_mib
            return _OK
        full = max(self.mig.profiles.values(), key=lambda profile: profile.slices)
        out.multiprocessorCount = self._profile.sm_count
        out.gpuInstanceSliceCount = full.slices if self._profile.mig_capable else 0
        out.computeInstanceSliceCount = full.slices if self._profile.mig_capable else 0
        out.memorySizeMB = self._profile.memory_total_mib
        return _OK

    # What the whole-GPU functions answer for a MIG device

    def mig_name(self, gpu_name: str, mig: tuple[int, int]) -> str:
        """``<GPU name> MIG <profile>``, as ``nvmlDeviceGetName`` names a MIG device."""
        return f"{gpu_name} MIG {self.mig.spec(*mig)[0].profile}"

    def mig_memory(self, mig: tuple[int, int]) -> tuple[int, int, int]:
        """(total, used including the reservation, reserved) bytes of a MIG device.

        The driver reserves part of each instance's memory; the fake gives each instance the GPU's reservation
        in proportion to its memory (whole MiB). ``nvmlMemory_t.used`` (v1) counts it, ``nvmlMemory_v2_t.used``
        does not (nvml.h), so the two calls differ on a MIG device as on a whole GPU.
        """
        _, profile = self.mig.spec(*mig)
        total = profile.memory_mib * _MIB
        reserved = self._profile.memory_reserved_mib * profile.memory_mib // max(1, self._profile.memory_total_mib)
        return total, self.processes.mig_used_bytes(*mig) + reserved * _MIB, reserved * _MIB

    def parent_mig_used(self, gpu: int) -> int:
        """Memory used on a GPU in MIG mode: the sum over its instances."""
        return sum(self.processes.mig_used_bytes(gpu, i) for i in range(len(self.mig.layout(gpu))))
