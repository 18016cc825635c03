"""Opening the hardware: real NVML, simulated GPUs, or none, plus the host; the result is an Inventory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Protocol

from nvdash.sampling.host_source import HostSource
from nvdash.sampling.nvml_source import NvmlSource, NvmlUnavailable, install_library, load_nvml
from nvdash.sampling.records import HostInfo, HostSample, Inventory


class HostReading(Protocol):
    """The host source, or the simulation's wrapper of it that can hang (``hang_host`` fault)."""

    def info(self) -> HostInfo: ...

    def read(self) -> HostSample: ...


@dataclass
class Hardware:
    """The opened sources and what they found; :meth:`close` releases NVML (and the fake library)."""

    inventory: Inventory
    host: HostReading
    gpus: NvmlSource | None
    fake: object | None = None
    _undo: list[Callable[[], None]] = field(default_factory=list)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def on_close(self, stop: Callable[[], None]) -> None:
        """Run ``stop`` when the hardware is closed, before NVML is shut down (e.g. a watcher thread)."""
        self._closers.append(stop)

    def close(self) -> None:
        """Stop what ``on_close`` registered, shut NVML down, and restore pynvml if a fake library was installed."""
        while self._closers:
            self._closers.pop()()
        if self.gpus is not None:
            self.gpus.close()
        while self._undo:
            self._undo.pop()()


def open_hardware(
    simulate: str | None = None,
    seed: int = 0,
    faults: str | None = None,
    nvml: ModuleType | None = None,
    host: HostSource | None = None,
    *,
    process_file: str | None = None,
) -> Hardware:
    """Open NVML (real or simulated by profile name) and the host source.

    Without usable NVML the result has no GPU source and the inventory says why. An unknown profile or a
    bad fault spec raises ``ValueError`` with a one-line message. ``process_file``: a process file the simulated
    GPUs follow (see :mod:`nvdash.sampling.fake.process_file`).
    """
    source_of_host = host if host is not None else HostSource()
    host_reading: HostReading = source_of_host
    nvml = nvml if nvml is not None else load_nvml()
    undo: list[Callable[[], None]] = []
    fake: object | None = None
    if simulate is not None:
        from nvdash.sampling.fake import FakeNvmlLibrary  # noqa: PLC0415 - only when simulating
        from nvdash.sampling.fake.host import HangingHost  # noqa: PLC0415 - only when simulating

        library = FakeNvmlLibrary(simulate, seed=seed, process_file=process_file)
        if faults:
            library.apply_faults(faults)
        if library.host_hangs():
            host_reading = HangingHost(source_of_host, library.host_hangs(), library.created_at)
        undo.append(install_library(nvml, library))
        fake = library
    source = NvmlSource(nvml)
    try:
        gpus = source.open()
    except NvmlUnavailable as error:
        inventory = Inventory(host=host_reading.info(), nvml_error=str(error), simulated=simulate)
        return Hardware(inventory, host_reading, None, fake, undo)
    nvml_error = None if gpus else "NVML is working but found no NVIDIA GPU on this machine."
    inventory = Inventory(
        host=host_reading.info(),
        gpus=gpus,
        driver_version=source.driver_version,
        nvml_error=nvml_error,
        simulated=simulate,
        topology=source.topology,
    )
    return Hardware(inventory, host_reading, source, fake, undo)
