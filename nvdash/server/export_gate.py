"""How many ``/export.csv`` answers run at once, and where: their own thread, never the query threads.

An export of a week reads and formats every reading; four at once on the query threads made a page's 1 h query
wait 46 s. So exports take turns on one thread of their own (a semaphore), a few more wait in line, and one past
the line is turned away with 503 and ``Retry-After`` instead of queueing without end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TypeVar

from tornado.ioloop import IOLoop

T = TypeVar("T")

EXPORTS_AT_ONCE = 1
"""Exports that read the file at the same time."""
EXPORTS_WAITING = 8
"""Exports that may wait for their turn; the next one is answered 503."""
RETRY_AFTER_S = 10
"""The ``Retry-After`` of a turned-away export."""


class ExportBusy(Exception):
    """Too many exports are running or waiting; the message is one line."""


class ExportGate:
    """One thread and a turn for each export (see the module's docstring)."""

    def __init__(self, at_once: int = EXPORTS_AT_ONCE, waiting: int = EXPORTS_WAITING) -> None:
        self._at_once = at_once
        self._limit = at_once + waiting
        self._semaphore = asyncio.Semaphore(at_once)
        self._executor: ThreadPoolExecutor | None = None
        self.admitted = 0
        """Exports running or waiting now."""

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for this export's turn; raises :class:`ExportBusy` at once when the line is full."""
        if self.admitted >= self._limit:
            raise ExportBusy(f"{self.admitted} exports are running or waiting; try again in {RETRY_AFTER_S} s")
        self.admitted += 1
        try:
            async with self._semaphore:
                yield
        finally:
            self.admitted -= 1

    async def run(self, function: Callable[[], T]) -> T:
        """``function()`` on the exports' thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._at_once, thread_name_prefix="nvdash-export")
        return await IOLoop.current().run_in_executor(self._executor, function)

    def close(self) -> None:
        """Stop the exports' thread (an export under way ends with its connection)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
