"""Temperature through ``nvmlDeviceGetTemperatureV`` where the driver has it, the deprecated call elsewhere.

pynvml 13: ``nvmlDeviceGetTemperature`` is "DEPRECATED: Use nvmlDeviceGetTemperatureV instead"; the V entry point
came with the R565 drivers (an R550 library has no such symbol). The fake's dgx-h100 runs R570, its t4 R550.
"""

from __future__ import annotations

import pynvml
import pytest

from nvdash.sampling.nvml_source import NvmlSource
from tests.unit.conftest import FakeClock, open_source


def _temperatures(source: NvmlSource) -> list[float | None]:
    return [sample.temperature_c for sample in source.read(5.0)]


def _expected(gpus: int) -> list[float]:
    """What the driver's own deprecated call answers for each GPU right now."""
    return [
        float(pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(i), pynvml.NVML_TEMPERATURE_GPU))
        for i in range(gpus)
    ]


def test_a_new_driver_is_asked_with_the_v_call_only(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        gpus = len(source.open())
        for at in (10.0, 200.0):
            clock.at(at)
            fake.reset_counts()
            temperatures = _temperatures(source)
            counts = fake.call_counts()
            assert counts.get("nvmlDeviceGetTemperatureV") == gpus
            assert "nvmlDeviceGetTemperature" not in counts
            assert temperatures == _expected(gpus)


def test_an_old_driver_lacks_the_v_call_and_is_asked_the_old_way(clock: FakeClock) -> None:
    for source, fake in open_source("t4", clock):
        gpus = len(source.open())
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
        fake.reset_counts()
        for at in (10.0, 200.0):
            clock.at(at)
            assert _temperatures(source) == _expected(gpus)
        assert "nvmlDeviceGetTemperatureV" not in fake.call_counts(), "a missing function is not looked for again"


def test_a_v_call_that_is_not_supported_falls_back_once(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        fake.not_supported("nvmlDeviceGetTemperatureV")
        gpus = len(source.open())
        fake.reset_counts()
        for at in (10.0, 20.0, 30.0):
            clock.at(at)
            assert _temperatures(source) == _expected(gpus)
        assert fake.call_counts()["nvmlDeviceGetTemperatureV"] == gpus


def test_the_v_call_checks_its_struct_version(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock):
        source.open()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU, version=0x2000010)
        assert pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU) == pynvml.nvmlDeviceGetTemperature(
            handle, pynvml.NVML_TEMPERATURE_GPU
        )
