"""Live updates: each document reads only the store's new rows and hands them on, at every tick of its server's
:class:`~nvdash.live.ticker.Ticker` (one periodic callback for all documents), or of its own periodic callback
outside a server."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import numpy as np
from bokeh.document import Document
from bokeh.models import ColumnDataSource
from bokeh.models.widgets import Toggle

from nvdash.live.backpressure import viewers_ready
from nvdash.live.ticker import ticker
from nvdash.live.ticks import TickCache
from nvdash.live.visibility import hidden_flag
from nvdash.sampling.records import Snapshot
from nvdash.store import Store

RowsHandler = Callable[[Sequence[Snapshot]], None]


class LiveContext(Protocol):
    """What following the store needs of a dashboard's context (``nvdash.apps.AppContext`` is one): this package
    sits below the dashboards and does not import them."""

    @property
    def store(self) -> Store: ...

    @property
    def interval_s(self) -> float: ...

    @property
    def ticks(self) -> TickCache: ...


PAUSE_LABEL = "Pause"
RESUME_LABEL = "Resume"


class Follower:
    """Remembers the last sequence number a document has seen and hands on what came after it.

    While ``pause`` is active nothing is read; the store keeps the rows, so resuming catches up. So it is while
    ``doc`` has no viewer that takes updates (:func:`~nvdash.live.backpressure.viewers_ready`) and while nobody can
    see it (:mod:`nvdash.live.visibility`).

    With ``batch`` > 1 rows are handed on ``batch`` at a time, up to a sequence number that is a multiple of
    ``batch``: every session of a route then hands on the very same rows (their columns are computed once, see
    :mod:`nvdash.live.ticks`). Catching up after a pause or when seen again hands on everything at once.
    """

    def __init__(self, store: Store, seq: int, on_rows: RowsHandler, pause: Toggle | None = None,
                 doc: Document | None = None, *, batch: int = 1) -> None:
        self.store = store
        self.seq = seq
        self.on_rows = on_rows
        self.pause = pause
        self.doc = doc
        self.batch = max(1, batch)

    def poll(self) -> None:
        """Push the rows newer than the last seen (a whole batch of them); nothing when paused or nothing is new."""
        self._poll(whole_batches=True)

    def due(self, last_seq: int) -> bool:
        """Whether a poll would hand on rows, the store's newest being ``last_seq``, were the viewers ready and the
        page seen: not paused, and a whole batch is new."""
        if self.pause is not None and self.pause.active:
            return False
        return self._boundary(last_seq) > self.seq

    def apply(self, last_seq: int) -> None:
        """A poll for a document whose viewers were found ready by its :class:`~nvdash.live.ticker.Ticker`, at
        the tick that saw ``last_seq`` as the store's newest row: rows up to that tick's boundary, so every session
        updated from one tick hands on the very same rows, however late its turn comes."""
        self._poll(whole_batches=True, check_viewers=False, upto=last_seq)

    def _boundary(self, last_seq: int) -> int:
        return last_seq - last_seq % self.batch

    def _poll(self, whole_batches: bool, check_viewers: bool = True, upto: int | None = None) -> None:
        if self.pause is not None and self.pause.active:
            return
        if self.doc is not None and (
                (check_viewers and not viewers_ready(self.doc)) or hidden_flag(self.doc).disabled):
            return
        end = self.store.last_seq if upto is None else upto
        if whole_batches:
            end = self._boundary(end)
        if end <= self.seq:
            return
        rows, last = self.store.since(self.seq)
        if last > end:
            rows = rows[:max(0, len(rows) - (last - end))]
            last = end
        self.seq = last
        if rows:
            self.on_rows(rows)

    def catch_up(self) -> None:
        """Push every row newer than the last seen, whole batch or not."""
        self._poll(whole_batches=False)

    def toggled(self, _attr: str, _old: Any, paused: Any) -> None:
        """Relabel the pause button; on resume, catch up at once rather than at the next tick."""
        if self.pause is not None:
            self.pause.label = RESUME_LABEL if paused else PAUSE_LABEL
        if not paused:
            self.catch_up()

    def seen(self, _attr: str, _old: Any, hidden: Any) -> None:
        """Catch up at once when the page can be seen again."""
        if not hidden:
            self.catch_up()


def period_ms(ctx: LiveContext) -> int:
    """The update period: the sampler's interval, in milliseconds."""
    return max(1, math.ceil(ctx.interval_s * 1000))


REFRESH_S = 1.0
"""The classic dashboards are redrawn about once a second, not at every sample. A redraw costs the viewer's
browser the same whether it adds one row or two (``benchmarks/browser_cpu.py``); at the default 0.5 s interval
ten minutes of samples are about as many as a timeline has pixels across, so a sample moves a line by about a
pixel; every sample is still drawn, and the throughput bars' peak markers still see every sample."""


def refresh_batch(ctx: LiveContext) -> int:
    """Rows per update of a page redrawn every :data:`REFRESH_S`: the samples taken meanwhile (at least one)."""
    return max(1, round(REFRESH_S / ctx.interval_s))


def follow(
    doc: Document, ctx: LiveContext, seq: int, on_rows: RowsHandler, pause: Toggle | None = None, *, batch: int = 1
) -> Follower:
    """Hand the document the store's rows after sequence number ``seq``, ``batch`` at a time (see :class:`Follower`),
    every :func:`period_ms`: in a Bokeh server at the ticks of the store's one :class:`~nvdash.live.ticker.Ticker`
    (until the session is destroyed); elsewhere (a document without a session: tests, benchmarks) by the document's
    one periodic callback."""
    follower = Follower(ctx.store, seq, on_rows, pause, doc, batch=batch)
    if doc.session_context is None:
        doc.add_periodic_callback(follower.poll, period_ms(ctx))
    else:
        ticker(ctx.store, period_ms(ctx)).register(follower)
    if pause is not None:
        pause.on_change("active", follower.toggled)
    hidden_flag(doc).on_change("disabled", follower.seen)
    return follower


def pause_toggle() -> Toggle:
    """The button that freezes a page's timelines (for reading or zooming) until pressed again."""
    return Toggle(label=PAUSE_LABEL, active=False, width=100, height=30, sizing_mode="fixed")


def latest(store: Store) -> tuple[Snapshot | None, int]:
    """The newest snapshot and its sequence number, read together."""
    rows, seq = store.since(max(0, store.last_seq - 1))
    return (rows[-1] if rows else None), seq


def _same_value(old: Any, new: Any) -> bool:
    if isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new):
        return True
    return bool(old == new)


def _same(old: Sequence[Any], new: Sequence[Any]) -> bool:
    return len(old) == len(new) and all(_same_value(a, b) for a, b in zip(old, new, strict=True))


SMALL_STREAM_ROWS = 64
"""Up to this many new rows are sent as plain lists: inline in the message's JSON. A numpy column is sent as a
binary buffer of its own (two websocket frames and a reference per column), which for a row or two costs the
server, the network and the browser several times what the values do (``benchmarks/viewers.py``)."""


def streamable(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with short numpy columns turned into lists (see :data:`SMALL_STREAM_ROWS`); long ones kept."""
    return {
        name: values.tolist() if isinstance(values, np.ndarray) and len(values) <= SMALL_STREAM_ROWS else values
        for name, values in data.items()
    }


def patch_changed(source: ColumnDataSource, data: dict[str, list[Any]]) -> None:
    """Patch, in one message, only the columns whose values changed (NaN equals NaN)."""
    patches = {
        name: [(slice(0, len(values)), values)]
        for name, values in data.items()
        if not _same(list(source.data[name]), values)
    }
    if patches:
        source.patch(patches)


def follow_latest(
    doc: Document, ctx: LiveContext, columns: Callable[[Snapshot | None], dict[str, list[Any]]], share: Hashable
) -> ColumnDataSource:
    """A bar-chart source filled from the newest snapshot and patched with a newer one every :data:`REFRESH_S`.

    ``share`` names the computation: every session asking with the same name gets the columns of a snapshot
    computed once (so ``columns`` must depend on nothing but the snapshot and what the name says).
    """
    snapshot, seq = latest(ctx.store)
    source = ColumnDataSource(data=ctx.ticks.latest(share, snapshot, columns))
    follow(doc, ctx, seq, lambda rows: patch_changed(source, ctx.ticks.latest(share, rows[-1], columns)),
           batch=refresh_batch(ctx))
    return source
