"""A page its viewer cannot see takes no updates, and catches up when seen again."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

from bokeh.document import Document
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.events import DocumentReady
from bokeh.models import Spacer

from nvdash.apps import gpu_resources
from nvdash.live.visibility import HIDDEN_NAME, hidden_flag
from tests.unit.test_apps import NEW_ROW, make_ctx, tick


def test_the_flag_is_in_the_page_and_watched_when_the_document_is_ready() -> None:
    ctx = make_ctx()
    doc = Document()
    gpu_resources.build(doc, ctx)
    flag = doc.select_one({"name": HIDDEN_NAME})
    assert isinstance(flag, Spacer)
    assert flag is hidden_flag(doc)
    assert flag.visible is False
    assert flag.disabled is False
    assert list(doc.callbacks.js_event_callbacks) == [DocumentReady.event_name]


def test_a_hidden_page_takes_no_rows_and_gets_them_all_when_seen() -> None:
    ctx = make_ctx()
    doc = Document()
    gpu_resources.build(doc, ctx)
    flag = hidden_flag(doc)
    flag.disabled = True  # what the browser sets when the frame is not displayed
    ctx.store.append(NEW_ROW)
    ctx.store.append(replace(NEW_ROW, time_s=NEW_ROW.time_s + 1))
    assert tick(doc) == []
    events: list[object] = []
    doc.on_change(events.append)
    flag.disabled = False
    streamed = [event for event in events if isinstance(event, ColumnsStreamedEvent)]
    assert len(streamed) == 1
    assert streamed[0].data["time"] == [NEW_ROW.time_s * 1000.0, (NEW_ROW.time_s + 1) * 1000.0]


def test_the_flag_does_not_keep_its_document_alive() -> None:
    ctx = make_ctx()
    doc = Document()
    gpu_resources.build(doc, ctx)
    gone = weakref.ref(doc)
    del doc
    gc.collect()
    assert gone() is None
