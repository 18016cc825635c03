"""Per-tick work done once per route, not once per session.

Every open pane of a route reads the same new snapshots from the store at each tick and would turn them into the
same columns (values, rates, colours, labels). The first session to ask computes them; the others of that tick get
the same result. Results are keyed by what they are computed from (a name for the computation and the exact
snapshot objects), so sessions that lag behind or were paused compute their own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from nvdash.sampling.records import Snapshot

T = TypeVar("T")

DEFAULT_CAPACITY = 512
"""Results kept: a few ticks of every route's computations (each a handful of short columns)."""


class TickCache:
    """A bounded, least-recently-used map from (computation, snapshots) to its result.

    Used only on the server's event loop (the apps' callbacks), so it needs no lock. A result must not be
    mutated by its users: Bokeh's ``stream`` and ``patch`` copy the values they are given.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, tuple[Snapshot | None, Snapshot | None, Any]] = OrderedDict()
        self.hits = 0
        self.misses = 0

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
