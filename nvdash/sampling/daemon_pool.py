"""A fixed pool of daemon worker threads, optionally supervised.

The standard ``ThreadPoolExecutor`` joins its workers when the interpreter exits, so one NVML call (or one query
on a stalled disk) that never returns would keep the process alive after Ctrl+C. These workers are daemons: the
process exits regardless.

Started with a :class:`~nvdash.supervision.Supervisor`, each worker runs under it (a death is logged, counted and
the worker restarted) and beats after each call and at least once per ``expect_every_s`` while idle, so a worker
stuck in one call shows as overdue on ``/health``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from nvdash.supervision import Supervisor

T = TypeVar("T")
P = ParamSpec("P")

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonPool(Executor):
    """Runs submitted calls on ``workers`` daemon threads; :meth:`shutdown` never waits for a running call.

    ``start=False`` creates the pool without threads, for :meth:`start` to start them supervised; a call
    submitted before that starts them unsupervised.
    """

    def __init__(self, workers: int, name: str = "worker", *, start: bool = True) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self._workers = workers
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._started = False
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        if start:
            self.start()

    @property
    def names(self) -> list[str]:
        """The workers' thread names."""
        return [f"{self._name}-{index}" for index in range(self._workers)]

    def start(self, supervisor: Supervisor | None = None, *, expect_every_s: float | None = None,
              on_start: Callable[[], None] | None = None) -> None:
        """Start the workers (once): under ``supervisor`` when given, each first running ``on_start`` (a warm-up:
        opening a connection, say; an exception from it is a death, the worker restarted)."""
        with self._start_lock:
            if self._started or self._closed:
                return
            self._started = True
        for name in self.names:
            if supervisor is None:
                thread = threading.Thread(target=self._work, args=(name, None, None, on_start), name=name,
                                          daemon=True)
                thread.start()
            else:
                def run(name: str = name, watcher: Supervisor = supervisor) -> None:
                    self._work(name, watcher, expect_every_s, on_start)

                thread = supervisor.spawn(name, run, self._stop, expect_every_s=expect_every_s)
            self._threads.append(thread)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Schedule ``fn(*args, **kwargs)``; its result or exception arrives in the returned future."""
        if self._closed:
            raise RuntimeError("the pool is shut down")
        if not self._started:
            self.start()
        future: Future[T] = Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """Cancel queued calls (unless ``cancel_futures`` is False) and let idle workers end; running calls
        finish (or not) on their own. ``wait``: join the workers, i.e. wait for the running calls."""
        self._closed = True
        self._stop.set()
        if cancel_futures:
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        for _ in range(self._workers):
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self, name: str, supervisor: Supervisor | None, beat_every_s: float | None,
              on_start: Callable[[], None] | None) -> None:
        if on_start is not None:
            on_start()
        if supervisor is not None:
            supervisor.beat(name)
        while True:
            try:
                job = self._jobs.get(timeout=beat_every_s)
            except queue.Empty:
                if supervisor is not None:
                    supervisor.beat(name)
                continue
            if job is None:
                return
            future, fn, args, kwargs = job
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as error:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            if supervisor is not None:
                supervisor.beat(name)
