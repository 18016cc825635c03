"""In a Bokeh server, every document that follows the store is updated by one ticker per store and period, not by a
periodic callback of its own; a paused or hidden page is skipped and catches up; a closed session is dropped."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.client import ClientSession, pull_session
from bokeh.document import Document
from bokeh.models import Div, Toggle
from bokeh.server.callbacks import PeriodicCallback
from bokeh.server.server import Server
from tornado.ioloop import IOLoop

from nvdash.apps.context import AppContext
from nvdash.live.follow import Follower, follow, pause_toggle
from nvdash.live.ticker import Ticker, tickers
from nvdash.live.visibility import hidden_flag
from nvdash.sampling.records import HostInfo, Inventory, Snapshot
from nvdash.store import Store
from tests.conftest import free_port, wait_for
from tests.server.bokeh_viewer import receive_until
from tests.unit.test_follower import _append as append

BATCH = 2


class Pages:
    """The server side: each session's document follows the store (batches of two) and shows its newest row."""

    def __init__(self) -> None:
        self.store = Store(Inventory(host=HostInfo("h", 1, 1)), capacity=1000)
        self.ctx = AppContext(store=self.store, interval_s=0.05)
        self.docs: list[weakref.ref[Document]] = []
        self.followers: list[weakref.ref[Follower]] = []
        self.received: dict[int, list[list[float]]] = {}
        self.pauses: list[weakref.ref[Toggle]] = []
        """Held weakly, as the documents: a model holds its document."""
        self.loop: IOLoop | None = None
        self.turns: list[str] = []
        """``rows`` when a document takes rows, ``turn`` when the loop ran what that document's update queued."""

    def make(self, doc: Document) -> None:
        index = len(self.docs)
        label = Div(text="none", name="label")
        pause = pause_toggle()
        got: list[list[float]] = []
        self.received[index] = got

        def on_rows(rows: Sequence[Snapshot]) -> None:
            got.append([row.time_s for row in rows])
            self.turns.append("rows")
            asyncio.get_running_loop().call_soon(self.turns.append, "turn")
            label.text = f"row {rows[-1].time_s:g}"

        doc.add_root(label)
        doc.add_root(pause)
        doc.add_root(hidden_flag(doc))
        follower = follow(doc, self.ctx, self.store.last_seq, on_rows, pause, batch=BATCH)
        self.docs.append(weakref.ref(doc))
        self.followers.append(weakref.ref(follower))
        self.pauses.append(weakref.ref(pause))

    def doc(self, index: int) -> Document:
        doc = self.docs[index]()
        assert doc is not None
        return doc

    def pause(self, index: int) -> Toggle:
        pause = self.pauses[index]()
        assert pause is not None
        return pause

    def on_server(self, index: int, call: Callable[[], None]) -> None:
        """Run ``call`` on a document, on the server's loop (as a browser's change would be)."""
        self.doc(index).add_next_tick_callback(call)

    def rows(self, index: int) -> list[float]:
        return [time_s for batch in list(self.received[index]) for time_s in batch]

    def append(self, count: int) -> None:
        """Append ``count`` rows on the server's loop, between two ticks (as one sampler's appends would be)."""
        assert self.loop is not None
        self.loop.add_callback(append, self.store, count)

    def ticker(self) -> Ticker | None:
        found = [ticker for ticker in tickers() if ticker.store is self.store]
        assert len(found) <= 1
        return found[0] if found else None


@contextmanager
def bokeh_server(pages: Pages) -> Iterator[str]:
    """A Bokeh server in a thread serving ``pages`` at ``/page``, discarding closed sessions within a second."""
    port = free_port()
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        loop = IOLoop.current()
        server = Server({"/page": Application(FunctionHandler(pages.make))}, io_loop=loop, port=port,
                        address="127.0.0.1", allow_websocket_origin=[f"127.0.0.1:{port}"],
                        unused_session_lifetime_milliseconds=300, check_unused_sessions_milliseconds=100)
        server.start()
        pages.loop = loop
        started.set()
        loop.start()
        server.stop()
        loop.close(all_fds=True)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert started.wait(30)
        yield f"http://127.0.0.1:{port}/page"
    finally:
        if pages.loop is not None:
            pages.loop.add_callback(pages.loop.stop)
        thread.join(30)


@contextmanager
def viewers(url: str, count: int) -> Iterator[list[ClientSession]]:
    sessions = [pull_session(url=url) for _ in range(count)]
    try:
        yield sessions
    finally:
        for session in sessions:
            session.close()




def ticks_pass(pages: Pages, count: int) -> None:
    """Wait until the ticker has ticked ``count`` more times."""
    ticker = pages.ticker()
    assert ticker is not None
    start = ticker.ticks
    wait_for(lambda: ticker.ticks, lambda ticks: ticks >= start + count)


def test_one_ticker_updates_every_document_with_the_same_batches() -> None:
    pages = Pages()
    append(pages.store, 3)
    with bokeh_server(pages) as url, viewers(url, 3) as sessions:
        ticker = wait_for(pages.ticker, lambda found: found is not None and len(found) == 3)
        assert ticker.running
        for index in range(3):
            assert not [callback for callback in pages.doc(index).session_callbacks
                        if isinstance(callback, PeriodicCallback)], "a document has a periodic callback of its own"
        pages.append(7)  # rows 4-10: batches end on even rows
        for index in range(3):
            wait_for(lambda index=index: pages.rows(index), lambda rows: rows[-1:] == [10.0])
        assert pages.received[0] == pages.received[1] == pages.received[2]
        # The three updates came from one tick, yet the loop had a turn after each: never two in one turn.
        assert pages.turns == ["rows", "turn"] * 3
        assert pages.rows(0) == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
        assert all(len(batch) % BATCH == 0 for batch in pages.received[0][1:])
        (label,) = sessions[2].document.select({"name": "label"})
        receive_until(sessions[2], lambda: label.text == "row 10")
        ticks_pass(pages, 3)
        assert pages.rows(0)[-1] == 10.0  # row 11 is not there; nothing is handed on twice
        assert len(pages.rows(0)) == 7


def test_a_paused_or_hidden_page_is_skipped_and_catches_up() -> None:
    pages = Pages()
    with bokeh_server(pages) as url, viewers(url, 3):
        ticker = wait_for(pages.ticker, lambda found: found is not None and len(found) == 3)
        hidden = hidden_flag(pages.doc(2))
        pages.on_server(1, lambda: setattr(pages.pause(1), "active", True))
        pages.on_server(2, lambda: setattr(hidden, "disabled", True))
        wait_for(lambda: (pages.pause(1).active, hidden.disabled), lambda state: state == (True, True))
        updates = ticker.updates
        pages.append(6)
        wait_for(lambda: pages.rows(0), lambda rows: rows[-1:] == [6.0])
        ticks_pass(pages, 3)
        assert pages.rows(1) == pages.rows(2) == []
        assert ticker.updates - updates <= 3  # only the page that can take them was given updates
        pages.on_server(1, lambda: setattr(pages.pause(1), "active", False))
        pages.on_server(2, lambda: setattr(hidden, "disabled", False))
        for index in (1, 2):
            wait_for(lambda index=index: pages.received[index], lambda got: got == [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
        pages.append(2)
        for index in (0, 1, 2):
            wait_for(lambda index=index: pages.rows(index), lambda rows: rows[-1:] == [8.0])
        assert pages.received[1][-1] == pages.received[2][-1] == [7.0, 8.0]


def test_a_closed_session_is_dropped_and_its_document_collected() -> None:
    pages = Pages()
    with bokeh_server(pages) as url:
        with viewers(url, 2) as sessions:
            ticker = wait_for(pages.ticker, lambda found: found is not None and len(found) == 2)
            sessions[0].close()
            wait_for(lambda: len(ticker), lambda count: count == 1)
            assert pages.docs[1]() in ticker
            pages.append(2)
            wait_for(lambda: pages.rows(1), lambda rows: rows == [1.0, 2.0])

        def collected() -> list[bool]:
            gc.collect()
            return [ref() is None for ref in [*pages.docs, *pages.followers]]

        wait_for(collected, all)
        wait_for(pages.ticker, lambda found: found is None)  # the last one gone: no ticker left running
        assert not ticker.running
