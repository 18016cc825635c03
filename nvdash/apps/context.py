"""What every app is built from: the shared store and the sampler's interval."""

from __future__ import annotations

from dataclasses import dataclass

from nvdash.store import Store


@dataclass(frozen=True)
class AppContext:
    """The server's shared state handed to each app; ``interval_s`` is the per-document update period."""

    store: Store
    interval_s: float
