"""Energy from the counter nvmlDeviceGetTotalEnergyConsumption reads: millijoules since the driver loaded."""

from __future__ import annotations

import pytest

from nvdash.accounting.energy import interval_energies_mj, interval_energy_mj, total_energy_j


def test_an_interval_is_the_counters_difference() -> None:
    assert interval_energy_mj(1_000_000, 1_350_000) == 350_000  # 350 J: e.g. 700 W for half a second
    assert interval_energy_mj(5, 5) == 0


def test_a_counter_that_starts_again_counts_from_zero() -> None:
    assert interval_energy_mj(9_000_000, 120_000) == 120_000  # reloaded driver: 120 J since


def test_unknown_readings_make_their_intervals_unknown() -> None:
    assert interval_energy_mj(None, 10) is None
    assert list(interval_energies_mj([100, 300, None, 900, 1000])) == [200, None, None, 100]
    assert list(interval_energies_mj([])) == []
    assert list(interval_energies_mj([7])) == []


def test_total_joules_over_a_run_with_a_reset_and_a_gap() -> None:
    # 100 J, then a reset (50 J since), a lost GPU, then 25 J
    readings = [1_000_000, 1_100_000, 50_000, None, 400_000, 425_000]
    assert total_energy_j(readings) == pytest.approx((100_000 + 50_000 + 25_000) / 1000)
