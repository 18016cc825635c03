"""Human-readable units: IEC prefixes for bytes, decimal prefixes for rates."""

from __future__ import annotations

_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI_RATE = ("B/s", "kB/s", "MB/s", "GB/s", "TB/s")


def format_bytes(value: float | None) -> str:
    """``85520809984`` -> ``"79.6 GiB"``; ``None`` -> ``"n/a"``."""
    if value is None:
        return "n/a"
    size = float(value)
    for unit in _IEC:
        if abs(size) < 1024 or unit == _IEC[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_rate(value: float | None) -> str:
    """``63015384615.4`` -> ``"63.0 GB/s"``; ``None`` -> ``"n/a"``."""
    if value is None:
        return "n/a"
    rate = float(value)
    for unit in _SI_RATE:
        if abs(rate) < 1000 or unit == _SI_RATE[-1]:
            return f"{rate:.0f} {unit}" if unit == "B/s" else f"{rate:.1f} {unit}"
        rate /= 1000
    raise AssertionError("unreachable")
