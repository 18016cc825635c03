"""A supervised thread that asks the kubelet for pod resources every few seconds and keeps the latest answer."""

from __future__ import annotations

import threading
from typing import Protocol

from nvdash.sampling.usage_records import PodResources
from nvdash.supervision import Supervisor

WAITING = PodResources(status="Asking the kubelet for pod resources...")
THREAD_NAME = "nvdash-kubelet"


class PodLister(Protocol):
    """What the watcher needs of a client (:class:`~nvdash.sampling.kubelet.podresources.PodResourcesClient`)."""

    def list(self) -> PodResources: ...


class PodResourcesWatcher:
    """Calls ``client.list()`` every ``interval_s`` from its own thread; :meth:`latest` never blocks.

    The thread runs under ``supervisor`` and beats after each answer (a call that hangs past the client's deadline
    shows as overdue).
    """

    def __init__(self, client: PodLister, interval_s: float = 10.0, *, supervisor: Supervisor | None = None,
                 expect_every_s: float | None = None) -> None:
        """``expect_every_s``: how often an answer is due at most (default: the interval plus 10 s for the call)."""
        self._client = client
        self._interval_s = interval_s
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._expect_every_s = expect_every_s if expect_every_s is not None else interval_s + 10.0
        self._latest = WAITING
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> PodResources:
        """The last answer, or :data:`WAITING` before the first."""
        with self._lock:
            return self._latest

    def refresh(self) -> PodResources:
        """Ask now, from the caller's thread (blocks up to the client's deadline); returns and keeps the answer."""
        try:
            answer = self._client.list()
        except Exception as error:
            answer = PodResources(status=f"The kubelet pod-resources lookup failed: {type(error).__name__}: {error}")
        with self._lock:
            self._latest = answer
        return answer

    def start(self) -> None:
        """Start the thread (once); the first question goes out at once."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = self._supervisor.spawn(THREAD_NAME, self._run, self._stop, expect_every_s=self._expect_every_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, waiting up to ``timeout_s`` for a call in flight to end."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._supervisor.beat(THREAD_NAME)
            self._stop.wait(self._interval_s)
