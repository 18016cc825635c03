"""Counter-to-rate conversion: steady counting, wrap, reset, cached readings."""

from __future__ import annotations

import pytest

from nvdash.sampling.rates import CounterRate


def test_first_reading_has_no_rate_then_rate_is_delta_over_time() -> None:
    rate = CounterRate()
    assert rate.update(1_000, 10.0) is None
    assert rate.update(3_000, 10.5) == pytest.approx(4_000.0)
    assert rate.update(3_000, 11.5) == pytest.approx(0.0)


def test_scale_converts_units() -> None:
    rate = CounterRate(scale=1024.0)
    rate.update(10, 0.0)
    assert rate.update(20, 2.0) == pytest.approx(5 * 1024.0)


def test_32_bit_wrap_is_counted_across_the_boundary() -> None:
    rate = CounterRate(modulus=2**32)
    rate.update(2**32 - 100, 1.0)
    assert rate.update(400, 2.0) == pytest.approx(500.0)


def test_decrease_without_modulus_is_a_reset_and_rebases() -> None:
    rate = CounterRate()
    rate.update(10_000, 1.0)
    assert rate.update(50, 2.0) is None
    assert rate.update(150, 3.0) == pytest.approx(100.0)


def test_large_decrease_with_modulus_is_a_reset_not_a_wrap() -> None:
    rate = CounterRate(modulus=2**32)
    rate.update(2**30, 1.0)
    assert rate.update(5, 2.0) is None
    assert rate.update(1_005, 3.0) == pytest.approx(1_000.0)


def test_same_timestamp_and_value_repeats_the_last_rate() -> None:
    rate = CounterRate()
    rate.update(0, 1.0)
    assert rate.update(500, 2.0) == pytest.approx(500.0)
    assert rate.update(500, 2.0) == pytest.approx(500.0)


def test_time_going_backwards_gives_no_rate_then_recovers() -> None:
    rate = CounterRate()
    rate.update(0, 5.0)
    assert rate.update(100, 4.0) is None
    assert rate.update(300, 6.0) == pytest.approx(100.0)


def test_reset_forgets_the_previous_reading() -> None:
    rate = CounterRate()
    rate.update(0, 1.0)
    rate.reset()
    assert rate.update(100, 2.0) is None
