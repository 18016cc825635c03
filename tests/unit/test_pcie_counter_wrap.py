"""PCIe byte counters that wrap or reset (nvml.h: ``NVML_FI_DEV_PCIE_COUNT_TX_BYTES`` "can be wrapped").

The expected rate across a wrap is the fake workload's own definition of the traffic: the bytes it moved between
the two readings' timestamps (``Workload.mean_rate_bytes_per_s``), never nvdash's arithmetic.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pynvml
import pytest

from nvdash.sampling.nvml_source import NvmlSource
from nvdash.sampling.rates import CounterRate
from tests.unit.conftest import FakeClock, open_source

FIELDS = {"pcie_tx": pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "pcie_rx": pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES}
WRAP_S = 100.0
BEFORE_S, AFTER_S = WRAP_S - 0.05, WRAP_S + 0.05


def _counters(gpu: int) -> dict[str, int]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    values: list[Any] = pynvml.nvmlDeviceGetFieldValues(handle, list(FIELDS.values()))
    return {name: int(value.value.ullVal) for name, value in zip(FIELDS, values, strict=True)}


def _rates(source: NvmlSource, gpu: int) -> dict[str, float | None]:
    sample = source.read(5.0)[gpu]
    return {"pcie_tx": sample.pcie_tx_bytes_per_s, "pcie_rx": sample.pcie_rx_bytes_per_s}


def test_the_rate_across_a_32_bit_wrap_is_the_rate_the_workload_produced(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        fake.wrap_pcie_counters(at_s=WRAP_S, bits=32)
        gpus = source.open()
        clock.at(BEFORE_S)
        source.read(5.0)
        before = [_counters(gpu.index) for gpu in gpus]
        clock.at(AFTER_S)
        samples = source.read(5.0)
        for gpu, sample, counters in zip(gpus, samples, before, strict=True):
            after = _counters(gpu.index)
            for series, rate in (("pcie_tx", sample.pcie_tx_bytes_per_s), ("pcie_rx", sample.pcie_rx_bytes_per_s)):
                assert after[series] < counters[series] < 2**32, "the counter wrapped at 2**32 in between"
                produced = fake.workload.mean_rate_bytes_per_s(gpu.index, series, BEFORE_S, AFTER_S)
                assert rate == pytest.approx(produced, rel=1e-6, abs=50.0)


def test_a_driver_reload_gives_no_rate_then_counting_goes_on(clock: FakeClock) -> None:
    """Not a huge rate: from a 64-bit count in the hundreds of GB, a wrap would imply ~1.8e19 bytes."""
    for source, fake in open_source("dgx-h100", clock):
        fake.reload_driver(at_s=WRAP_S)
        source.open()
        clock.at(BEFORE_S)
        source.read(5.0)
        before = _counters(0)
        clock.at(AFTER_S)
        assert _rates(source, 0) == {"pcie_tx": None, "pcie_rx": None}
        assert all(value < before[name] for name, value in _counters(0).items())
        # The energy counter restarted too, so the source learns the GPU again: its rates start afresh.
        clock.at(AFTER_S + 0.5)
        assert _rates(source, 0) == {"pcie_tx": None, "pcie_rx": None}
        clock.at(AFTER_S + 1.0)
        for series, rate in _rates(source, 0).items():
            produced = fake.workload.mean_rate_bytes_per_s(0, series, AFTER_S + 0.5, AFTER_S + 1.0)
            assert rate == pytest.approx(produced, rel=1e-6, abs=50.0)


def test_wrap_width_is_the_smallest_of_32_and_64_bits_above_the_previous_value() -> None:
    narrow = CounterRate()
    narrow.update(2**32 - 1_000, 1.0)
    assert narrow.update(3_000, 2.0) == pytest.approx(4_000.0)
    wide = CounterRate()
    wide.update(2**64 - 1_000, 1.0)
    assert wide.update(1_000, 2.0) == pytest.approx(2_000.0)


def test_a_wrap_implying_more_than_the_maximum_rate_is_a_reset() -> None:
    rate = CounterRate(max_rate=1e9)
    rate.update(2**40, 1.0)
    assert rate.update(10, 2.0) is None, "a 2**64 wrap would be 1.8e19 bytes in a second"
    assert rate.update(510, 3.0) == pytest.approx(500.0)
    # Below 2**32, a wrap within the link's rate is believed even past half the range.
    rate.update(2**31 - 10, 4.0)
    assert rate.update(5, 8.0) == pytest.approx((2**32 - (2**31 - 10) + 5) / 4.0)


def test_a_forward_jump_faster_than_the_link_gives_no_rate() -> None:
    rate = CounterRate(max_rate=1e9)
    rate.update(0, 1.0)
    assert rate.update(10**12, 2.0) is None
    assert rate.update(10**12 + 1_000, 3.0) == pytest.approx(1_000.0)


def test_without_a_pcie_maximum_a_generous_bound_still_refuses_a_2_64_wrap(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        fake.reload_driver(at_s=WRAP_S)
        source.open()
        for device in source._devices:  # as if NVML had not given the PCIe maximum
            device.info = replace(device.info, pcie_max_bytes_per_s=None)
        clock.at(BEFORE_S)
        source.read(5.0)
        clock.at(AFTER_S)
        assert _rates(source, 0) == {"pcie_tx": None, "pcie_rx": None}

