"""Keeping garbage collection off the viewers' critical path.

Bokeh's ``Document.destroy`` runs a full ``gc.collect()`` for every session it discards, on the event loop.
A full collection walks every object in the process, and with tens of open dashboards that is hundreds of
thousands of objects: measured here at 400-500 ms with 70 open documents, a stall every viewer sees each time
anyone closes a pane. nvdash gives Bokeh a collector that collects nothing there but now and then (see below);
young garbage is left to Python's own collector (collecting the two young generations at each discarded document
still cost about 75 ms with 70 open pages and the thresholds below). Python's collector runs a full collection
once enough objects have survived two young collections; every update tick allocates short-lived lists and
events, and with the default young threshold (700 allocations) many of them are caught alive and promoted, so
full collections came every few seconds (8 of 63-257 ms in one minute with 10 viewers). A larger young threshold
lets them die young first; none came in the same minute. Objects that live as long as the server (modules, the
apps' code) are frozen at start-up so that full collections do not walk them.

Building a page allocates tens of thousands of objects that all live as long as the page (Bokeh's models,
their property containers). A young collection that lands in a page-building turn walks them in vain: 20-40 ms
on top of the turn's own 20-40 ms, which made most of the opens that held other viewers' updates over 50 ms
(``benchmarks/open_stall.py``). So a building turn runs with the collector paused (:func:`building`), and at its
end everything alive is frozen with the start-up objects: no later young or middle collection walks the page
either. Cyclic garbage frozen with it waits for the next full collection.

A discarded document is itself garbage in reference cycles (Bokeh's models point back at their document, each
property's list or dict at its model) that was promoted to the oldest generation long before, so only a full
collection would free it. Left to Python's thresholds, the documents of about a hundred closed panes (around
1 MiB each) piled up (the churn test in ``tests/server/test_churn.py``). So once Bokeh has destroyed a document,
nvdash breaks its models' cycles (:func:`scrub`): reference counting frees the models, their columns and their
property values at once. What is left in cycles (the apps' closures and views, about 0.1 MiB of a GPU Resources
page) waits for a full collection, one every :data:`FULL_EVERY` discarded documents.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import bokeh.document.document as bokeh_document
from bokeh.core.property.wrappers import PropertyValueContainer
from bokeh.document import Document
from bokeh.model import Model

from nvdash.live.internals import document_gc, forget_owners, property_value_maps, set_document_gc

FULL_EVERY = 100
"""One discarded document in this many gets a full collection, which frees what :func:`scrub` left of the ones
discarded before it (a full collection walks every object: with 70 open pages it held the loop 0.5 s)."""


class RareCollector:
    """Stands in for the ``gc`` module inside Bokeh's document module: ``collect()`` does nothing but on every
    ``full_every``-th call, which is a full collection."""

    def __init__(self, full_every: int = FULL_EVERY) -> None:
        self._full_every = full_every
        self._calls = 0

    def collect(self, generation: int = 2) -> int:
        """Collect ``generation`` on every ``full_every``-th call, nothing otherwise (returns what was freed)."""
        self._calls += 1
        if self._calls % self._full_every == 0:
            gc.unfreeze()  # what building turns froze is collected here too
            try:
                return gc.collect(generation)
            finally:
                gc.freeze()
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def scrub(models: Iterable[Model]) -> None:
    """Break the reference cycles of a destroyed document's models: each property container forgets its owners
    and each model its attributes. Only for models nothing will use again."""
    for model in models:
        for values in property_value_maps(model):
            for held in values.values():
                if isinstance(held, PropertyValueContainer):
                    forget_owners(held)
        model.__dict__.clear()


def _scrubbing(destroy: Callable[[Document, Any], None]) -> Callable[[Document, Any], None]:
    def destroy_and_scrub(document: Document, session: Any) -> None:
        models = list(document.models)
        destroy(document, session)
        scrub(models)

    destroy_and_scrub.scrubs = True  # type: ignore[attr-defined]
    return destroy_and_scrub


def installed(document_module: ModuleType = bokeh_document) -> bool:
    """Whether :func:`install` has run: a full collection now and then unfreezes what :func:`building` froze."""
    return isinstance(document_gc(document_module), RareCollector)


@contextmanager
def building() -> Iterator[None]:
    """A page-building turn: no collection inside; then, with the policy installed, what is alive is frozen."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if installed():
            gc.freeze()
        if enabled:
            gc.enable()


def install(document_module: ModuleType = bokeh_document) -> None:
    """Make Bokeh's session clean-up scrub the document's models and collect garbage only now and then
    (idempotent)."""
    if not installed(document_module):
        set_document_gc(document_module, RareCollector())
    document_class = document_module.Document
    if not getattr(document_class.destroy, "scrubs", False):
        document_class.destroy = _scrubbing(document_class.destroy)


YOUNG_THRESHOLD = 50_000
MIDDLE_THRESHOLD = 20
OLD_THRESHOLD = 100


def tune_thresholds() -> None:
    """Collect the young generation every 50,000 allocations instead of 700, the older ones more rarely."""
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)


def freeze_startup_objects() -> None:
    """Move everything alive now (imported modules, the server's own objects) out of the collector's sight."""
    gc.collect()
    gc.freeze()
