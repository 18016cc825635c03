"""Decoding NVML's clocks event ("throttle") reasons bitmask into names, benign or throttling.

The bits are ``nvmlClocksEventReason*`` from ``nvml.h`` (nvidia-smi's ``clocks_event_reasons``, formerly
``clocks_throttle_reasons``).
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

THERMAL = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN
"""The bits that mean the clocks are lowered because of temperature."""


@dataclass(frozen=True, slots=True)
class ClockEventReason:
    """One bit of the mask: its short name, whether it is harmless, and what it means."""

    bit: int
    name: str
    benign: bool
    meaning: str


REASONS: tuple[ClockEventReason, ...] = (
    ClockEventReason(GPU_IDLE, "idle", True, "nothing runs, so the clocks drop to save power"),
    ClockEventReason(APPLICATIONS_CLOCKS_SETTING, "applications setting", True,
                     "clocks pinned by the applications clocks setting"),
    ClockEventReason(SW_POWER_CAP, "SW power cap", False,
                     "the driver lowers clocks to keep power under the enforced limit"),
    ClockEventReason(HW_SLOWDOWN, "HW slowdown", False,
                     "the hardware cut clocks (over-temperature or power-supply signal)"),
    ClockEventReason(SYNC_BOOST, "sync boost", True, "clocks held to match the other GPUs of a sync-boost group"),
    ClockEventReason(SW_THERMAL_SLOWDOWN, "SW thermal", False,
                     "the driver lowers clocks to keep the GPU or its memory under their maximum temperature"),
    ClockEventReason(HW_THERMAL_SLOWDOWN, "HW thermal", False, "the hardware cut clocks because it runs too hot"),
    ClockEventReason(HW_POWER_BRAKE_SLOWDOWN, "HW power brake", False,
                     "an external power-brake signal (e.g. from the chassis) cut clocks"),
    ClockEventReason(DISPLAY_CLOCK_SETTING, "display clock", True, "clocks follow the display clock setting"),
)
"""Every known reason, in bit order."""

_KNOWN_BITS = 0
for _reason in REASONS:
    _KNOWN_BITS |= _reason.bit


def decode_reasons(mask: int | None) -> tuple[ClockEventReason, ...]:
    """The known reasons set in ``mask`` (none when the mask is unknown)."""
    if mask is None:
        return ()
    return tuple(reason for reason in REASONS if mask & reason.bit)


def throttling_reasons(mask: int | None) -> tuple[ClockEventReason, ...]:
    """The reasons in ``mask`` that slow a working GPU down (not idle, applications setting, sync boost, display).

    HW slowdown is left out when HW thermal or HW power brake says why the hardware slowed down.
    """
    reasons = tuple(reason for reason in decode_reasons(mask) if not reason.benign)
    if mask is not None and mask & (HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN):
        reasons = tuple(reason for reason in reasons if reason.bit != HW_SLOWDOWN)
    return reasons


def is_set(mask: int | None, bits: int) -> bool:
    """True when ``mask`` is known and has any of ``bits``."""
    return mask is not None and bool(mask & bits)


def unknown_bits(mask: int | None) -> int:
    """The bits of ``mask`` this module does not know (newer drivers may add some)."""
    return 0 if mask is None else mask & ~_KNOWN_BITS


def describe_reasons(mask: int | None) -> str:
    """``"SW power cap, HW thermal"``; ``"none"`` when no bit is set; ``"n/a"`` when unknown."""
    if mask is None:
        return "n/a"
    names = [reason.name for reason in decode_reasons(mask)]
    extra = unknown_bits(mask)
    if extra:
        names.append(f"other ({extra:#x})")
    return ", ".join(names) if names else "none"
