"""A fixed pool of daemon worker threads.

The standard ``ThreadPoolExecutor`` joins its workers when the interpreter exits, so one NVML call that never
returns would keep the process alive after Ctrl+C. These workers are daemons: the process exits regardless.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class DaemonPool:
    """Runs submitted calls on ``workers`` daemon threads; :meth:`shutdown` never waits for a running call."""

    def __init__(self, workers: int, name: str = "worker") -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Schedule ``fn(*args)``; its result or exception arrives in the returned future."""
        if self._closed:
            raise RuntimeError("the pool is shut down")
        future: Future[T] = Future()
        self._jobs.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """Cancel queued calls and let idle workers end; running calls finish (or not) on their own."""
        self._closed = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as error:
                future.set_exception(error)
            else:
                future.set_result(result)
