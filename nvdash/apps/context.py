"""What every app is built from: the shared store, the sampler's interval, and the history to look back in."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nvdash.history.query import HistoryBackend
from nvdash.live.stages import Staging
from nvdash.live.ticks import TickCache
from nvdash.store import Store

if TYPE_CHECKING:
    from nvdash.accounting.report import AccountingBook
    from nvdash.cluster import ClusterRuntime


@dataclass(frozen=True)
class AppContext:
    """The server's shared state handed to each app; ``interval_s`` is the per-document update period."""

    store: Store
    interval_s: float
    history: HistoryBackend | None = None
    """Past readings for the time range control; ``None`` when history is off."""
    history_executor: Executor | None = None
    """Where history queries run, off the event loop."""
    clock: Callable[[], float] = time.time
    """"Now" for relative ranges: the wall clock, or the end of the recording when replaying."""
    replay: bool = False
    """True when serving a recording: there are no live readings, the pages open on a past range."""
    past_only: bool = False
    """True for a page with no live readings of its own (the cluster's, read from Prometheus)."""
    cluster: ClusterRuntime | None = None
    """The cluster over Prometheus (``--prometheus``); ``None`` when not asked for."""
    accounting: AccountingBook | None = None
    """The accounting (jobs' GPU-hours and the allocations idle now); ``None``: not kept (tests)."""
    staging: Staging | None = None
    """On a server: heavy pages are built in stages once their viewer connects (see :mod:`nvdash.live.stages`),
    each turn under the server's guard; ``None``: all at once."""
    ticks: TickCache = field(default_factory=TickCache, compare=False)
    """Per-tick results shared by every session of a route (see :mod:`nvdash.live.ticks`)."""

    @property
    def live_readings(self) -> bool:
        """Whether the pages can stream live readings (not from a recording, not from Prometheus)."""
        return not (self.replay or self.past_only)
