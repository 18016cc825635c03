"""A supervised thread that asks Prometheus in rounds while a page wants its answer, and sleeps when none has for a
while: what the cluster poller (every 5 s) and the fleet's day (every 60 s) share."""

from __future__ import annotations

import threading
import time

from nvdash.cluster.promapi import PrometheusClient
from nvdash.supervision import Supervisor

IDLE_PAUSE_S = 5.0
"""The longest a sleeping round waits before beating (and looking again whether a page wants it)."""


class PageRounds:
    """Calls :meth:`refresh` every ``refresh_s`` on its own thread while a page called :meth:`want` within
    ``idle_after_s``; :meth:`wake` starts a round at once."""

    thread_name = "nvdash-rounds"

    def __init__(self, client: PrometheusClient, refresh_s: float, idle_after_s: float,
                 supervisor: Supervisor | None) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self.idle_after_s = idle_after_s
        self.supervisor = supervisor if supervisor is not None else Supervisor()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._wanted_at = -float("inf")
        self._thread: threading.Thread | None = None

    def refresh(self) -> object:
        """One round (the subclass's queries)."""
        raise NotImplementedError

    def want(self) -> None:
        """A page shows the answer: keep refreshing (and start now if the thread was sleeping)."""
        sleeping = time.monotonic() - self._wanted_at > self.idle_after_s
        self._wanted_at = time.monotonic()
        if sleeping:
            self._wake.set()

    def wake(self) -> None:
        """Start the next round now."""
        self._wake.set()

    def start(self) -> None:
        """Start the thread (it sleeps until a page wants the answer)."""
        if self._thread is None:
            # A round lasts at most a refresh's deadline plus the pause; sleeping, the thread beats every pause.
            self._thread = self.supervisor.spawn(self.thread_name, self._run, self._stop,
                                                 expect_every_s=self.refresh_s + self.client.timeout_s)

    def stop(self) -> None:
        """Stop the thread (a query in flight ends within the client's timeout)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout_s + 1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._wanted_at > self.idle_after_s:
                if self._wake.wait(min(self.refresh_s, IDLE_PAUSE_S)):
                    self._wake.clear()
                self.supervisor.beat(self.thread_name)
                continue
            self.refresh()
            self.supervisor.beat(self.thread_name)
            if self._wake.wait(self.refresh_s):  # woken for a round now (or stopping)
                self._wake.clear()
