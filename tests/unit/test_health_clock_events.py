"""Decoding NVML's clocks event reasons bitmask: names, benign or throttling, unknown masks."""

from __future__ import annotations

from nvdash.health.clock_events import (
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    REASONS,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    SYNC_BOOST,
    decode_reasons,
    describe_reasons,
    is_set,
    throttling_reasons,
    unknown_bits,
)


def test_every_bit_of_nvml_h_has_its_name_and_benign_flag() -> None:
    assert [(reason.bit, reason.name, reason.benign) for reason in REASONS] == [
        (0x1, "idle", True),
        (0x2, "applications setting", True),
        (0x4, "SW power cap", False),
        (0x8, "HW slowdown", False),
        (0x10, "sync boost", True),
        (0x20, "SW thermal", False),
        (0x40, "HW thermal", False),
        (0x80, "HW power brake", False),
        (0x100, "display clock", True),
    ]
    assert all(reason.meaning for reason in REASONS)


def test_decode_names_the_set_bits_in_bit_order() -> None:
    assert [r.name for r in decode_reasons(SW_THERMAL_SLOWDOWN | SW_POWER_CAP)] == ["SW power cap", "SW thermal"]
    assert describe_reasons(GPU_IDLE | SYNC_BOOST) == "idle, sync boost"
    assert describe_reasons(0) == "none"
    assert decode_reasons(0) == ()


def test_unknown_mask_decodes_to_nothing_and_reads_na() -> None:
    assert decode_reasons(None) == ()
    assert throttling_reasons(None) == ()
    assert describe_reasons(None) == "n/a"
    assert not is_set(None, GPU_IDLE)


def test_bits_a_newer_driver_adds_are_named_as_other() -> None:
    assert unknown_bits(0x400 | SW_POWER_CAP) == 0x400
    assert describe_reasons(0x400 | SW_POWER_CAP) == "SW power cap, other (0x400)"


def test_only_throttling_reasons_count_and_hw_slowdown_folds_into_its_cause() -> None:
    assert throttling_reasons(GPU_IDLE | SYNC_BOOST | 0x2 | 0x100) == ()
    assert [r.name for r in throttling_reasons(SW_POWER_CAP | GPU_IDLE)] == ["SW power cap"]
    assert [r.name for r in throttling_reasons(HW_SLOWDOWN)] == ["HW slowdown"]
    assert [r.name for r in throttling_reasons(HW_SLOWDOWN | HW_THERMAL_SLOWDOWN)] == ["HW thermal"]
    assert [r.name for r in throttling_reasons(HW_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN)] == ["HW power brake"]
