"""Time ranges as users write them: ``6h``, ``7d``, ``30m``; ``from``/``to`` as ISO 8601 or Unix seconds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

PRESETS: tuple[str, ...] = ("30m", "1h", "6h", "12h", "24h", "2d", "7d")
"""The range control's choices besides Live and a custom from/to."""
LIVE = "live"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_DURATION = re.compile(r"\A *([0-9]+(?:\.[0-9]+)?) *([smhdw]) *\Z")
"""ASCII digits and plain spaces only: a control character or another script's digit is not a duration."""


class RangeError(ValueError):
    """A range that cannot be read; the message is one line for the user."""


def parse_duration(text: str, units: str = "smhdw") -> float:
    """Seconds in ``text`` (``90s``, ``30m``, ``6h``, ``7d``, ``2w``; only ``units`` allowed)."""
    match = _DURATION.match(text or "")
    if match is None or match.group(2) not in units:
        allowed = ", ".join(units)
        raise RangeError(f"{text!r} is not a duration: write a number and a unit ({allowed}), e.g. 6h or 7d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise RangeError(f"{text!r} is not a positive duration")
    if seconds > LATEST_S:
        raise RangeError(f"{text[:40]!r} is longer than all time (1970 to 9999)")
    return seconds


LATEST_S = 253_402_300_799.0
"""9999-12-31T23:59:59Z, the last moment a date is written for; times run from the epoch to it."""


def _within_dates(seconds: float, text: str) -> float:
    if not 0.0 <= seconds <= LATEST_S:
        raise RangeError(f"{text!r} is out of range: times run from 1970 to 9999")
    return seconds


def parse_time(text: str) -> float:
    """Seconds since the epoch from Unix seconds (``1732272442``) or ISO 8601 (``2026-11-21T08:00``, local when
    no zone is given; ``Z`` for UTC), between 1970 and 9999."""
    stripped = (text or "").strip()
    try:
        value = float(stripped)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise RangeError(f"{text!r} is not a time")
        return _within_dates(value / 1000.0 if value > 1e11 else value, text)
    try:
        moment = datetime.fromisoformat(stripped.replace("Z", "+00:00").replace(" ", "T", 1))
    except ValueError:
        raise RangeError(f"{text!r} is not a time: use ISO 8601 (2026-11-21T08:00:00Z) or Unix seconds") from None
    try:
        seconds = moment.timestamp()
    except (OverflowError, ValueError, OSError):  # a naive time near year 1 or 9999 in the local zone
        raise RangeError(f"{text!r} is out of range: times run from 1970 to 9999") from None
    return _within_dates(seconds, text)


@dataclass(frozen=True)
class TimeRange:
    """A resolved range: ``[start_s, end_s]``, and how it was asked for (a preset name or ``custom``)."""

    start_s: float
    end_s: float
    label: str

    @property
    def seconds(self) -> float:
        """The range's length."""
        return self.end_s - self.start_s


def resolve(arguments: Mapping[str, str], now_s: float, default: str | None = None) -> TimeRange | None:
    """The range asked for by ``range=`` or ``from=``/``to=`` (``to`` defaults to ``now_s``); ``None`` for Live.

    Relative ranges end at ``now_s`` (the newest reading when replaying). Raises :class:`RangeError`.
    """
    start, end = arguments.get("from"), arguments.get("to")
    name = arguments.get("range") or (None if start else default)
    if start:
        if name and name != "custom":
            raise RangeError("give either range= or from=/to=, not both")
        start_s = parse_time(start)
        end_s = parse_time(end) if end else now_s
        if start_s > end_s:
            raise RangeError("from is after to")
        if start_s == end_s:
            raise RangeError("from and to are the same moment")
        return TimeRange(start_s, end_s, "custom")
    if end:
        raise RangeError("to= needs from=")
    if name is None or name.lower() == LIVE:
        return None
    seconds = parse_duration(name)
    return TimeRange(now_s - seconds, now_s, name)
