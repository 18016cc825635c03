"""Reading what a viewer of a dashboard receives, through bokeh.client."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from bokeh.client import ClientSession, pull_session
from bokeh.models import ColumnDataSource, GridPlot

from nvdash.live.stages import PENDING_NAME
from tests.conftest import wait_for


def open_session(url: str, route: str) -> ClientSession:
    """A client session on ``route``, as a browser tab would open it, once the whole page has arrived.

    Pages are built in stages after the document is pulled (``nvdash.live.stages``): a timeline grid gets its
    merged toolbar with the last stage, a part made later fills its empty place.
    """
    session = pull_session(url=url + route)

    def built() -> bool:
        pending = list(session.document.select({"name": PENDING_NAME}))
        if all(len(grid.toolbar.tools) for grid in session.document.select({"type": GridPlot})) and not pending:
            return True
        receive_for(session, 0.1)  # only a live page: a static one sends nothing that would end this
        return False

    wait_for(built, bool, timeout_s=60)
    return session


def receive_for(session: ClientSession, seconds: float) -> None:
    """Let the session apply what the server pushes for ``seconds`` (at least one message).

    bokeh.client applies incoming messages only while its connection's loop runs; its public calls run it
    just until their own reply arrives, so this drives it by time.
    """
    end = time.monotonic() + seconds
    session._connection._loop_until(lambda: time.monotonic() >= end)


class Viewer(threading.Thread):
    """A viewer in a thread of its own: a session on one route that keeps applying the server's updates."""

    def __init__(self, url: str, route: str) -> None:
        super().__init__(daemon=True, name=f"viewer{route}")
        self._url = url + route
        self._stop_requested = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._loop: Any = None

    def run(self) -> None:
        try:
            session = pull_session(url=self._url)
        except BaseException as error:  # reported to the test through .error
            self.error = error
            self.ready.set()
            return
        self._loop = session._connection._loop
        self.ready.set()
        try:
            # Each applied message nests bokeh.client's loop one call deeper: run it in slices.
            while not self._stop_requested.is_set():
                end = time.monotonic() + 5.0
                session._connection._loop_until(
                    lambda end=end: self._stop_requested.is_set() or time.monotonic() >= end
                )
        finally:
            session.close()

    def request_stop(self) -> None:
        """Ask the viewer to close its session (without waiting); a static page sends no update to wake it,
        so its client loop is stopped from here (tornado's ``add_callback`` is thread-safe)."""
        self._stop_requested.set()
        loop = self._loop
        if loop is not None:
            loop.add_callback(loop.stop)

    def stop(self) -> None:
        """Ask the viewer to close its session, and wait for it."""
        self.request_stop()
        self.join(30)


def stop_all(viewers: list[Viewer]) -> None:
    """Stop many viewers at once: ask them all first, then wait for each."""
    for viewer in viewers:
        viewer.request_stop()
    for viewer in viewers:
        viewer.join(30)


def source_data(session: ClientSession) -> list[dict[str, list[Any]]]:
    """Every ColumnDataSource of the session's document, columns as plain lists, in a stable order."""
    sources = sorted(session.document.select({"type": ColumnDataSource}), key=lambda s: s.id)
    return [{name: list(values) for name, values in source.data.items()} for source in sources]


def fingerprint(data: list[dict[str, list[Any]]]) -> str:
    """A comparable text of the data with NaN made equal to itself."""

    def norm(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        return value

    return repr([{k: [norm(v) for v in vs] for k, vs in sorted(d.items())} for d in data])


def numeric_columns(data: list[dict[str, list[Any]]]) -> dict[str, list[float]]:
    """All numeric columns of all sources, keyed ``"<source index>.<column>"``."""
    out: dict[str, list[float]] = {}
    for i, columns in enumerate(data):
        for name, values in columns.items():
            if values and all(isinstance(v, (int, float)) for v in values):
                out[f"{i}.{name}"] = [float(v) for v in values]
    return out


def receive_until(session: ClientSession, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Apply the server's messages until ``condition`` holds (checked before each message is awaited); fails
    after ``timeout_s``. The page sends nothing unasked, so a time-driven wait would wait for a next message."""
    connection = session._connection
    stop = threading.Timer(timeout_s, lambda: connection._loop.add_callback(connection._loop.stop))
    stop.start()
    try:
        connection._loop_until(condition)
    finally:
        stop.cancel()
    assert condition(), f"not seen within {timeout_s} s"
