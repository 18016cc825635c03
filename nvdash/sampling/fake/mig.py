"""MIG on the simulated GPUs: the instance layout of each GPU in MIG mode and the handles NVML gives out.

A MIG device handle is a device handle like any other (the library resolves it to its parent GPU, so a lost
parent loses its instances too); a GPU instance handle (``nvmlGpuInstance_t``) is a separate opaque pointer.
"""

from __future__ import annotations

import ctypes
import hashlib

from .profiles import Profile
from .usage_specs import MigProfile, MigSpec, mig_profiles, validate_layout

MAX_MIG_DEVICES = 7
"""``nvmlDeviceGetMaxMigDeviceCount`` on A100/H100/B200."""


def mig_uuid(gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """A stable ``MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` UUID (the R470+ form)."""
    digest = hashlib.sha256(f"{gpu_uuid}:{gpu_instance_id}:{compute_instance_id}".encode()).hexdigest()
    return f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class MigLayouts:
    """Per GPU: its MIG mode, its instances, and the handles of their MIG devices and GPU instances."""

    def __init__(self, profile: Profile, gpu_uuids: list[str]) -> None:
        self.profiles = mig_profiles(profile.gpu_name)
        """The GPU model's MIG profile table."""
        self._configured: dict[int, tuple[MigSpec, ...]] = dict(profile.mig_layout)
        for layout in self._configured.values():
            validate_layout(layout, self.profiles)
        self._layouts = dict(self._configured)
        self._uuids = gpu_uuids
        self._device_storage: dict[tuple[int, int], ctypes.Array[ctypes.c_char]] = {}
        self._instance_storage: dict[tuple[int, int], ctypes.Array[ctypes.c_char]] = {}
        for gpu, layout in self._layouts.items():
            for index in range(len(layout)):
                self._device_storage[gpu, index] = ctypes.create_string_buffer(8)
                self._instance_storage[gpu, index] = ctypes.create_string_buffer(8)
        self._devices = {ctypes.addressof(buf): key for key, buf in self._device_storage.items()}
        self._instances = {ctypes.addressof(buf): key for key, buf in self._instance_storage.items()}

    def set_enabled(self, gpu: int, enabled: bool) -> None:
        """Turn MIG mode on ``gpu`` on (with the profile's layout for it) or off."""
        if not enabled:
            self._layouts.pop(gpu, None)
            return
        layout = self._configured.get(gpu)
        if layout is None:
            raise ValueError(f"GPU {gpu} has no MIG layout in this profile")
        self._layouts[gpu] = layout

    def enabled(self, gpu: int) -> bool:
        """True when ``gpu`` is in MIG mode."""
        return gpu in self._layouts

    def layout(self, gpu: int) -> tuple[MigSpec, ...]:
        """The instances of ``gpu`` (empty without MIG)."""
        return self._layouts.get(gpu, ())

    def spec(self, gpu: int, index: int) -> tuple[MigSpec, MigProfile]:
        """An instance and its profile."""
        spec = self._layouts[gpu][index]
        return spec, self.profiles[spec.profile]

    def uuid(self, gpu: int, index: int) -> str:
        """The MIG device's UUID."""
        spec = self._layouts[gpu][index]
        return mig_uuid(self._uuids[gpu], spec.gpu_instance_id, spec.compute_instance_id)

    def device_address(self, gpu: int, index: int) -> int | None:
        """The MIG device handle's address, or ``None`` when there is no instance at ``index``."""
        buf = self._device_storage.get((gpu, index))
        return None if buf is None else ctypes.addressof(buf)

    def device_of(self, address: int) -> tuple[int, int] | None:
        """(GPU, instance index) of a MIG device handle, or ``None`` for any other address (or MIG now off)."""
        found = self._devices.get(address)
        return found if found is not None and found[0] in self._layouts else None

    def instance_address(self, gpu: int, gpu_instance_id: int) -> int | None:
        """The GPU instance handle's address for ``gpu_instance_id`` on ``gpu``."""
        for index, spec in enumerate(self.layout(gpu)):
            if spec.gpu_instance_id == gpu_instance_id:
                return ctypes.addressof(self._instance_storage[gpu, index])
        return None

    def instance_of(self, address: int) -> tuple[int, int] | None:
        """(GPU, instance index) of a GPU instance handle (``None`` once MIG is off)."""
        found = self._instances.get(address)
        return found if found is not None and found[0] in self._layouts else None

    def instance_indexes(self, gpu: int, gpu_instance_id: int) -> list[int]:
        """The instance indexes (one per compute instance) of GPU instance ``gpu_instance_id`` on ``gpu``; empty
        when there is no such GPU instance (or MIG is off)."""
        return [index for index, spec in enumerate(self.layout(gpu)) if spec.gpu_instance_id == gpu_instance_id]

    def index_of(self, gpu: int, gpu_instance_id: int, compute_instance_id: int) -> int | None:
        """The instance index holding (GI, CI) on ``gpu``."""
        for index, spec in enumerate(self.layout(gpu)):
            if (spec.gpu_instance_id, spec.compute_instance_id) == (gpu_instance_id, compute_instance_id):
                return index
        return None
