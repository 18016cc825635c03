"""Quota findings over time: one judge per store, fed every usage reading on the sampler's thread.

One reading is not enough for two findings (see :func:`~nvdash.health.quotas.quota_findings` for one reading):

- compute above the core quota holds only after :data:`SUSTAIN_READINGS` readings in a row flag it, and ends only
  after as many readings in a row do not (the SM share of one short window is noisy: a kernel that starts late in
  one window shows as a burst, one that waits on data as a dip); while it ends, the last reading above is shown;
- a quota is unused only when its pod ran no process on it for :data:`UNUSED_AFTER_S`, counted from the later of
  the reading that first showed the grant and the last reading its pod used it in.

Memory over quota and unallocated use hold from the reading that shows them (memory held is a state, not a rate).
Time is the readings' own ``time_s`` (the sampler's clock, a replay's recording). Every surface (processes.json,
``/metrics``, GPU Health, GPU Processes) asks :func:`store_findings`, so they all say the same.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from weakref import WeakKeyDictionary

from nvdash.health.quotas import QuotaFinding, quota_findings, snapshot_findings
from nvdash.sampling.records import GpuEvent, Snapshot
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.usage_records import Usage
from nvdash.store import Store

SUSTAIN_READINGS = 3
"""Usage readings in a row (about 2 s each by default) that must flag compute above the quota."""
UNUSED_AFTER_S = 600.0
"""How long a grant must go without a process of its pod before it is called unused."""
_KEPT = 8
"""Judged readings kept, so that a reader one or two readings behind gets their judgement."""

_Key = tuple[str, str, str, str, str | None]


@dataclass(slots=True)
class _Track:
    first_seen_s: float
    last_used_s: float | None = None


class QuotaJudge:
    """Judges each usage reading once, in order, with what the earlier readings said; thread-safe, never blocks
    for long (a reading's findings are a pure computation over small records)."""

    def __init__(self, sustain_readings: int = SUSTAIN_READINGS, unused_after_s: float = UNUSED_AFTER_S) -> None:
        self.sustain_readings = max(1, sustain_readings)
        self.unused_after_s = unused_after_s
        self._lock = threading.Lock()
        self._grants: dict[_Key, _Track] = {}
        self._over: dict[_Key, int] = {}
        """Readings in a row above the quota, per grant."""
        self._held: dict[_Key, tuple[QuotaFinding, int]] = {}
        """Compute findings that hold: the last reading above the quota, and the readings in a row since then."""
        self._judged: deque[tuple[Usage, tuple[QuotaFinding, ...]]] = deque(maxlen=_KEPT)
        self._last_s: float | None = None

    def submit(self, snapshot: Snapshot) -> None:
        """A store listener: judge the snapshot's usage reading if it is new."""
        if snapshot.usage is not None:
            self.judge(snapshot.usage, snapshot.shares)

    def submit_events(self, events: Iterable[GpuEvent]) -> None:
        """Events say nothing about quotas."""

    def findings(self, snapshot: Snapshot | None) -> tuple[QuotaFinding, ...]:
        """The judged findings of ``snapshot``'s usage reading (judging it now when the listener has not yet)."""
        if snapshot is None or snapshot.usage is None:
            return ()
        return self.judge(snapshot.usage, snapshot.shares)

    def judge(self, usage: Usage, shares: Sequence[UnitShares] = ()) -> tuple[QuotaFinding, ...]:
        """The findings of ``usage`` given the readings judged before it; a reading already judged gets the same
        answer, one older than the newest judged (and no longer kept) only its findings that need no history."""
        with self._lock:
            for seen, found in self._judged:
                if seen is usage:
                    return found
            raw = quota_findings(usage, shares)
            if self._last_s is not None and usage.time_s <= self._last_s:
                return tuple(f for f in raw if f.kind not in ("compute_over_quota", "quota_unused"))
            found = self._judge(usage, raw)
            self._judged.append((usage, found))
            self._last_s = usage.time_s
            return found

    def _judge(self, usage: Usage, raw: tuple[QuotaFinding, ...]) -> tuple[QuotaFinding, ...]:
        now = usage.time_s
        unused = {_key(f, f.gpu_uuid) for f in raw if f.kind == "quota_unused"}
        grants: dict[_Key, _Track] = {}
        for grant in usage.grants:
            key = (grant.namespace, grant.pod, grant.container, grant.scheme, grant.gpu_uuid)
            track = grants[key] = self._grants.get(key) or _Track(first_seen_s=now)
            if key not in unused:
                track.last_used_s = now
        self._grants = grants
        over = {_key(f, f.gpu_uuid): self._over.get(_key(f, f.gpu_uuid), 0) + 1
                for f in raw if f.kind == "compute_over_quota"}
        self._over = over
        held: dict[_Key, tuple[QuotaFinding, int]] = {}
        for key, (last, calm) in self._held.items():
            if key not in over and calm + 1 < self.sustain_readings:
                held[key] = (last, calm + 1)
        found: list[QuotaFinding] = []
        for finding in raw:
            key = _key(finding, finding.gpu_uuid)
            if finding.kind == "compute_over_quota":
                if over[key] >= self.sustain_readings or key in self._held:
                    judged = replace(finding, text=f"{finding.text}, for {self.sustain_readings} readings or more")
                    held[key] = (judged, 0)
                    found.append(judged)
            elif finding.kind == "quota_unused":
                tracked = grants.get(key)
                idle_s = 0.0 if tracked is None else now - (
                    tracked.last_used_s if tracked.last_used_s is not None else tracked.first_seen_s)
                if idle_s >= self.unused_after_s:
                    found.append(replace(finding, text=f"{finding.text} for {idle_s / 60:.0f} min"))
            else:
                found.append(finding)
        found.extend(last for key, (last, calm) in held.items() if calm > 0)
        self._held = held
        return tuple(found)


def _key(finding: QuotaFinding, gpu: str | None) -> _Key:
    return (finding.namespace, finding.pod, finding.container, finding.scheme, gpu)


_JUDGES: WeakKeyDictionary[Store, QuotaJudge] = WeakKeyDictionary()


def watch(store: Store, judge: QuotaJudge | None = None) -> QuotaJudge:
    """Make ``judge`` (a new one by default) the store's quota judge, fed every snapshot appended from now on."""
    judge = judge if judge is not None else QuotaJudge()
    _JUDGES[store] = judge
    store.add_listener(judge)
    return judge


def store_findings(store: Store, snapshot: Snapshot | None) -> tuple[QuotaFinding, ...]:
    """The findings of ``snapshot`` of ``store``: its judge's, or one reading's alone where no judge watches (a
    replay, a bare store in a test)."""
    judge = _JUDGES.get(store)
    return judge.findings(snapshot) if judge is not None else snapshot_findings(snapshot)
