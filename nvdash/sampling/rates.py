"""Turning cumulative counters into per-second rates, with counter wrap and reset handled."""

from __future__ import annotations


class CounterRate:
    """Rate of a cumulative counter from successive (value, time) readings.

    ``modulus`` is the counter's range (``2**32`` for a 32-bit counter) when it wraps; a decrease that a
    wrap explains within half the range is taken as a wrap, any other decrease as a reset (no rate for that
    reading). ``scale`` converts counter units to the rate's units (1024 for a KiB counter to bytes).
    """

    def __init__(self, modulus: int | None = None, scale: float = 1.0) -> None:
        self._modulus = modulus
        self._scale = scale
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

    def _compute(self, prev_value: int | None, prev_time: float | None, value: int, time_s: float) -> float | None:
        if prev_value is None or prev_time is None or time_s <= prev_time:
            return None
        delta = value - prev_value
        if delta < 0:
            if self._modulus is None:
                return None
            delta += self._modulus
            if delta < 0 or delta > self._modulus // 2:
                return None
        return delta * self._scale / (time_s - prev_time)

    def reset(self) -> None:
        """Forget the previous reading."""
        self._value = None
        self._time_s = None
        self._rate = None
