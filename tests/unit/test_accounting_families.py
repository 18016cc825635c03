"""The bound on the accounting counters' owners (:class:`OwnerBound`): at most N owners with series of their own,
every series a counter that never goes down, and the node's growth counted once over all series."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdash.accounting.attribution import Owner
from nvdash.metrics.accounting_families import ACCOUNTING_COUNTERS, OTHER, OwnerBound, Values
from nvdash.server.options import UsageError, parse_settings

A, B, C = (Owner("slurm", job, "alice", "lab") for job in ("1", "2", "3"))


def v(allocated: float) -> Values:
    """Values whose every counter is ``allocated`` (enough to follow the bookkeeping)."""
    return tuple(allocated for _ in ACCOUNTING_COUNTERS)


def first(split: tuple[dict[Owner, Values], Values]) -> tuple[dict[Owner, float], float]:
    owners, other = split
    return {owner: values[0] for owner, values in owners.items()}, other[0]


def test_the_owners_with_most_gpu_time_get_the_slots_and_the_rest_is_other() -> None:
    bound = OwnerBound(2)
    assert first(bound.split({A: v(5), B: v(3), C: v(1)})) == ({A: 5, B: 3}, 1)


def test_series_never_go_down_and_growth_is_counted_once_when_slots_change_hands() -> None:
    bound = OwnerBound(1)
    scrapes = [{A: v(5), B: v(3)}, {A: v(6), B: v(8)}, {A: v(10), B: v(9)}, {A: v(20), B: v(9)}]
    previous: dict[str, float] = {}
    counted = 0.0  # the sum of every series' increase from scrape to scrape (what increase() adds up)
    for totals, slotted in zip(scrapes, ("1", "2", "1", "1"), strict=True):
        owners, other = first(bound.split(totals))
        series = {owner.job: value for owner, value in owners.items()} | {OTHER: other}
        assert set(series) == {slotted, OTHER}
        for name, value in series.items():
            assert value >= previous.get(name, 0.0), f"{name} went down"  # a series that went and came back: new
            counted += value - previous.get(name, 0.0)
        previous = series
    # B took the slot at the second scrape (8 > 6), A took it back at the third (10 > 9), and yet every
    # GPU-second of the node was counted exactly once.
    assert counted == pytest.approx(20 + 9)


def test_without_a_change_of_hands_the_series_add_up_to_the_totals() -> None:
    bound = OwnerBound(1)
    for a, b in ((5, 3), (7, 4), (9, 9)):  # a tie keeps the slot where it is
        owners, other = first(bound.split({A: v(a), B: v(b)}))
        assert owners == {A: a}
        assert other == b


def test_zero_owners_puts_everything_in_other() -> None:
    assert first(OwnerBound(0).split({A: v(5), B: v(3)})) == ({}, 8)


@pytest.mark.parametrize(("argv", "message"), [
    (["--metrics-accounting-owners", "5"], "--metrics-accounting-owners needs --metrics-accounting"),
    (["--metrics-accounting", "--metrics-accounting-owners", "-1"], "must be 0 or more, not -1"),
    (["--metrics-accounting", "--metrics-accounting-owners", "lots"], "invalid int value: 'lots'"),
])
def test_a_wrong_bound_is_a_one_line_usage_error(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_settings(argv, {})


def test_the_bound_from_the_environment_and_a_config_file(tmp_path: Path) -> None:
    environ = {"NVDASH_METRICS_ACCOUNTING": "1", "NVDASH_METRICS_ACCOUNTING_OWNERS": "7"}
    assert parse_settings([], environ).metrics_accounting_owners == 7
    config = tmp_path / "nvdash.toml"
    config.write_text("[metrics]\nmetrics-accounting = true\nmetrics-accounting-owners = 5\n")
    assert parse_settings(["--config", str(config)], {}).metrics_accounting_owners == 5


def test_the_option_turns_the_counters_on_with_the_default_bound() -> None:
    assert parse_settings([], {}).metrics_accounting_owners is None
    assert parse_settings(["--metrics-accounting"], {}).metrics_accounting_owners == 200
    bounded = parse_settings(["--metrics-accounting", "--metrics-accounting-owners", "3"], {})
    assert bounded.metrics_accounting_owners == 3
