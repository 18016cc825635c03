"""Closing a dashboard must not run a full garbage collection on the event loop."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import bokeh.document.document as bokeh_document
import pytest
from bokeh.document import Document
from bokeh.models import ColumnDataSource

from nvdash.server import gc_policy


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations of the collections that run while the test does."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(int(info["generation"]))

    saved = bokeh_document.gc
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        bokeh_document.gc = saved  # type: ignore[attr-defined]


def _destroy_a_document() -> None:
    doc = Document()
    doc.add_root(ColumnDataSource(data={"x": [1, 2, 3]}))
    session = object()  # what the server registers for a session's changes
    doc.on_change_dispatch_to(session)
    doc.destroy(session)


def test_bokeh_alone_runs_a_full_collection_per_destroyed_document(collections: list[int]) -> None:
    _destroy_a_document()
    assert 2 in collections


def test_with_the_policy_a_destroyed_document_costs_a_young_collection_only(collections: list[int]) -> None:
    gc_policy.install()
    gc_policy.install()
    _destroy_a_document()
    assert collections
    assert max(collections) <= 1
    assert bokeh_document.gc.isenabled() == gc.isenabled()


def test_thresholds_let_short_lived_objects_die_young() -> None:
    saved = gc.get_threshold()
    try:
        gc_policy.tune_thresholds()
        assert gc.get_threshold() == (50_000, 20, 100)
    finally:
        gc.set_threshold(*saved)
