"""One periodic callback per store and period for every document that follows the store, not one per document.

A document's own periodic callback runs under its session's lock at every tick, and before doing anything reads its
pause button, its hidden flag and its viewers' sockets (an ``ioctl`` each), also on the ticks where a page redrawn
once a second has nothing to send. With many viewers those callbacks, all due at once, held the event loop for the
sum of their work (``benchmarks/viewers.py``, profiled with py-spy at 10 viewers of every dashboard).

A :class:`Ticker` reads the store's newest sequence number once per tick and asks each document's followers whether
they have a whole batch of new rows (arithmetic only: the tick walks every followed document in one turn). The
documents that have are then taken one per turn of the loop: one that is hidden or whose viewers are not ready for
more (a socket ``ioctl`` each) is skipped until a later tick, the others get their update as a next-tick callback
of their own (so Bokeh's document lock is taken only by sessions with work). Between two sessions' checks and
updates the loop serves sockets and timers, so a tick's burst holds the loop for one session at a time, not for
all of them.

A document is dropped when its session is destroyed. Outside a Bokeh server (tests, benchmarks) documents keep a
periodic callback of their own (:func:`nvdash.live.follow.follow`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Literal, Protocol

from bokeh.document import Document
from tornado.ioloop import IOLoop, PeriodicCallback

from nvdash.live.backpressure import viewers_ready
from nvdash.live.visibility import hidden_flag
from nvdash.store import Store

log = logging.getLogger(__name__)


class Due(Protocol):
    """What a ticker asks of a follower (:class:`nvdash.live.follow.Follower` is one)."""

    @property
    def doc(self) -> Document | None: ...

    def due(self, last_seq: int) -> bool:
        """Whether it has rows to hand on once the store's newest row is ``last_seq`` (and it is not paused)."""
        ...

    def apply(self, last_seq: int) -> None:
        """Hand on its new rows up to ``last_seq`` (on the document's lock); its document's viewers were found
        ready."""
        ...


SessionState = Literal["building", "live", "gone"]


def session_state(doc: Document) -> SessionState:
    """Where ``doc``'s Bokeh session is: not made yet (the page is being built), live, or destroyed (its document
    then has no session context)."""
    context = doc.session_context
    if context is None:
        return "gone"
    session = getattr(context, "session", None)
    if session is None:
        return "building"
    return "gone" if getattr(session, "destroyed", False) else "live"


class Ticker:
    """One periodic callback, every ``period_ms`` on ``loop``, updating the documents that follow ``store``.

    Runs on the server's event loop only (so it needs no lock). Started by the first follower registered, stopped
    (and ``on_empty`` called) when the last document is dropped.
    """

    def __init__(self, store: Store, period_ms: int, loop: IOLoop,
                 on_empty: Callable[[Ticker], None] | None = None) -> None:
        self.store = store
        self.period_ms = period_ms
        self.loop = loop
        self.on_empty = on_empty
        self._docs: dict[Document, list[Due]] = {}
        self._waiting: deque[Document] = deque()
        self._scheduled: dict[Document, int] = {}
        """Documents whose update waits for its turn, and the store's newest row at the tick that found it."""
        self._dispatching = False
        self._callback = PeriodicCallback(self.tick, period_ms)
        self.ticks = 0
        self.updates = 0
        """Documents' updates scheduled so far (next-tick callbacks handed to Bokeh)."""

    def __len__(self) -> int:
        """Documents followed now."""
        return len(self._docs)

    def __contains__(self, doc: object) -> bool:
        return doc in self._docs

    @property
    def running(self) -> bool:
        return self._callback.is_running()

    def register(self, follower: Due) -> None:
        """Follow ``follower``'s document (which must be a server session's) with the others; dropped when its
        session is destroyed."""
        doc = follower.doc
        if doc is None:
            raise ValueError("a ticker follows documents: the follower has none")
        followers = self._docs.get(doc)
        if followers is None:
            followers = self._docs[doc] = []
            doc.on_session_destroyed(partial(self._destroyed, doc))
        followers.append(follower)
        if not self._callback.is_running():
            self._callback.start()

    def _destroyed(self, doc: Document, _context: object) -> None:
        self.drop(doc)

    def drop(self, doc: Document) -> None:
        """Stop following ``doc``; the last one stops the ticker."""
        self._docs.pop(doc, None)
        self._scheduled.pop(doc, None)
        if not self._docs:
            self._callback.stop()
            self._waiting.clear()
            if self.on_empty is not None:
                self.on_empty(self)

    def tick(self) -> None:
        """Find the documents with work (store read once) and hand their updates to the loop, one per turn."""
        self.ticks += 1
        last = self.store.last_seq
        for doc, followers in list(self._docs.items()):
            if doc in self._scheduled:
                continue  # its update of an earlier tick has not run yet: it will take these rows too
            try:
                wanted = self._wanted(doc, followers, last)
            except Exception:
                log.exception("a document could not be checked for updates; it is no longer followed")
                wanted = None
            if wanted is None:
                self.drop(doc)
            elif wanted:
                self._scheduled[doc] = last
                self._waiting.append(doc)
        if self._waiting and not self._dispatching:
            self._dispatching = True
            self._dispatch()

    @staticmethod
    def _wanted(doc: Document, followers: list[Due], last: int) -> bool | None:
        """Whether ``doc`` takes an update now; ``None`` once its session is gone."""
        state = session_state(doc)
        if state == "gone":
            return None
        return state == "live" and any(follower.due(last) for follower in followers)

    def _dispatch(self) -> None:
        """Schedule the next waiting document's update, and this again at the next turn while more wait."""
        try:
            while self._waiting:
                doc = self._waiting.popleft()
                if doc not in self._scheduled:
                    continue  # dropped meanwhile
                if session_state(doc) != "live":
                    self.drop(doc)  # destroyed meanwhile: its callbacks are gone
                    continue
                try:
                    ready = not hidden_flag(doc).disabled and viewers_ready(doc)
                except Exception:
                    log.exception("a document could not be checked for updates; it is no longer followed")
                    self.drop(doc)
                    continue
                if not ready:
                    self._scheduled.pop(doc, None)  # its rows wait in the store for a tick that finds it ready
                    break  # the next document's check in the next turn
                try:
                    doc.add_next_tick_callback(partial(self._apply, doc))
                except Exception:
                    log.exception("a document's update could not be scheduled; it is no longer followed")
                    self.drop(doc)
                    continue
                self.updates += 1
                break
        finally:
            if self._waiting:
                self.loop.add_callback(self._dispatch)
            else:
                self._dispatching = False

    def _apply(self, doc: Document) -> None:
        """A document's update, on its lock: each follower hands on its whole batches (unless paused or hidden
        meanwhile)."""
        last = self._scheduled.pop(doc, None)
        followers = self._docs.get(doc)
        if last is None or followers is None or hidden_flag(doc).disabled:
            return
        for follower in list(followers):
            follower.apply(last)


_TICKERS: dict[tuple[int, int, IOLoop], Ticker] = {}
"""The running tickers, by store (its id: the ticker holds the store while it is here), period and loop."""


def ticker(store: Store, period_ms: int, loop: IOLoop | None = None) -> Ticker:
    """The ticker of ``store`` at ``period_ms`` on ``loop`` (the current one by default), made when first asked
    for; it forgets itself when its last document is dropped."""
    loop = IOLoop.current() if loop is None else loop
    key = (id(store), period_ms, loop)
    found = _TICKERS.get(key)
    if found is None or found.store is not store:
        found = _TICKERS[key] = Ticker(store, period_ms, loop, on_empty=partial(_forget, key))
    return found


def tickers() -> list[Ticker]:
    """The tickers now running (for tests and diagnostics)."""
    return list(_TICKERS.values())


def _forget(key: tuple[int, int, IOLoop], done: Ticker) -> None:
    if _TICKERS.get(key) is done:
        del _TICKERS[key]
