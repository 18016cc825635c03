"""Throttle times through NVML's perf policy fields (``NVML_FI_DEV_PERF_POLICY_POWER`` 74 ... ``_RELIABILITY`` 79, in
``nvmlPerfPolicyType_t``'s order), which NVML asks for now that it deprecates ``nvmlDeviceGetViolationStatus``; that
call where a driver does not answer a field. Both carry the same quantity: the policy's violation time in ns."""

from __future__ import annotations

from tests.unit.conftest import FakeClock, open_source

PERF_POLICY_FIELDS = range(74, 80)
POWER, THERMAL = 0, 1
"""``NVML_PERF_POLICY_POWER``, ``NVML_PERF_POLICY_THERMAL``."""
CAPPED_GPU = 2
"""dgx-a100's GPU held at a 300 W enforced limit below its 400 W management limit."""


def test_the_fields_give_the_throttle_times_and_the_deprecated_call_is_not_made(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-a100", clock, slow_interval_s=0.0):
        source.open()
        for at in (20.0, 45.0):
            clock.at(at)
            sample = source.read(5.0)[CAPPED_GPU]
            t = clock() - fake.created_at
            assert sample.violation_power_ns == fake.workload.violation_ns(CAPPED_GPU, POWER, t)
            assert sample.violation_thermal_ns == fake.workload.violation_ns(CAPPED_GPU, THERMAL, t)
        assert sample.violation_power_ns > 0, "the capped GPU's clocks were held by the power cap"
        unsupported = 6 - len(fake.profile.violation_policies)
        assert unsupported == 1, "dgx-a100 has no reliability counter (Hopper and later)"
        assert fake.call_counts()["nvmlDeviceGetViolationStatus"] == 8 * unsupported, (
            "the deprecated call only once per GPU, for the one field the driver does not answer"
        )


def test_a_driver_without_the_fields_is_read_through_the_deprecated_call(clock: FakeClock) -> None:
    for source, fake in open_source("dgx-a100", clock, slow_interval_s=0.0):
        fake.drop_fields(PERF_POLICY_FIELDS)
        gpus = len(source.open())
        clock.at(20.0)
        sample = source.read(5.0)[CAPPED_GPU]
        t = clock() - fake.created_at
        assert sample.violation_power_ns == fake.workload.violation_ns(CAPPED_GPU, POWER, t)
        calls = fake.call_counts()["nvmlDeviceGetViolationStatus"]
        supported = len(fake.profile.violation_policies)
        assert calls == gpus * 6, "each policy asked once per GPU"
        assert "nvmlDeviceGetFieldValues" in fake.call_counts()
        clock.at(30.0)
        source.read(5.0)
        assert fake.call_counts()["nvmlDeviceGetViolationStatus"] == calls + gpus * supported, (
            "the policies the driver does not support are not asked again"
        )
