"""New dashboards are built on a worker thread while Bokeh creates the session, not on the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from bokeh.document import Document
from bokeh.models import Div

from nvdash.server.threaded_handler import ThreadedBuildHandler


class Context:
    """What Bokeh hands ``on_session_created`` before the session exists: the document, unlocked."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc

    async def with_locked_document(self, func: Callable[[Document], Awaitable[None]]) -> None:
        await func(self.doc)


def test_build_runs_off_the_loop_thread_and_the_loop_keeps_running() -> None:
    built_on: list[str] = []
    release = threading.Event()

    def build(doc: Document) -> None:
        built_on.append(threading.current_thread().name)
        release.wait(5)
        doc.add_root(Div(text="ready"))

    doc = Document()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvdash-build") as pool:
        handler = ThreadedBuildHandler(build, pool)

        async def scenario() -> int:
            creating = asyncio.ensure_future(handler.on_session_created(Context(doc)))  # type: ignore[arg-type]
            ticks = 0
            while ticks < 5:
                await asyncio.sleep(0.01)
                ticks += 1
            release.set()
            await creating
            return ticks

        assert asyncio.run(scenario()) == 5, "the loop ran other work while the document was being built"
    assert built_on == ["nvdash-build_0"]
    assert [root.text for root in doc.roots] == ["ready"]  # type: ignore[attr-defined]
    handler.modify_document(doc)
    assert len(doc.roots) == 1


def test_a_failing_build_is_logged_not_raised(caplog: object) -> None:
    def build(doc: Document) -> None:
        raise RuntimeError("broken dashboard")

    with ThreadPoolExecutor(max_workers=1) as pool:
        handler = ThreadedBuildHandler(build, pool)
        asyncio.run(handler.on_session_created(Context(Document())))  # type: ignore[arg-type]
    assert "building a dashboard failed" in caplog.text  # type: ignore[attr-defined]
