"""Per-tick work done once per route, not once per session.

Every open pane of a route reads the same new snapshots from the store at each tick and would turn them into the
same columns (values, rates, colours, labels). The first session to ask computes them; the others of that tick get
the same result. Results are keyed by what they are computed from (a name for the computation and the exact
snapshot objects), so sessions that lag behind or were paused compute their own.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np

from nvdash.sampling.records import Snapshot
from nvdash.store import Store

T = TypeVar("T")

DEFAULT_CAPACITY = 512
"""Results kept: a few ticks of every route's computations (each a handful of short columns)."""
STORE_COLUMNS_CAPACITY = 32
"""Whole-store columns kept: one per route (and per GPU of GPU Details)."""

Columns = dict[str, Any]


@dataclass
class _StoreColumns:
    """The columns of a store's rows up to ``seq``: ``count`` rows (the newest ones then)."""

    store: weakref.ref[Store]
    seq: int
    count: int
    data: Columns


def _tail(values: Any, start: int) -> Any:
    return values[start:] if start else values


def _joined(old: Any, new: Any) -> Any:
    if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
        return np.concatenate([np.asarray(old), np.asarray(new)])
    return [*old, *new]


def _own_copy(values: Any) -> Any:
    """A column the caller may hand to a source: Bokeh's ``stream`` extends a list column in place."""
    return values.copy() if isinstance(values, np.ndarray) else list(values)


class TickCache:
    """A bounded, least-recently-used map from (computation, snapshots) to its result.

    Used only on the server's event loop (the apps' callbacks), so it needs no lock. A result must not be
    mutated by its users: Bokeh's ``stream`` and ``patch`` copy the values they are given.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, tuple[Snapshot | None, Snapshot | None, Any]] = OrderedDict()
        self._store_columns: OrderedDict[Hashable, _StoreColumns] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.rows_computed = 0
        """Rows that :meth:`store_columns` computed columns of (a measure of the work it saved)."""

    def __len__(self) -> int:
        return len(self._entries)

    def rows(self, name: Hashable, rows: Sequence[Snapshot], compute: Callable[[Sequence[Snapshot]], T]) -> T:
        """``compute(rows)``, shared by every caller that asks for ``name`` over the very same snapshots."""
        first = rows[0] if rows else None
        last = rows[-1] if rows else None
        key = (name, len(rows), id(first), id(last))
        entry = self._entries.get(key)
        # The entry holds its first and last snapshot, so their ids cannot be reused while it lives.
        if entry is not None and entry[0] is first and entry[1] is last:
            self._entries.move_to_end(key)
            self.hits += 1
            result: T = entry[2]
            return result
        self.misses += 1
        value = compute(rows)
        self._entries[key] = (first, last, value)
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value

    def latest(self, name: Hashable, snapshot: Snapshot | None, compute: Callable[[Snapshot | None], T]) -> T:
        """``compute(snapshot)``, shared by every caller that asks for ``name`` over the very same snapshot."""
        rows = [] if snapshot is None else [snapshot]
        return self.rows(name, rows, lambda _rows: compute(snapshot))

    def store_columns(self, name: Hashable, store: Store,
                      compute: Callable[[Sequence[Snapshot]], Columns]) -> tuple[Columns, int]:
        """``compute`` of every row ``store`` holds, and the newest row's sequence number.

        A page that opens fills its plots with the columns of the whole store (1,200 rows); computing them
        anew for each page held every other page for tens of milliseconds. Here each row is computed once per
        ``name``: the columns last handed out are kept, and a later call computes only the rows newer than
        them, dropping those the store no longer holds. ``compute`` must compute each row on its own (no value
        may depend on a neighbouring row) and return columns of one length. The caller gets its own copy.
        """
        held = self._extend(name, store, compute, limit=None)
        return {key: _own_copy(values) for key, values in held.data.items()}, held.seq

    def unwarmed_rows(self, name: Hashable, store: Store) -> int:
        """How many of ``store``'s rows :meth:`store_columns` would compute now for ``name``."""
        rows, seq = store.since(0)
        held = self._held(name, store, seq, len(rows))
        return len(rows) if held is None else seq - held.seq

    def warm(self, name: Hashable, store: Store, compute: Callable[[Sequence[Snapshot]], Columns],
             rows: int) -> None:
        """Compute at most ``rows`` more of the store's rows for ``name``, oldest first: a page that opens on a
        cold cache computes it a slice per turn of the event loop instead of all of it in one."""
        self._extend(name, store, compute, limit=max(1, rows))

    def _held(self, name: Hashable, store: Store, seq: int, size: int) -> _StoreColumns | None:
        """The kept columns of ``name`` if the store (``size`` rows up to ``seq``) still holds some of their rows."""
        held = self._store_columns.get(name)
        if held is None or held.store() is not store or held.seq > seq:
            return None
        kept = size - (seq - held.seq)
        return held if 0 < kept <= held.count else None

    def _extend(self, name: Hashable, store: Store, compute: Callable[[Sequence[Snapshot]], Columns],
                limit: int | None) -> _StoreColumns:
        """The kept columns of ``name`` brought up to the store's newest row, or ``limit`` rows closer to it."""
        rows, seq = store.since(0)
        held = self._held(name, store, seq, len(rows))
        if held is None:
            wanted = rows if limit is None else rows[:limit]
            data = compute(wanted)
            count = len(wanted)
        else:
            new = seq - held.seq
            kept = len(rows) - new
            start = held.count - kept
            wanted = rows[kept:] if limit is None else rows[kept:kept + limit]
            if wanted:
                fresh = compute(wanted)
                data = {key: _joined(_tail(values, start), fresh[key]) for key, values in held.data.items()}
            else:
                data = {key: _tail(values, start) for key, values in held.data.items()}
            count = kept + len(wanted)
        self.rows_computed += len(wanted)
        covered = seq - (len(rows) - count)
        made = _StoreColumns(weakref.ref(store), covered, count, data)
        self._store_columns[name] = made
        self._store_columns.move_to_end(name)
        if len(self._store_columns) > STORE_COLUMNS_CAPACITY:
            self._store_columns.popitem(last=False)
        return made


WARM_ROWS = 200
"""Rows of a cold whole-store computation done per turn of the event loop (GPU Health's strip: about 15 ms)."""


def opening_columns(ticks: TickCache, name: Hashable, store: Store, compute: Callable[[Sequence[Snapshot]], Columns]
                    ) -> tuple[Columns, int, list[Callable[[], None]]]:
    """What a page that opens starts from: the store's columns of ``name`` and the newest row's number, and no
    steps, when at most :data:`WARM_ROWS` rows are missing; else empty columns, the newest row's number and the
    steps that compute the store's columns :data:`WARM_ROWS` rows at a time, for the page to run one per turn and
    then show the store's columns."""
    missing = ticks.unwarmed_rows(name, store)
    if missing <= WARM_ROWS:
        data, seq = ticks.store_columns(name, store, compute)
        return data, seq, []
    steps: list[Callable[[], None]] = [partial(ticks.warm, name, store, compute, WARM_ROWS)] * math.ceil(
        missing / WARM_ROWS)
    return compute([]), store.last_seq, steps
