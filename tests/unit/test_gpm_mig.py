"""GPM per MIG GPU instance (``nvmlGpmMigSampleGet``), through the real pynvml over the fake NVML library.

Expected values follow the fake's definition of an instance's work (``nvdash.sampling.fake.gpm``): the GPU's own
simulated job (its GPM mean over the interval) times ``min(1, sum of sm_share)`` of the processes in the GPU
instance. On ``h100-mig`` GPU 0 those are: GI 2 (3g.40gb) 0.6 + 0.25, GI 3 (2g.20gb) 0.5, GI 9 (1g.10gb) 1.0 and
GI 10 (1g.10gb) nothing. nvml.h: NOT_SUPPORTED where the GPU has no GPM, INVALID_ARGUMENT for an id that names no
GPU instance.
"""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.nvml_source import NvmlSource
from tests.unit.conftest import FakeClock, open_source

GRAPHICS, SM, OCCUPANCY = (
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    pynvml.NVML_GPM_METRIC_SM_UTIL,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
)
BUSY = {2: 0.85, 3: 0.5, 9: 1.0, 10: 0.0}
"""GPU instance id -> the fake's busy fraction of it on h100-mig (its processes' sm_share, summed, at most 1)."""


@pytest.fixture
def h100_mig(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("h100-mig", clock)


@pytest.fixture
def a100_mig(clock: FakeClock) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    yield from open_source("a100-mig", clock)


def _metrics(first: object, second: object) -> dict[int, tuple[int, float]]:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 3
    request.sample1, request.sample2 = first, second
    for slot, metric in enumerate((GRAPHICS, SM, OCCUPANCY)):
        request.metrics[slot].metricId = metric
    answer = pynvml.nvmlGpmMetricsGet(request)
    return {answer.metrics[i].metricId: (answer.metrics[i].nvmlReturn, answer.metrics[i].value) for i in range(3)}


def test_two_instance_samples_give_the_instances_work(
    h100_mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = h100_mig
    source.open()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for gpu_instance, busy in BUSY.items():
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        clock.at(100.0)
        pynvml.nvmlGpmMigSampleGet(handle, gpu_instance, first)
        clock.at(103.5)
        pynvml.nvmlGpmMigSampleGet(handle, gpu_instance, second)
        found = _metrics(first, second)
        for metric in (GRAPHICS, SM, OCCUPANCY):
            expected = fake.workload.gpm_percent(0, metric, 100.0, 103.5) * busy
            assert found[metric] == (pynvml.NVML_SUCCESS, pytest.approx(expected, rel=1e-12))
        assert (found[GRAPHICS][1] > 0) == (busy > 0)
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)


def test_samples_of_two_instances_or_of_the_gpu_do_not_pair(
    h100_mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, _ = h100_mig
    source.open()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    clock.at(10.0)
    pynvml.nvmlGpmMigSampleGet(handle, 2, first)
    clock.at(12.0)
    pynvml.nvmlGpmMigSampleGet(handle, 3, second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        _metrics(first, second)
    pynvml.nvmlGpmSampleGet(handle, second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        _metrics(first, second)


def test_an_unknown_instance_id_is_an_invalid_argument(
    h100_mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, _ = h100_mig
    source.open()
    sample = pynvml.nvmlGpmSampleAlloc()
    clock.at(5.0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMigSampleGet(pynvml.nvmlDeviceGetHandleByIndex(0), 42, sample)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # GPU 1 is not in MIG mode: it has no GPU instance 2
        pynvml.nvmlGpmMigSampleGet(pynvml.nvmlDeviceGetHandleByIndex(1), 2, sample)


def test_a_gpu_without_gpm_answers_not_supported(a100_mig: tuple[NvmlSource, FakeNvmlLibrary]) -> None:
    source, _ = a100_mig
    source.open()
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmMigSampleGet(pynvml.nvmlDeviceGetHandleByIndex(0), 1, sample)


def test_the_usage_reading_carries_each_instances_activity(
    h100_mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = h100_mig
    source.open()
    clock.at(60.0)
    first = source.read_usage(timeout_s=10.0)[0].gpu
    assert [i.sm_active_pct for i in first.instances] == [None] * 4  # one sample is no interval yet
    clock.at(62.0)
    second = source.read_usage(timeout_s=10.0)[0].gpu
    assert {i.gpu_instance_id for i in second.instances} == set(BUSY)
    for instance in second.instances:
        busy = BUSY[instance.gpu_instance_id]
        graphics = fake.workload.gpm_percent(0, GRAPHICS, 60.0, 62.0) * busy
        assert instance.sm_active_pct == pytest.approx(graphics, rel=1e-12)
        assert instance.gpm_sm_active_pct == pytest.approx(fake.workload.gpm_percent(0, SM, 60.0, 62.0) * busy)
        assert instance.gpm_sm_occupancy_pct == pytest.approx(
            fake.workload.gpm_percent(0, OCCUPANCY, 60.0, 62.0) * busy
        )
    busiest = second.instances[0].sm_active_pct
    assert busiest is not None
    assert busiest > 0
    assert second.instances[3].sm_active_pct == 0.0


def test_without_gpm_instances_stay_unreported_and_nvml_is_not_asked_again(
    a100_mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = a100_mig
    source.open()
    for t in (10.0, 12.0, 14.0):
        clock.at(t)
        usage = source.read_usage(timeout_s=10.0)[0].gpu
        assert len(usage.instances) == 4
        assert [i.sm_active_pct for i in usage.instances] == [None] * 4
    assert fake.call_counts().get("nvmlGpmMigSampleGet", 0) <= 1


def test_samples_of_instances_that_went_away_are_freed(
    h100_mig: tuple[NvmlSource, FakeNvmlLibrary], clock: FakeClock
) -> None:
    source, fake = h100_mig
    source.open()
    for t in (20.0, 22.0):
        clock.at(t)
        source.read_usage(timeout_s=10.0)
    assert fake.call_counts().get("nvmlGpmSampleFree", 0) == 0
    fake.set_mig_mode(0, False)
    clock.at(24.0)
    assert source.read_usage(timeout_s=10.0)[0].gpu.instances == ()
    assert fake.call_counts()["nvmlGpmSampleFree"] == 2 * len(BUSY)
