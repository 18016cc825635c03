"""Human-readable units: IEC prefixes for bytes, decimal prefixes for rates; ``n/a`` when unknown."""

from __future__ import annotations

import math
from collections.abc import Sequence

IEC_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
RATE_UNITS = ("B/s", "kB/s", "MB/s", "GB/s", "TB/s")


def _scaled(value: float, base: float, units: Sequence[str]) -> tuple[float, str]:
    magnitude, unit = abs(value), 0
    while magnitude >= base and unit < len(units) - 1:
        magnitude /= base
        unit += 1
    return math.copysign(magnitude, value), units[unit]


def is_known(value: float | None) -> bool:
    """False for ``None`` and NaN (how the dashboards mark a missing value)."""
    return value is not None and not math.isnan(value)


def format_bytes(value: float | None) -> str:
    """Bytes with IEC prefixes: ``35.2 GiB``; ``n/a`` when unknown."""
    if value is None or not is_known(value):
        return "n/a"
    scaled, unit = _scaled(float(value), 1024, IEC_UNITS)
    return f"{scaled:.0f} {unit}" if unit == IEC_UNITS[0] else f"{scaled:.1f} {unit}"


def format_bytes_of(used: float | None, total: float | None) -> str:
    """Used of total in the total's unit: ``35.2 / 79.6 GiB``."""
    if used is None or total is None or not (is_known(used) and is_known(total)):
        return f"{format_bytes(used)} / {format_bytes(total)}"
    scaled_total, unit = _scaled(float(total), 1024, IEC_UNITS)
    scale = total / scaled_total if scaled_total else 1.0
    digits = 0 if unit == IEC_UNITS[0] else 1
    return f"{used / scale:.{digits}f} / {scaled_total:.{digits}f} {unit}"


def format_rate(value: float | None) -> str:
    """Bytes per second with decimal prefixes, as link speeds are quoted: ``12.3 GB/s``."""
    if value is None or not is_known(value):
        return "n/a"
    scaled, unit = _scaled(float(value), 1000, RATE_UNITS)
    return f"{scaled:.0f} {unit}" if unit == RATE_UNITS[0] else f"{scaled:.1f} {unit}"


def format_pct(value: float | None, digits: int = 1) -> str:
    """A percentage: ``73.0 %``."""
    if value is None or not is_known(value):
        return "n/a"
    return f"{value:.{digits}f} %"


def format_rate_of(value: float | None, maximum: float | None, *, maximum_name: str = "") -> str:
    """A rate against its link maximum: ``12.3 GB/s of 63.0 GB/s (19 %)``; ``maximum_name`` says which maximum
    (``12.3 GB/s of 450.0 GB/s data rate (3 %)``)."""
    if value is None or not is_known(value):
        return "n/a"
    if maximum is None or not is_known(maximum) or maximum <= 0:
        return format_rate(value)
    name = f" {maximum_name}" if maximum_name else ""
    return f"{format_rate(value)} of {format_rate(maximum)}{name} ({100.0 * value / maximum:.0f} %)"




ENERGY_UNITS = ("J", "kJ", "MJ", "GJ")


def format_energy(joules: float | None) -> str:
    """Energy with decimal prefixes of the joule: ``512 J``, ``3.6 kJ``, ``1.2 MJ``; ``n/a`` when unknown."""
    if joules is None or not is_known(joules):
        return "n/a"
    scaled, unit = _scaled(float(joules), 1000, ENERGY_UNITS)
    return f"{scaled:.0f} {unit}" if unit == ENERGY_UNITS[0] else f"{scaled:.1f} {unit}"


def format_power(watts: float | None) -> str:
    """Power in watts: ``123.4 W``; ``n/a`` when unknown."""
    if watts is None or not is_known(watts):
        return "n/a"
    return f"{watts:.1f} W"
