"""The simulation's stuck sampler: a host reading that hangs (the ``hang_host`` fault).

The sweeps call NVML through a pool with a deadline, so no simulated NVML call can stall them; the host reading runs
on the sampler's own thread, as a real ``/proc`` or ``/sys`` read that never returns would. This wrapper blocks it
while the fault's file exists (from the fault's time on), so a test can stop and resume a real server's sweeps.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from nvdash.sampling.fake.faults import Fault
from nvdash.sampling.records import HostInfo, HostSample

POLL_S = 0.05
"""How often a hung reading looks whether the file that holds it is gone."""


class HostReader(Protocol):
    """The host source (``HostSource``)."""

    def info(self) -> HostInfo: ...

    def read(self) -> HostSample: ...


class HangingHost:
    """``host``, whose :meth:`read` blocks while a due ``hang_host`` fault's file exists."""

    def __init__(self, host: HostReader, hangs: Sequence[Fault], created_at: float,
                 clock: Callable[[], float] = time.time, exists: Callable[[str], bool] = os.path.exists) -> None:
        self._host = host
        self._hangs = [hang for hang in hangs if hang.kind == "hang_host" and hang.path]
        self._created_at = created_at
        self._clock = clock
        self._exists = exists
        self._wake = threading.Event()

    def info(self) -> HostInfo:
        """The host's facts (never hangs)."""
        return self._host.info()

    def read(self) -> HostSample:
        """The host's reading, once no due hang's file exists."""
        for hang in self._hangs:
            if self._clock() - self._created_at < hang.at_s or hang.path is None:
                continue
            while self._exists(hang.path):
                self._wake.wait(POLL_S)
        return self._host.read()
