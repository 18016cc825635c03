"""Throttling from NVML's violation counters: the GPU time lost to the power cap and to thermal slowdown.

``nvmlDeviceGetViolationStatus(handle, policy).violationTime`` is the time, in ns since the driver was loaded,
during which the GPU's clocks were held below the requested clocks by ``policy``: ``NVML_PERF_POLICY_POWER`` (the
power cap) or ``NVML_PERF_POLICY_THERMAL`` (thermal slowdown). The time lost in an interval between two readings
is their difference, guarded:

- a difference below zero (the driver was reloaded or the GPU reset, and the counter started again) is not
  attributed: the interval's throttling is unknown (unlike energy, nothing says how much of the interval came
  after the restart);
- a difference longer than the interval itself (the counter and the readings' clock disagree) is clamped to it;
- an unknown reading (the counter unsupported, the GPU lost) leaves the interval's throttling unknown, never 0.

The counter is the whole GPU's: like energy, each interval's violation time is shared among the GPU's owners in
the fractions their GPU time is (a MIG instance of 3 slices takes 3/7 of it, each of two pods time-slicing a GPU
half), so it is counted once however many owners there are, and each owner's share comes out the GPU's.

**Share of GPU time lost** to a policy, for an owner over a range::

    violation GPU-seconds attributed to the owner / GPU-seconds attributed to the owner

both taken over the intervals in which the counter was read (``*_known_s``); shown in percent, with the
GPU-seconds it is a share of. ``None`` (unknown) when the counter was never read over the owner's time.
"""

from __future__ import annotations

NS_PER_S = 1_000_000_000

POLICIES = ("power_cap", "thermal")
"""The throttling policies accounted, as named in tallies, columns and JSON (``power_cap_s``, ``thermal_pct``)."""


def interval_violation_s(before_ns: int | None, after_ns: int | None, interval_s: float) -> float | None:
    """Seconds of ``interval_s`` in which the clocks were held down, from two counter readings; ``None`` when
    unknown (a reading missing, or the counter went back: a driver reload)."""
    if before_ns is None or after_ns is None or after_ns < before_ns:
        return None
    return min((after_ns - before_ns) / NS_PER_S, interval_s)


def share_pct(violation_s: float, known_s: float) -> float | None:
    """The share of GPU time lost, in percent (see the module's definition); ``None`` with no known second."""
    return 100.0 * violation_s / known_s if known_s > 0 else None
