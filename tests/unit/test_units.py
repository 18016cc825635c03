"""Human units on the index page and in tooltips."""

from __future__ import annotations

from nvdash.units import format_bytes, format_rate


def test_bytes_use_iec_prefixes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(81559 * 2**20) == "79.6 GiB"
    assert format_bytes(None) == "n/a"


def test_rates_use_decimal_prefixes() -> None:
    assert format_rate(999) == "999 B/s"
    assert format_rate(63.0e9) == "63.0 GB/s"
    assert format_rate(2.5e6) == "2.5 MB/s"
    assert format_rate(None) == "n/a"
