"""Keeping garbage collection off the viewers' critical path.

Bokeh's ``Document.destroy`` runs a full ``gc.collect()`` for every session it discards, on the event loop.
A full collection walks every object in the process, and with tens of open dashboards that is hundreds of
thousands of objects: measured here at 400-500 ms with 70 open documents, a stall every viewer sees each time
anyone closes a pane. nvdash gives Bokeh a collector that collects the young generations instead; older
garbage is left to Python's own collector, which runs a full collection only as the heap grows. Objects
that live as long as the server (modules, the apps' code) are frozen at start-up so that those full
collections do not walk them either.
"""

from __future__ import annotations

import gc
from types import ModuleType
from typing import Any

import bokeh.document.document as bokeh_document


class YoungCollector:
    """Stands in for the ``gc`` module inside Bokeh's document module: ``collect()`` is generation 1."""

    def collect(self, generation: int = 2) -> int:
        """Collect generations 0 and 1 only, whatever was asked."""
        return gc.collect(min(generation, 1))

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def install(document_module: ModuleType = bokeh_document) -> None:
    """Make Bokeh's session clean-up collect young garbage only (idempotent)."""
    if not isinstance(getattr(document_module, "gc", None), YoungCollector):
        document_module.gc = YoungCollector()  # type: ignore[attr-defined]


def freeze_startup_objects() -> None:
    """Move everything alive now (imported modules, the server's own objects) out of the collector's sight."""
    gc.collect()
    gc.freeze()
