"""MIG devices' memory is NVML's v2 figure: ``nvmlMemory_v2_t.used`` leaves out the driver's reservation.

nvml.h: ``nvmlMemory_t.used`` (v1) is "Sum of Reserved and Allocated device memory"; ``nvmlMemory_v2_t`` reports
``reserved`` apart and ``used`` without it, which is what nvidia-smi shows. The expected values are what the real
pynvml returns for each MIG device handle from the same fake.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.nvml_source import NvmlSource
from tests.unit.conftest import FakeClock, open_source


@pytest.fixture
def mig(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("a100-mig", clock)


def _mig_handles() -> list[Any]:
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    return [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i) for i in range(4)]


def test_mig_instance_memory_used_is_the_v2_figure(mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock) -> None:
    source, _ = mig
    source.open()
    clock.at(30.0)
    instances = source.read_usage(10.0)[0].gpu.instances
    handles = _mig_handles()
    assert len(instances) == len(handles) == 4
    for instance, handle in zip(instances, handles, strict=True):
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert v2.reserved > 0
        assert v1.used == v2.used + v2.reserved, "v1 counts the instance's reservation as used"
        assert instance.memory_used_bytes == v2.used
        assert instance.memory_total_bytes == v2.total


def test_mig_instance_memory_falls_back_to_v1_once_v2_is_unsupported(clock: FakeClock) -> None:
    for source, fake in open_source("a100-mig", clock):
        fake.not_supported("nvmlDeviceGetMemoryInfo_v2")
        source.open()
        clock.at(30.0)
        fake.reset_counts()
        for _ in range(3):
            instances = source.read_usage(10.0)[0].gpu.instances
            used = [pynvml.nvmlDeviceGetMemoryInfo(handle).used for handle in _mig_handles()]
            assert [instance.memory_used_bytes for instance in instances] == used
        # Once for GPU 0's first MIG device (then remembered), and never for the whole GPU 1 here.
        assert fake.call_counts()["nvmlDeviceGetMemoryInfo_v2"] == 1
