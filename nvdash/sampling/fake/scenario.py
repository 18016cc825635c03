"""Health counters of the fake GPUs at any time: the profile's scenario plus XIDs injected at run time.

Every counter is a step function of time (seconds after the library was created), so reading it never
depends on how often it was read. The events a real driver would send with each change (XIDs, ECC
events) come from the same timeline, so a counter and its event always agree.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass

from . import constants as c
from .profiles import Profile

_UNCORRECTED_XIDS = frozenset({c.XID_DOUBLE_BIT_ECC, c.XID_CONTAINED_ECC, c.XID_UNCONTAINED_ECC})
_SCENARIO_XIDS = (
    (0.0, c.XID_DOUBLE_BIT_ECC),
    (0.001, c.XID_CONTAINED_ECC),
    (0.002, c.XID_ROW_REMAP_RECORDED),
)
"""One uncorrectable DRAM error on Ampere and later: the DBE, its containment, the row remap recorded."""
_DOWN_LINK_RECOVERY_ERRORS = 3
_CRC_BASE_ERRORS = 2
_CRC_DATA_SHARE = 0.25
"""CRC errors in data flits, per CRC error in any flit (header or data), on a link that counts them."""


@dataclass(frozen=True, order=True)
class Event:
    """An event a real driver queues for event sets: ``data`` is the XID for XID events, else 0."""

    t: float
    device: int
    event_type: int
    data: int = 0


def _wobbly_count(per_min: float, t: float, wobble_s: float) -> int:
    """A monotonic counter with ``per_min`` increments a minute, irregularly spaced."""
    if per_min <= 0 or t <= 0:
        return 0
    rate = per_min / 60.0
    amplitude = min(1.5, 0.9 * rate * wobble_s)
    return max(0, math.floor(rate * t + amplitude * math.sin(t / wobble_s)))


class Health:
    """Counters and events of every GPU of ``profile``; ``inject`` adds XIDs (and their side effects)."""

    def __init__(self, profile: Profile, seed: int, created_at: float) -> None:
        self.profile = profile
        self._created_at = created_at
        self._lock = threading.Lock()
        self._injected: list[tuple[float, int, int]] = []
        rng = random.Random(f"health:{profile.name}:{seed}")
        self._page_addresses = [rng.randrange(0x10000, 0x3C0000) for _ in range(64)]
        self._history_age_s = [rng.uniform(5 * 86400, 200 * 86400) for _ in range(profile.gpu_count)]

    # Injection

    def inject(self, device: int, xid: int, t: float) -> list[Event]:
        """Record XID ``xid`` on ``device`` at ``t``; the events a driver would queue for it."""
        with self._lock:
            self._injected.append((t, device, xid))
        events = [Event(t, device, c.NVML_EVENT_TYPE_XID_CRITICAL_ERROR, xid)]
        if xid in _UNCORRECTED_XIDS:
            events.append(Event(t, device, c.NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR))
        return events

    def _xids(self, device: int, t: float) -> list[int]:
        with self._lock:
            return [xid for when, gpu, xid in self._injected if gpu == device and when <= t]

    # Scenario

    def _correctable(self, gpu: int, t: float) -> int:
        schedule = self.profile.scenario.correctable(gpu)
        if schedule is None or t < schedule[0]:
            return 0
        first, every = schedule
        return math.floor((t - first) / every) + 1

    def _uncorrectable_due(self, gpu: int, t: float, delay: float = 0.0) -> bool:
        at = self.profile.scenario.uncorrectable(gpu)
        return at is not None and t >= at + delay

    def scenario_events(self, t0: float, t1: float) -> list[Event]:
        """The scenario's events with ``t0 <= t < t1``, in time order."""
        events: list[Event] = []
        scenario = self.profile.scenario
        for gpu in range(self.profile.gpu_count):
            schedule = scenario.correctable(gpu)
            if schedule is not None:
                first, every = schedule
                k = max(0, math.ceil((t0 - first) / every))
                while first + k * every < t1:
                    events.append(Event(first + k * every, gpu, c.NVML_EVENT_TYPE_SINGLE_BIT_ECC_ERROR))
                    k += 1
            at = scenario.uncorrectable(gpu)
            if at is None:
                continue
            if t0 <= at < t1:
                events.append(Event(at, gpu, c.NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR))
            for delay, xid in _SCENARIO_XIDS:
                if t0 <= at + delay < t1:
                    events.append(Event(at + delay, gpu, c.NVML_EVENT_TYPE_XID_CRITICAL_ERROR, xid))
        return sorted(events)

    # Readings

    def ecc_errors(self, gpu: int, *, uncorrected: bool, aggregate: bool, t: float) -> int:
        """Total DRAM ECC errors: volatile since driver load, aggregate over the board's life."""
        history_corrected, history_uncorrected = self.profile.scenario.history(gpu)
        if uncorrected:
            count = int(self._uncorrectable_due(gpu, t))
            count += sum(1 for xid in self._xids(gpu, t) if xid in _UNCORRECTED_XIDS)
            return count + (history_uncorrected if aggregate else 0)
        return self._correctable(gpu, t) + (history_corrected if aggregate else 0)

    def remapped_rows(self, gpu: int, t: float) -> tuple[int, int, bool, bool]:
        """(rows remapped for correctable errors, for uncorrectable errors, remap pending, a remap failed)."""
        xids = self._xids(gpu, t)
        scenario_remap = self._uncorrectable_due(gpu, t, _SCENARIO_XIDS[-1][0])
        uncorrectable = int(scenario_remap) + xids.count(c.XID_ROW_REMAP_RECORDED)
        failed = c.XID_ROW_REMAP_FAILURE in xids
        return self.profile.scenario.remapped_before(gpu), uncorrectable, uncorrectable > 0, failed

    def retired_pages(self, gpu: int, cause: int, t: float) -> list[tuple[int, int]]:
        """(page address, retirement time in s since the epoch) of the pages retired for ``cause``."""
        if cause == c.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            count = self.profile.scenario.retired_sbe(gpu)
            retired_at = int(self._created_at - self._history_age_s[gpu])
            return [(self._page_addresses[i], retired_at + 3600 * i) for i in range(count)]
        with self._lock:
            recorded = [
                when
                for when, device, xid in self._injected
                if device == gpu and xid == c.XID_ROW_REMAP_RECORDED and when <= t
            ]
        offset = 32
        return [(self._page_addresses[offset + i], int(self._created_at + when)) for i, when in enumerate(recorded)]

    def retirement_pending(self, gpu: int, t: float) -> bool:
        """Whether a retired page waits for the next driver load (every DBE retirement does)."""
        return bool(self.retired_pages(gpu, c.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, t))

    def pcie_replays(self, gpu: int, t: float) -> int:
        """PCIe replays since the counter was last reset."""
        return _wobbly_count(self.profile.scenario.replays_per_min(gpu), t, 9.0)

    def nvlink_active(self, gpu: int, link: int) -> bool:
        """Whether ``link`` of ``gpu`` is up."""
        return self.profile.scenario.link_down(gpu) != link

    def nvlink_errors(self, gpu: int, link: int, counter: int, t: float) -> int:
        """One ``nvmlNvLinkErrorCounter_t`` counter of one link.

        A down link has its recovery attempts; a noisy link counts CRC flit errors and, fewer, CRC data errors,
        and the receiver asks for a replay after each CRC error (the replay count is their sum).
        """
        if not self.nvlink_active(gpu, link):
            return _DOWN_LINK_RECOVERY_ERRORS if counter == c.NVML_NVLINK_ERROR_DL_RECOVERY else 0
        crc = self.profile.scenario.link_crc(gpu)
        if crc is None or crc[0] != link:
            return 0
        flit = _CRC_BASE_ERRORS + _wobbly_count(crc[1], t, 11.0)
        data = _wobbly_count(crc[1] * _CRC_DATA_SHARE, t, 17.0)
        if counter == c.NVML_NVLINK_ERROR_DL_CRC_FLIT:
            return flit
        if counter == c.NVML_NVLINK_ERROR_DL_CRC_DATA:
            return data
        if counter == c.NVML_NVLINK_ERROR_DL_REPLAY:
            return flit + data
        return 0
