"""Turning cumulative counters into per-second rates, with counter wrap and reset handled."""

from __future__ import annotations

WRAP_WIDTHS = (2**32, 2**64)
"""Where an NVML counter can wrap: NVML hands out an ``unsigned long long``, but the hardware counter behind some
fields (the PCIe byte counters nvml.h says "can be wrapped") is 32 bits wide on some GPUs."""


class CounterRate:
    """Rate of a cumulative counter from successive (value, time) readings.

    A reading below the previous one is a wrap or a reset. The wrap is taken at ``modulus`` when the counter's
    width is known, else at the smallest of ``2**32`` and ``2**64`` above the previous value. The wrap is believed
    only when the rate it implies is one the counter can reach: at most ``max_rate`` (in the rate's units, e.g.
    what the link can carry) when the caller knows it, else a delta of at most half the wrap's range. Otherwise
    it is a reset (a driver reload, a GPU reset): no rate for that interval, and counting goes on from the new
    value. With ``max_rate``, a forward jump faster than the counter can count is dropped the same way, so a
    reset can give no rate but never a huge one. ``scale`` converts counter units to the rate's units (1024 for
    a KiB counter to bytes).
    """

    def __init__(self, modulus: int | None = None, scale: float = 1.0, max_rate: float | None = None) -> None:
        self._modulus = modulus
        self._scale = scale
        self._max_rate = max_rate
        self._value: int | None = None
        self._time_s: float | None = None
        self._rate: float | None = None

    def update(self, value: int, time_s: float) -> float | None:
        """Record a reading; returns the rate since the previous reading, or ``None`` when there is none.

        A reading with the previous one's timestamp carries no news (a cached driver value): the last rate
        is returned again. A timestamp that goes backwards starts over.
        """
        prev_value, prev_time = self._value, self._time_s
        if prev_time is not None and time_s == prev_time and value == prev_value:
            return self._rate
        self._value, self._time_s = value, time_s
        self._rate = self._compute(prev_value, prev_time, value, time_s)
        return self._rate

    def _wrap_at(self, prev_value: int) -> int | None:
        if self._modulus is not None:
            return self._modulus
        return next((width for width in WRAP_WIDTHS if width > prev_value), None)

    def _compute(self, prev_value: int | None, prev_time: float | None, value: int, time_s: float) -> float | None:
        if prev_value is None or prev_time is None or time_s <= prev_time:
            return None
        delta = value - prev_value
        if delta < 0:
            modulus = self._wrap_at(prev_value)
            if modulus is None:
                return None
            delta += modulus
            if delta < 0 or (self._max_rate is None and delta > modulus // 2):
                return None
        rate = delta * self._scale / (time_s - prev_time)
        if self._max_rate is not None and rate > self._max_rate:
            return None
        return rate

    def reset(self) -> None:
        """Forget the previous reading."""
        self._value = None
        self._time_s = None
        self._rate = None
