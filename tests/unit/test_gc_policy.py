"""Closing a dashboard must not run a full garbage collection on the event loop."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import bokeh.document.document as bokeh_document
import numpy as np
import pytest
from bokeh.document import Document
from bokeh.models import ColumnDataSource

from nvdash.live import gc_policy


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations of the collections that run while the test does."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(int(info["generation"]))

    saved = bokeh_document.gc
    saved_destroy = Document.destroy
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        bokeh_document.gc = saved  # type: ignore[attr-defined]
        Document.destroy = saved_destroy  # type: ignore[method-assign]


def _destroy_a_document() -> None:
    doc = Document()
    doc.add_root(ColumnDataSource(data={"x": [1, 2, 3]}))
    session = object()  # what the server registers for a session's changes
    doc.on_change_dispatch_to(session)
    doc.destroy(session)


def test_bokeh_alone_runs_a_full_collection_per_destroyed_document(collections: list[int]) -> None:
    _destroy_a_document()
    assert 2 in collections


def test_with_the_policy_a_destroyed_document_costs_no_collection(collections: list[int]) -> None:
    gc_policy.install()
    gc_policy.install()
    enabled = gc.isenabled()
    gc.disable()  # only the collections the policy asks for
    try:
        _destroy_a_document()
    finally:
        if enabled:
            gc.enable()
    assert collections == []
    assert bokeh_document.gc.isenabled() == gc.isenabled()


def _freed_without_a_full_collection(destroy_count: int = 1) -> bool:
    """Whether the models of an old document with a cycle through a callback die as it is destroyed."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        doc, session = _old_document()
        source = weakref.ref(doc.roots[0])
        column = weakref.ref(doc.roots[0].data["x"])
        doc.destroy(session)
        del doc
        gc.collect(1)
        return source() is None and column() is None
    finally:
        if enabled:
            gc.enable()


def test_without_the_policy_the_models_of_a_destroyed_document_wait_for_a_full_collection(
        collections: list[int]) -> None:
    bokeh_document.gc = gc_policy.RareCollector()  # type: ignore[attr-defined]
    assert not _freed_without_a_full_collection()
    gc.collect()


def test_with_the_policy_the_models_and_their_columns_are_freed_as_the_document_is_destroyed(
        collections: list[int]) -> None:
    gc_policy.install()
    gc_policy.install()
    assert getattr(Document.destroy, "scrubs", False)
    assert _freed_without_a_full_collection()


def test_every_hundredth_destroyed_document_gets_a_full_collection_that_frees_the_ones_before(
        collections: list[int]) -> None:
    docs = [_old_document() for _ in range(gc_policy.FULL_EVERY)]
    refs = [weakref.ref(doc) for doc, _ in docs]
    bokeh_document.gc = gc_policy.RareCollector()  # type: ignore[attr-defined]
    enabled = gc.isenabled()
    gc.disable()  # only the collections the policy asks for
    try:
        collections.clear()
        while len(docs) > 1:
            doc, session = docs.pop(0)
            doc.destroy(session)
            del doc
        assert collections == []
        assert all(ref() is not None for ref in refs[:-1]), "cycles that only a full collection frees"
        doc, session = docs.pop()
        doc.destroy(session)
        assert max(collections) == 2
        assert all(ref() is None for ref in refs[:-1])
    finally:
        if enabled:
            gc.enable()


def _old_document() -> tuple[Document, object]:
    """A document in the oldest generation, as one that was open for a while in the server is."""
    doc = Document()
    source = ColumnDataSource(data={"x": np.arange(3.0)})
    source.on_change("data", lambda _attr, _old, _new: doc)  # a cycle through the document, as the apps make
    doc.add_root(source)
    session = object()
    doc.on_change_dispatch_to(session)
    gc.freeze()
    gc.unfreeze()  # everything tracked, the document too, is now in the oldest generation
    return doc, session


def test_thresholds_let_short_lived_objects_die_young() -> None:
    saved = gc.get_threshold()
    try:
        gc_policy.tune_thresholds()
        assert gc.get_threshold() == (50_000, 20, 100)
    finally:
        gc.set_threshold(*saved)


class _Node:
    """An object in a reference cycle (only a collection frees it), that a weak reference can watch."""

    def __init__(self) -> None:
        self.me = self


def test_a_building_turn_runs_no_collection_and_puts_the_collector_back(collections: list[int]) -> None:
    frozen = gc.get_freeze_count()
    enabled = gc.isenabled()
    with gc_policy.building():
        assert not gc.isenabled()
        garbage = [_Node() for _ in range(3 * gc.get_threshold()[0])]  # would trigger young collections
        del garbage
        inside = list(collections)
    assert inside == []
    assert gc.isenabled() == enabled
    # A freeze would add every object alive; the count may fall meanwhile, when another thread of this process
    # frees something an earlier test froze.
    assert gc.get_freeze_count() <= frozen, "without the policy installed nothing is frozen"


def test_with_the_policy_a_building_turn_freezes_what_it_made_until_the_next_full_collection(
        collections: list[int]) -> None:
    gc_policy.install()
    collector = bokeh_document.gc
    assert isinstance(collector, gc_policy.RareCollector)
    try:
        with gc_policy.building():
            page = [_Node() for _ in range(1000)]
            cyclic_garbage = weakref.ref(_Node())
        assert gc.get_freeze_count() >= len(page), "the page's objects are out of the collector's sight"
        gc.collect(1)
        assert cyclic_garbage() is not None, "frozen: young and middle collections do not walk it"
        for _ in range(gc_policy.FULL_EVERY - 1):
            collector.collect()
        assert cyclic_garbage() is not None
        collector.collect()  # the 100th discarded document: a full collection of the unfrozen heap
        assert cyclic_garbage() is None
        assert gc.get_freeze_count() >= len(page), "what lives on is frozen again"
    finally:
        gc.unfreeze()
