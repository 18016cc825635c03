"""Power limits, video engines, GPM FP pipes, violation times and NVLink error totals, read through the real pynvml.

Expected values come from NVML's definitions (nvml.h, pynvml's constants) and from the fake's stated model (the
profile docstrings in ``nvdash.sampling.fake.profiles``): never from nvdash's own conversion code.
"""

from __future__ import annotations

import random
from typing import Any

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.nvml_source import NvmlSource
from nvdash.sampling.records import GpuSample
from tests.unit.conftest import FakeClock, Install, open_source

SLOT_S = 0.01
"""The fake's stated time step: its readings are constant within each 10 ms slot (``fake.workload``)."""
NS = 1_000_000_000
POLICY_REASONS = {
    pynvml.NVML_PERF_POLICY_POWER: pynvml.nvmlClocksEventReasonSwPowerCap,
    pynvml.NVML_PERF_POLICY_THERMAL: pynvml.nvmlClocksEventReasonSwThermalSlowdown
    | pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    pynvml.NVML_PERF_POLICY_SYNC_BOOST: pynvml.nvmlClocksEventReasonSyncBoost,
    pynvml.NVML_PERF_POLICY_BOARD_LIMIT: pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    pynvml.NVML_PERF_POLICY_LOW_UTILIZATION: pynvml.nvmlClocksEventReasonGpuIdle,
}
"""Each throttle policy and the clock event reasons during which its violation time runs."""
FIELDS = {
    pynvml.NVML_PERF_POLICY_POWER: "violation_power_ns",
    pynvml.NVML_PERF_POLICY_THERMAL: "violation_thermal_ns",
    pynvml.NVML_PERF_POLICY_SYNC_BOOST: "violation_sync_boost_ns",
    pynvml.NVML_PERF_POLICY_BOARD_LIMIT: "violation_board_limit_ns",
    pynvml.NVML_PERF_POLICY_LOW_UTILIZATION: "violation_low_utilization_ns",
    pynvml.NVML_PERF_POLICY_RELIABILITY: "violation_reliability_ns",
}
CAPPED_GPU = 2
"""dgx-a100's GPU held out of band at 300 W below its 400 W management limit (the profile's scenario)."""


def _handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _sweeps(source: NvmlSource, clock: FakeClock, count: int, step_s: float = 1.0) -> tuple[GpuSample, ...]:
    samples: tuple[GpuSample, ...] = ()
    for _ in range(count):
        clock.now += step_s
        samples = source.read(5.0)
    return samples


def _violation_ns(handle: Any, policy: int) -> int:
    return int(pynvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime)


# Power limits


def test_enforced_limit_is_below_the_management_limit_only_where_capped(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-a100", clock, slow_interval_s=0.0):
        source.open()
        samples = _sweeps(source, clock, 30)
        for sample in samples:
            # A100 SXM4 80GB: 400 W board limit, unchanged by anyone; GPU 2 capped at 300 W out of band.
            assert sample.power_management_limit_w == 400.0
            assert sample.power_limit_w == (300.0 if sample.index == CAPPED_GPU else 400.0)
        assert samples[CAPPED_GPU].power_limit_w < samples[CAPPED_GPU].power_management_limit_w


def test_the_capped_gpu_draws_at_most_its_enforced_limit_and_says_why(install: Install, clock: FakeClock) -> None:
    install("dgx-a100")
    capped, free = _handle(CAPPED_GPU), _handle(0)
    enforced = pynvml.nvmlDeviceGetEnforcedPowerLimit(capped)
    management = pynvml.nvmlDeviceGetPowerManagementLimit(capped)
    assert (enforced, management) == (300_000, 400_000)
    above_cap_elsewhere = 0
    for slot in range(3000):
        clock.at(20.0 + (slot + 0.5) * SLOT_S)
        power = pynvml.nvmlDeviceGetPowerUsage(capped)
        reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(capped)
        assert power <= enforced, "the draw respects the ENFORCED limit"
        if power >= 0.98 * enforced:
            assert reasons & pynvml.nvmlClocksEventReasonSwPowerCap, "held at the cap: SwPowerCap says so"
        above_cap_elsewhere += pynvml.nvmlDeviceGetPowerUsage(free) > enforced
    assert above_cap_elsewhere > 0, "the same work draws more than 300 W on an uncapped GPU"


# Video engines


def test_encoder_and_decoder_are_separate_engines(clock: FakeClock) -> None:
    for source, _ in open_source("t4", clock):
        source.open()
        (sample,) = _sweeps(source, clock, 40)
        handle = _handle(0)
        encoder, encoder_period = pynvml.nvmlDeviceGetEncoderUtilization(handle)
        decoder, decoder_period = pynvml.nvmlDeviceGetDecoderUtilization(handle)
        assert encoder_period > 0, "each figure covers the driver's sampling period (us)"
        assert decoder_period > 0
        assert (sample.encoder_utilization_pct, sample.decoder_utilization_pct) == (encoder, decoder)
        assert sample.decoder_utilization_pct is not None
        assert sample.encoder_utilization_pct is not None
        assert sample.decoder_utilization_pct > sample.encoder_utilization_pct, "a video-decoding job, little encoding"
    for source, _ in open_source("dgx-h100", clock):
        source.open()
        samples = _sweeps(source, clock, 40)
        assert all(sample.encoder_utilization_pct is None for sample in samples), "H100 has NVDEC but no NVENC"
        assert samples[0].decoder_utilization_pct is not None
        assert samples[0].decoder_utilization_pct > 0
        assert samples[7].decoder_utilization_pct == 0.0, "GPU 7 is outside the job: its decoders idle"


def test_the_decoder_follows_the_data_loader(install: Install, clock: FakeClock) -> None:
    """The loader decodes video on NVDEC; while the GPUs stall waiting for it, NVDEC is busiest."""
    install("dgx-h100")
    handle = _handle(0)
    stalled, computing = [], []
    window = 17  # slots in the 167 ms sampling period, rounded up
    utilization = []
    for slot in range(9000):
        clock.at(10.0 + (slot + 0.5) * SLOT_S)
        utilization.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        if slot < window:
            continue
        recent = utilization[-window:]
        if max(recent) <= 20:
            stalled.append(pynvml.nvmlDeviceGetDecoderUtilization(handle)[0])
        elif min(recent) >= 88:
            computing.append(pynvml.nvmlDeviceGetDecoderUtilization(handle)[0])
    assert stalled
    assert computing
    assert min(stalled) > max(computing)
    assert all(0 <= value <= 100 for value in stalled + computing)


def test_mig_gpus_and_instances_have_no_video_utilization(install: Install, clock: FakeClock) -> None:
    fake = install("a100-mig")
    clock.at(30.0)
    mig_parent, whole = _handle(0), _handle(1)
    for query in (pynvml.nvmlDeviceGetEncoderUtilization, pynvml.nvmlDeviceGetDecoderUtilization):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            query(mig_parent)
        instance = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_parent, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            query(instance)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEncoderUtilization(whole)
    assert pynvml.nvmlDeviceGetDecoderUtilization(whole)[0] == 0, "A100 has NVDEC; this job decodes nothing"
    assert fake.profile.nvenc_count == 0


def test_unsupported_video_engines_are_asked_once(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-h100", clock):
        source.open()
        _sweeps(source, clock, 5)
        counts = fake.call_counts()
        assert counts["nvmlDeviceGetEncoderUtilization"] == 8, "NOT_SUPPORTED once per GPU, never again"
        assert counts["nvmlDeviceGetDecoderUtilization"] == 8 * 5


# GPM FP pipes


def _fp(sample: GpuSample) -> tuple[float | None, float | None, float | None]:
    return sample.gpm_fp64_active_pct, sample.gpm_fp32_active_pct, sample.gpm_fp16_active_pct


def test_gpm_fp_pipes_follow_the_job(clock: FakeClock) -> None:
    for profile in ("dgx-h100", "hgx-h100-hpc"):
        for source, _ in open_source(profile, clock):
            source.open()
            clock.now += 40.0
            assert all(_fp(sample) == (None, None, None) for sample in source.read(5.0)), "GPM needs two samples"
            sample = _sweeps(source, clock, 1, step_s=5.0)[0]
            fp64, fp32, fp16 = _fp(sample)
            assert fp64 is not None
            assert fp32 is not None
            assert fp16 is not None
            assert sample.gpm_sm_active_pct is not None
            for value in (fp64, fp32, fp16):
                assert 0.0 <= value <= sample.gpm_sm_active_pct, "a pipe is busy only while its SM is"
            if profile == "dgx-h100":
                # Mixed-precision training: heavy math on the tensor cores, FP32 and FP16 on the side, no FP64.
                assert fp32 > fp16 > fp64
            else:
                assert fp64 > fp32 > fp16 == 0.0, "an FP64 simulation, no half precision"


def test_gpm_fp_fields_are_nvml_fp_metrics(install: Install, clock: FakeClock) -> None:
    """Each field carries its own metric id: compare with nvmlGpmMetricsGet over the same two instants."""
    for source, _ in open_source("hgx-h100-hpc", clock):
        source.open()
        clock.at(50.0)
        source.read(5.0)
        clock.at(52.0)
        sample = source.read(5.0)[3]
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        clock.at(50.0)
        pynvml.nvmlGpmSampleGet(_handle(3), first)
        clock.at(52.0)
        pynvml.nvmlGpmSampleGet(_handle(3), second)
        ids = [pynvml.NVML_GPM_METRIC_FP64_UTIL, pynvml.NVML_GPM_METRIC_FP32_UTIL, pynvml.NVML_GPM_METRIC_FP16_UTIL]
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1, request.sample2 = first, second
        for slot, metric in enumerate(ids):
            request.metrics[slot].metricId = metric
        answer = pynvml.nvmlGpmMetricsGet(request)
        expected = tuple(pytest.approx(answer.metrics[slot].value) for slot in range(len(ids)))
        assert _fp(sample) == expected
        assert len(set(_fp(sample))) == 3
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)


def test_gpm_fp_is_hopper_and_later_only(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-a100", clock):
        source.open()
        assert all(_fp(sample) == (None, None, None) for sample in _sweeps(source, clock, 3))


# Violation times


def _walk_reasons(handle: Any, clock: FakeClock, start_s: float, slots: int) -> dict[int, int]:
    """ns each policy's reasons were set over ``slots`` slots from ``start_s``, from the reasons getter alone."""
    expected = dict.fromkeys(POLICY_REASONS, 0)
    for slot in range(slots):
        clock.at(start_s + (slot + 0.5) * SLOT_S)
        reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        for policy, bits in POLICY_REASONS.items():
            if reasons & bits:
                expected[policy] += round(SLOT_S * NS)
    return expected


@pytest.mark.parametrize(("profile", "gpu", "start_s"), [("dgx-h100", 0, 85.0), ("dgx-h100", 7, 5.0),
                                                         ("dgx-a100", CAPPED_GPU, 33.0)])  # fmt: skip
def test_violation_time_accrues_exactly_while_its_reason_is_set(
    install: Install, clock: FakeClock, profile: str, gpu: int, start_s: float
) -> None:
    """GPU 0 of dgx-h100 has a thermal episode at 90 s (SW, HW, SW slowdown) between SwPowerCap steps."""
    install(profile)
    handle = _handle(gpu)
    slots = 2500
    clock.at(start_s)
    before = {policy: _violation_ns(handle, policy) for policy in POLICY_REASONS}
    expected = _walk_reasons(handle, clock, start_s, slots)
    clock.at(start_s + slots * SLOT_S)
    for policy in POLICY_REASONS:
        assert _violation_ns(handle, policy) - before[policy] == pytest.approx(expected[policy], abs=1000)
    if profile == "dgx-h100" and gpu == 0:
        assert expected[pynvml.NVML_PERF_POLICY_THERMAL] == 14 * NS, "the whole 14 s episode"
        assert expected[pynvml.NVML_PERF_POLICY_POWER] > 0
    if gpu == 7:
        assert expected[pynvml.NVML_PERF_POLICY_LOW_UTILIZATION] == slots * SLOT_S * NS, "idle all along"


def test_power_violation_rises_by_the_time_held_at_the_cap(install: Install, clock: FakeClock) -> None:
    """Find a stretch with SwPowerCap set throughout: the counter rises by exactly its length."""
    install("dgx-a100")
    handle = _handle(CAPPED_GPU)
    capped_run: list[int] = []
    slot = 0
    while len(capped_run) < 300:
        assert slot < 20_000, "no 3 s stretch at the power cap in 200 s of work"
        clock.at(10.0 + (slot + 0.5) * SLOT_S)
        if pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) & pynvml.nvmlClocksEventReasonSwPowerCap:
            capped_run.append(slot)
        else:
            capped_run.clear()
        slot += 1
    first, last = capped_run[0], capped_run[-1]
    clock.at(10.0 + first * SLOT_S)
    start = pynvml.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_POWER)
    clock.at(10.0 + (last + 1) * SLOT_S)
    end = pynvml.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_POWER)
    held_s = (last + 1 - first) * SLOT_S
    assert end.violationTime - start.violationTime == pytest.approx(held_s * NS, abs=1000)
    assert (end.referenceTime - start.referenceTime) == pytest.approx(held_s * 1e6, abs=1), "a CPU time in us"


def test_violation_counters_never_go_back(install: Install, clock: FakeClock) -> None:
    install("dgx-h100")
    times = sorted(random.Random(7).uniform(0.0, 400.0) for _ in range(400))
    for gpu in (0, 5, 7):
        handle = _handle(gpu)
        last = dict.fromkeys(FIELDS, -1)
        for t in times:
            clock.at(t)
            for policy in FIELDS:
                value = _violation_ns(handle, policy)
                assert value >= last[policy]
                last[policy] = value
        assert last[pynvml.NVML_PERF_POLICY_RELIABILITY] == 0, "no reliability limiter in the fake"


def test_violation_fields_are_read_every_sweep(clock: FakeClock) -> None:
    """The throttle-time counters every sweep (each sweep's increase is charged to whoever holds the GPU), the
    management limit at the slow cadence."""
    ticks = [0.0]
    for source, fake in open_source("dgx-h100", clock, slow_interval_s=5.0):
        source._reader._clock = lambda: ticks[0]
        source.open()
        samples = []
        for step in range(10):
            ticks[0] = float(step)
            clock.at(92.0 + step)
            samples.append(source.read(5.0)[0])
            expected = fake.workload.violation_ns(0, pynvml.NVML_PERF_POLICY_THERMAL, clock() - fake.created_at)
            assert samples[-1].violation_thermal_ns == expected
        assert "nvmlDeviceGetViolationStatus" not in fake.call_counts(), "read through the perf policy fields"
        assert fake.call_counts()["nvmlDeviceGetPowerManagementLimit"] == 8 * 2
        assert samples[4].violation_thermal_ns is not None
        assert samples[0].violation_thermal_ns is not None
        assert samples[4].violation_thermal_ns - samples[0].violation_thermal_ns == 4 * NS, "in the episode"


def test_reliability_is_not_supported_before_hopper(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-a100", clock, slow_interval_s=0.0):
        source.open()
        samples = _sweeps(source, clock, 3, step_s=10.0)
        for sample in samples:
            assert sample.violation_reliability_ns is None
            assert sample.violation_power_ns is not None
            assert sample.violation_thermal_ns == 0
        assert fake.call_counts()["nvmlDeviceGetViolationStatus"] == 8, (
            "the reliability field unanswered: asked once through the older call, then left out"
        )
        assert samples[CAPPED_GPU].violation_power_ns == _violation_ns(
            _handle(CAPPED_GPU), pynvml.NVML_PERF_POLICY_POWER
        )
    for source, _ in open_source("dgx-h100", clock, slow_interval_s=0.0):
        source.open()
        assert all(sample.violation_reliability_ns == 0 for sample in _sweeps(source, clock, 2))


# NVLink error totals


def test_nvlink_error_totals_sum_the_links(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock, slow_interval_s=0.0):
        source.open()
        clock.at(120.0)
        samples = source.read(5.0)
        for gpu in (5, 7, 0):
            handle = _handle(gpu)
            sample = samples[gpu]
            for name, counter in (("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                                  ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
                                  ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
                                  ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)):  # fmt: skip
                per_link = [pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter) for link in range(18)]
                assert getattr(sample, f"nvlink_{name}_errors") == sum(per_link)
        noisy = samples[5]
        assert noisy.nvlink_crc_flit_errors is not None
        assert noisy.nvlink_crc_data_errors is not None
        assert noisy.nvlink_crc_flit_errors > noisy.nvlink_crc_data_errors > 0
        assert noisy.nvlink_replay_errors == noisy.nvlink_crc_flit_errors + noisy.nvlink_crc_data_errors
        assert samples[7].nvlink_recovery_errors == 3, "the down link's recovery attempts"
        assert samples[0].nvlink_crc_flit_errors == 0, "healthy links count zero, not None"


def test_nvlink_error_totals_are_absent_without_nvlink_or_answers(clock: FakeClock) -> None:
    for source, _ in open_source("a100-pcie-2", clock, slow_interval_s=0.0):
        source.open()
        assert all(s.nvlink_crc_flit_errors is None and s.nvlink_recovery_errors is None for s in source.read(5.0))
    for source, fake in open_source("dgx-h100", clock, slow_interval_s=0.0):
        source.open()
        clock.now += 60
        assert source.read(5.0)[5].nvlink_crc_flit_errors == sum(
            pynvml.nvmlDeviceGetNvLinkErrorCounter(_handle(5), link, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
            for link in range(18)
        )
        fake.not_supported("nvmlDeviceGetNvLinkErrorCounter")
        clock.now += 1
        sample = source.read(5.0)[5]
        assert (sample.nvlink_crc_flit_errors, sample.nvlink_replay_errors) == (None, None)
        assert sample.nvlinks, "link states still read"


def test_fake_library_is_what_the_source_reads(clock: FakeClock) -> None:
    """The fields stay None when the driver lacks the functions altogether (an old driver)."""
    for source, fake in open_source("t4", clock, slow_interval_s=0.0):
        for name in ("nvmlDeviceGetViolationStatus", "nvmlDeviceGetEncoderUtilization",
                     "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetPowerManagementLimit"):  # fmt: skip
            del fake._entry_points[name]
        fake.drop_fields(range(74, 80))  # nor the perf policy fields (NVML_FI_DEV_PERF_POLICY_*)
        source.open()
        (sample,) = _sweeps(source, clock, 2)
        assert sample.utilization_pct is not None
        assert sample.power_management_limit_w is None
        assert sample.power_limit_w == 70.0
        assert sample.encoder_utilization_pct is None
        assert sample.decoder_utilization_pct is None
        assert all(getattr(sample, field) is None for field in FIELDS.values())
        assert isinstance(fake, FakeNvmlLibrary)
