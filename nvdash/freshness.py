"""Staleness: when readings stop arriving, every view says so instead of showing the last values as live.

A part (the sampler's sweeps, its process collection) is *stale* once it has not completed a round for
:data:`STALE_ROUNDS` of its rounds, and for at least :data:`STALE_MIN_S` (a sweep a little late on a busy machine is
not a stuck sampler, and a liveness probe must not restart a server for it). ``/health`` then answers 503, the index
page and the dashboards show "no new readings since HH:MM:SS", and ``/metrics`` stops exporting the frozen GPU
readings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

STALE_ROUNDS = 3
"""A part is stale after this many of its rounds without completing one..."""
STALE_MIN_S = 5.0
"""...and at least this many seconds."""


@dataclass(frozen=True, slots=True)
class Stale:
    """A part that has not completed a round for too long."""

    part: str
    since_wall: float
    """Unix time of its last completed round (or of its start, when it never completed one)."""


def stale_after(every_s: float) -> float:
    """Seconds without a round after which a part that completes one every ``every_s`` is stale."""
    return max(STALE_ROUNDS * every_s, STALE_MIN_S)


def is_stale(age_s: float, every_s: float) -> bool:
    """Whether a part that completes a round every ``every_s`` is stale after ``age_s`` without one."""
    return age_s > stale_after(every_s)


def stale_since(newest_s: float | None, now_s: float, every_s: float) -> float | None:
    """``newest_s`` (the newest reading's Unix time) when it is too old at ``now_s``, else ``None``."""
    if newest_s is None or not is_stale(now_s - newest_s, every_s):
        return None
    return newest_s


def iso_time(unix_s: float) -> str:
    """``unix_s`` as ISO 8601 in UTC, to the second (``2026-11-27T06:18:38Z``)."""
    return datetime.fromtimestamp(unix_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def banner_text(since_s: float) -> str:
    """What a page shows while its readings are stale (the time in the server's local time zone)."""
    return f"no new readings since {time.strftime('%H:%M:%S', time.localtime(since_s))}"


def merge(*groups: list[Stale]) -> list[Stale]:
    """The stale parts of several reports, each part once (its earliest ``since``), ordered by name."""
    earliest: dict[str, Stale] = {}
    for group in groups:
        for item in group:
            known = earliest.get(item.part)
            if known is None or item.since_wall < known.since_wall:
                earliest[item.part] = item
    return [earliest[name] for name in sorted(earliest)]
