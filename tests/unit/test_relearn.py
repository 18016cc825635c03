"""A GPU whose mode changed is probed again: readings it did not support may answer now, and the other way round.

NVML's signals: ``nvmlDeviceGetMigMode`` (current mode), and ``nvmlDeviceGetTotalEnergyConsumption``, which counts
mJ "since the driver was last reloaded" and so goes backwards across a reload or GPU reset. nvidia-smi shows a
whole GPU's utilization as N/A in MIG mode (NVML answers NOT_SUPPORTED), and a value again with MIG off.
"""

from __future__ import annotations

import logging
from concurrent.futures import wait

import pynvml
import pytest

from nvdash.sampling.nvml_modes import Reprobe
from nvdash.sampling.records import HostInfo, HostSample, Inventory
from nvdash.sampling.sampler import Sampler
from nvdash.store import Store
from tests.unit.conftest import START, FakeClock, open_source


def _utilization(gpu: int) -> int:
    return int(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(gpu)).gpu)


def test_utilization_comes_back_when_mig_is_turned_off_and_goes_when_it_is_on_again(clock: FakeClock) -> None:
    for source, fake in open_source("a100-mig", clock):
        source.open()
        clock.at(10.0)
        assert source.read(5.0)[0].utilization_pct is None, "MIG on: NVML answers NOT_SUPPORTED"
        clock.at(11.0)
        assert source.read(5.0)[0].utilization_pct is None
        fake.set_mig_mode(0, enabled=False)
        clock.at(12.0)
        sample = source.read(5.0)[0]
        assert sample.utilization_pct == _utilization(0)
        assert source.relearned == 1
        usage = source.read_usage(10.0)[0]
        assert (usage.gpu.mig_enabled, usage.gpu.instances) == (False, ())
        fake.set_mig_mode(0, enabled=True)
        clock.at(13.0)
        assert source.read(5.0)[0].utilization_pct is None
        assert source.relearned == 2
        assert len(source.read_usage(10.0)[0].gpu.instances) == 4


def test_a_driver_reload_asks_again_what_was_unsupported(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        fake.not_supported("nvmlDeviceGetPcieReplayCounter")
        gpus = len(source.open())
        fake.reload_driver(at_s=30.0)
        for at in (10.0, 20.0):
            clock.at(at)
            source.read(5.0)
        assert fake.call_counts()["nvmlDeviceGetPcieReplayCounter"] == gpus, "asked once, then remembered"
        clock.at(31.0)
        after = source.read(5.0)
        assert all(sample.energy_mj is not None and sample.energy_mj < 1e6 for sample in after), "counting anew"
        assert source.relearned == gpus
        clock.at(32.0)
        source.read(5.0)
        assert fake.call_counts()["nvmlDeviceGetPcieReplayCounter"] == 2 * gpus
        clock.at(33.0)
        samples = source.read(5.0)
        assert all(sample.pcie_rx_bytes_per_s is not None for sample in samples), "counters rate afresh"
        assert source.relearned == gpus, "a steady energy count is no reload"


def test_no_mode_change_no_relearning(clock: FakeClock) -> None:
    for source, _ in open_source("a100-mig", clock):
        source.open()
        for at in (10.0, 20.0, 30.0):
            clock.at(at)
            source.read(5.0)
        assert source.relearned == 0


def test_a_read_that_hung_past_close_makes_no_more_calls_when_it_wakes(clock: FakeClock) -> None:
    """Its NVML may be shut down (or, in a test, another library installed): the rest of the read is refused."""
    for source, fake in open_source("dgx-h100", clock):
        source.open()
        fake.slow("nvmlDeviceGetUtilizationRates", 0.5, device=1)
        source.read(0.05)
        hung = source._devices[1].pending["read"]
        assert not hung.done()
        source.close()
        before = fake.call_counts()
        wait([hung], timeout=30.0)
        assert hung.done()
        assert fake.call_counts() == before


def _reprobe_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.INFO and "asking again which readings it supports" in record.getMessage()]


def test_a_mig_change_is_counted_with_its_gpu_reason_and_time_and_logged_once(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvdash.sampling.nvml_source")
    for source, fake in open_source("a100-mig", clock, wall_clock=clock):
        source.open()
        clock.at(10.0)
        source.read(5.0)
        assert source.last_relearn is None
        fake.set_mig_mode(0, enabled=False)
        clock.at(12.0)
        source.read(5.0)
        clock.at(13.0)
        source.read(5.0)
        assert source.last_relearn == Reprobe(0, "MIG mode changed", START + 12.0)
        assert _reprobe_lines(caplog) == ["GPU 0: MIG mode changed; asking again which readings it supports"]


def test_a_driver_reload_reports_every_gpu_once_and_the_sampler_passes_it_on(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvdash.sampling.nvml_source")
    for source, fake in open_source("dgx-h100", clock, wall_clock=clock):
        gpus = len(source.open())
        fake.apply_faults("driver_reload@30")
        sampler = Sampler(Store(Inventory(host=HostInfo("h", 1, 1))), _Host(), source, wall_clock=clock)
        clock.at(29.0)
        sampler.sample_once()
        assert (sampler.stats().relearned, sampler.stats().last_relearn) == (0, None)
        clock.at(31.0)
        sampler.sample_once()
        stats = sampler.stats()
        assert stats.relearned == gpus
        assert stats.last_relearn is not None
        assert (stats.last_relearn.reason, stats.last_relearn.at) == ("energy counter went backwards", START + 31.0)
        assert sorted(_reprobe_lines(caplog)) == sorted(
            f"GPU {gpu}: energy counter went backwards; asking again which readings it supports" for gpu in range(gpus)
        )


class _Host:
    def read(self) -> HostSample:
        return HostSample(cpu_pct=1.0)
