"""Allocated but idle: owners holding a GPU (or MIG instance) while doing nothing on it, for long enough to matter.

An owner's share of a unit is idle at a reading when the owner was allocated the unit (a job-mapping file, the
kubelet) and has no process on it, or when the unit's utilization is 0 (for processes holding GPU memory: memory
held at 0 % compute). It is flagged once it has been idle at every reading for ``after_s`` (30 minutes by default),
so a job starting up or pausing between steps is not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nvdash.accounting.attribution import Owner, Share

DEFAULT_IDLE_AFTER_S = 1800.0
NO_PROCESS = "no process"
NO_UTILIZATION = "utilization 0"
MEMORY_AT_ZERO = "memory held at 0 % compute"


@dataclass(frozen=True)
class IdleAllocation:
    """One owner's unit, idle since ``since_s`` for the ``reason`` of the latest reading."""

    gpu_index: int
    unit: str
    owner: Owner
    since_s: float
    reason: str
    memory_bytes: int | None

    def idle_s(self, now_s: float) -> float:
        """How long it has been idle at ``now_s``."""
        return max(0.0, now_s - self.since_s)


def idle_reason(share: Share) -> str | None:
    """Why ``share`` is idle at its reading, or ``None`` when it is not (or nvdash cannot tell)."""
    if share.allocated and share.processes == 0:
        return NO_PROCESS
    if share.utilization_pct == 0:
        return MEMORY_AT_ZERO if share.processes and share.memory_bytes else NO_UTILIZATION
    return None


class IdleTracker:
    """Follows the shares of each reading and keeps, per owner and unit, since when it has been idle."""

    def __init__(self, after_s: float = DEFAULT_IDLE_AFTER_S) -> None:
        self.after_s = after_s
        self._idle: dict[tuple[Owner, str], IdleAllocation] = {}
        self._now_s = 0.0

    def step(self, time_s: float, shares: Iterable[Share]) -> None:
        """Take one reading's shares: a share busy now, or gone, starts over."""
        idle: dict[tuple[Owner, str], IdleAllocation] = {}
        for share in shares:
            reason = idle_reason(share)
            if reason is None:
                continue
            key = (share.owner, share.unit)
            before = self._idle.get(key)
            since = before.since_s if before is not None else time_s
            idle[key] = IdleAllocation(share.gpu_index, share.unit, share.owner, since, reason, share.memory_bytes)
        self._idle = idle
        self._now_s = time_s

    @property
    def now_s(self) -> float:
        """The time of the latest reading."""
        return self._now_s

    def flagged(self) -> list[IdleAllocation]:
        """The shares idle for at least ``after_s`` at the latest reading, longest idle first."""
        found = [a for a in self._idle.values() if a.idle_s(self._now_s) >= self.after_s]
        return sorted(found, key=lambda a: (a.since_s, a.gpu_index, a.unit, a.owner))
