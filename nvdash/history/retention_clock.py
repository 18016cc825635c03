"""When the history may delete: a retention clock that a jump of the wall clock cannot move.

Readings are stamped with the wall clock, and retention means "delete what is older than ``keep`` seconds". Taken
naively (the newest reading's stamp minus ``keep``) one forward step of the wall clock (an NTP step, a bad RTC at
boot, an operator's ``date -s``) deletes everything stamped before the new "now": 7 h ahead empties the raw
tables, a week ahead every tier, a year ahead the accounting. So the writer never deletes by the wall clock
alone. A row stamped ``t`` is deleted only when ``t < horizon - keep`` where

    horizon = min(retention_now, last_reading)

- ``retention_now`` starts at ``min(wall clock at open, trusted_until)`` and then advances with the monotonic
  clock only (an NTP step moves the wall clock, never the monotonic one). A forward jump therefore deletes
  nothing early: what was written before it ages by the time that really passes.
- ``trusted_until`` (stored in the file's ``meta`` table) is the newest stamp of a reading that was *not* ahead
  of its writer's own clock when written (see below). At a restart it bounds ``retention_now`` by the data's own
  times: a wall clock that is wrong from boot (a year ahead) cannot push the horizon past the newest reading
  that was known to be in the past. The price: time the server was down does not count towards retention until
  it runs again (a file left a month is pruned as the new run ages, not at once); the stored data never covers
  more than ``keep`` of running time, so the file does not grow by it.
- ``last_reading`` is the stamp of the reading written last (in arrival order). After a backward jump the new
  readings are stamped in the past of ``retention_now``; bounding the horizon by them keeps the readings written
  after the jump (and everything newer) until they themselves are ``keep`` old.

A reading is *ahead* (stamped in the future) when its stamp is more than ``AHEAD_TOLERANCE_S`` past this
process's own clock: the wall clock at open plus the monotonic time since. It is written and kept like any other
(deletion never reaches it early, the horizon being bounded by ``retention_now``); it is counted, and
``wall_offset_s`` (wall clock minus this process's clock) tells by how much the wall clock has moved, both on
``/health``. A restart re-anchors to the wall clock (bounded by ``trusted_until`` as above).

Backward jumps also stamp readings into times already rolled up. The tiers are recomputed from their sources, so
a bucket whose source rows were already pruned would be replaced by one holding only the new readings; see
:mod:`nvdash.history.tiers` for the low-water marks that prevent it. Rows are never duplicated: every reading
table is keyed by its time (and GPU, process), and an existing row is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

AHEAD_TOLERANCE_S = 60.0
"""How far a stamp may be past this process's clock before it counts as ahead (queueing, a small NTP step)."""


@dataclass(frozen=True)
class Observation:
    """What one batch's stamps say: how many are ahead, the newest trusted one, the last one."""

    ahead: int
    newest_trusted_s: float | None
    last_s: float | None
    wall_offset_s: float


class RetentionClock:
    """The horizon the writer prunes by, anchored at :meth:`start` and advanced by the monotonic clock only."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._wall0 = wall()
        self._mono0 = monotonic()
        self._retention0 = self._wall0
        self.trusted_until_s: float | None = None
        """The newest stamp known to have been in the past of its writer's clock (persisted by the writer)."""
        self.last_reading_s: float | None = None
        self.ahead_readings = 0
        self.wall_offset_s = 0.0

    def start(self, trusted_until_s: float | None) -> None:
        """Anchor now: this process's clock at the wall clock, the retention clock no later than
        ``trusted_until_s`` (the file's newest trusted stamp; ``None`` for a file without readings)."""
        self._wall0 = self._wall()
        self._mono0 = self._monotonic()
        self._retention0 = self._wall0 if trusted_until_s is None else min(self._wall0, trusted_until_s)
        self.trusted_until_s = trusted_until_s
        self.last_reading_s = None

    def elapsed_s(self) -> float:
        """Monotonic seconds since :meth:`start` (never negative)."""
        return max(0.0, self._monotonic() - self._mono0)

    def own_now_s(self) -> float:
        """This process's clock: the wall clock at start plus the monotonic time since (no jump moves it)."""
        return self._wall0 + self.elapsed_s()

    def retention_now_s(self) -> float:
        """``retention_now``: the anchor plus the monotonic time since."""
        return self._retention0 + self.elapsed_s()

    def observe(self, stamps: Sequence[float]) -> Observation:
        """Classify a batch's stamps (in arrival order) without recording them: see :meth:`record`."""
        own = self.own_now_s()
        trusted = [stamp for stamp in stamps if stamp <= own + AHEAD_TOLERANCE_S]
        newest = max(trusted, default=None)
        if self.trusted_until_s is not None and (newest is None or newest < self.trusted_until_s):
            newest = self.trusted_until_s
        return Observation(ahead=len(stamps) - len(trusted), newest_trusted_s=newest,
                           last_s=stamps[-1] if stamps else self.last_reading_s,
                           wall_offset_s=self._wall() - own)

    def record(self, observation: Observation) -> None:
        """Take a batch's observation in, once its readings are written."""
        self.ahead_readings += observation.ahead
        self.trusted_until_s = observation.newest_trusted_s
        self.last_reading_s = observation.last_s
        self.wall_offset_s = observation.wall_offset_s

    def horizon_s(self) -> float | None:
        """``min(retention_now, last_reading)``: rows older than this minus their table's keep may go; ``None``
        before any reading was written (nothing is deleted then)."""
        if self.last_reading_s is None:
            return None
        return min(self.retention_now_s(), self.last_reading_s)
