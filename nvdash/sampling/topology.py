"""The GPU-to-GPU connection matrix, as ``nvidia-smi topo -m`` shows it (``NV18``, ``PIX``, ``SYS``...)."""

from __future__ import annotations

from collections.abc import Sequence

from nvdash.sampling.nvml_device import Device, NvmlCaller, text_of

TOPOLOGY_LABELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
"""``nvmlGpuTopologyLevel_t`` -> nvidia-smi's code (INTERNAL, two GPUs on one board, shows as PIX)."""
NVLINK_DEVICE_TYPE_GPU = 0
NVLINK_DEVICE_TYPE_SWITCH = 2


def _short_bus(bus_id: str) -> str:
    """``00000000:18:00.0`` and ``0000:18:00.0`` name the same device: compare without the domain."""
    return bus_id.split(":", 1)[-1] if bus_id.count(":") == 2 else bus_id


class TopologyReader:
    """Works out, once at start, how each pair of GPUs is connected."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._nvml = caller.nvml

    def matrix(self, devices: Sequence[Device]) -> tuple[tuple[str, ...], ...]:
        """``m[i][j]`` for every pair: ``X`` on the diagonal, ``NV<n>`` over NVLink, else the PCIe path.

        Empty when NVML cannot tell the PCIe path of some pair (or a GPU is unavailable).
        """
        usable = [device for device in devices if not device.lost and device.handle is not None]
        if len(usable) != len(devices) or not devices:
            return ()
        nvlinks = self._nvlink_counts(devices)
        rows: list[tuple[str, ...]] = []
        for i, first in enumerate(devices):
            row: list[str] = []
            for j, second in enumerate(devices):
                if i == j:
                    row.append("X")
                elif nvlinks[i][j]:
                    row.append(f"NV{nvlinks[i][j]}")
                else:
                    label = self._pcie_path(first, second)
                    if label is None:
                        return ()
                    row.append(label)
            rows.append(tuple(row))
        return tuple(rows)

    def _pcie_path(self, first: Device, second: Device) -> str | None:
        nvml = self._nvml
        try:
            level = self._caller.call(nvml.nvmlDeviceGetTopologyCommonAncestor, first.handle, second.handle)
        except nvml.NVMLError:
            return None
        return TOPOLOGY_LABELS.get(int(level), "SYS")

    def _nvlink_counts(self, devices: Sequence[Device]) -> list[list[int]]:
        """Links joining each pair: direct GPU-GPU links, or through NVSwitch (each pair gets the fewer of the two)."""
        size = len(devices)
        counts = [[0] * size for _ in range(size)]
        by_bus = {_short_bus(d.info.pci_bus_id.lower()): d.index for d in devices if d.info.pci_bus_id}
        switch_links = [0] * size
        for device in devices:
            for link in device.nvlink_active:
                kind, remote_bus = self._remote(device, link)
                remote = by_bus.get(_short_bus(remote_bus)) if remote_bus else None
                if kind == NVLINK_DEVICE_TYPE_GPU and remote is not None and remote != device.index:
                    counts[device.index][remote] += 1
                elif kind == NVLINK_DEVICE_TYPE_SWITCH or (remote_bus and remote is None):
                    switch_links[device.index] += 1
        for i in range(size):
            for j in range(size):
                if i != j and switch_links[i] and switch_links[j]:
                    counts[i][j] = max(counts[i][j], min(switch_links[i], switch_links[j]))
        return counts

    def _remote(self, device: Device, link: int) -> tuple[int | None, str]:
        nvml = self._nvml
        kind: int | None = None
        try:
            kind = int(self._caller.call(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, device.handle, link))
        except nvml.NVMLError:
            kind = None
        try:
            pci = self._caller.call(nvml.nvmlDeviceGetNvLinkRemotePciInfo, device.handle, link)
        except nvml.NVMLError:
            return kind, ""
        return kind, text_of(getattr(pci, "busId", "")).lower()
