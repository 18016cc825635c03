"""The "GPU Memory by Notebook" page drawn by a real chromium from a real Bokeh server: the history's minutes and
the live readings of two notebooks, then the degraded message; no script error, a screenshot for people to look at."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from nvdash.apps.context import AppContext
from nvdash.history.query import SqliteHistory
from nvdash.sampling.notebook_records import NotebookView
from nvdash.store import Store
from tests.browser.chromium import artifact, chromium, open_page, wait_until_drawn
from tests.notebook_views import MIB, snapshot, use, view
from tests.server.test_notebook_memory import REASON, page_server
from tests.unit.test_history_store import inventory, write

pytestmark = pytest.mark.browser

A, B = "aaaa1111-0000", "bbbb2222-0000"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def test_two_notebooks_are_drawn_and_the_reason_is_shown_when_they_cannot_be_joined(browser: Browser,
                                                                                   tmp_path: Path) -> None:
    now = time.time()
    path = tmp_path / "history.sqlite"
    # 25 minutes of history: A grows from 2 GiB, B starts 15 minutes ago and stops 5 minutes ago.
    past = [now - 1500 + 30 * step for step in range(46)]
    write(path, [snapshot(t, view(t, use(A, "train/resnet.ipynb", (0, (2048 + 40 * step) * MIB, 60.0)),
                                  *([use(B, "eval/bert.ipynb", (1, 6144 * MIB, 20.0))] if 20 <= step < 40 else [])))
                 for step, t in enumerate(past)], gpus=2)
    store = Store(inventory(2), capacity=200)
    for step in range(60):  # the last two minutes live, a reading every 2 s
        t = now - 120 + 2 * step
        store.append(snapshot(t, view(t, use(A, "train/resnet.ipynb", (0, (4000 + step) * MIB, 60.0)),
                                      use(B, "eval/bert.ipynb", (1, (1024 if step > 30 else 0) * MIB, 5.0)))))
    executor = ThreadPoolExecutor(1)
    ctx = AppContext(store=store, interval_s=1.0, history=SqliteHistory(path), history_executor=executor,
                     clock=time.time)
    try:
        with page_server(ctx) as (url, loop):
            page, errors = open_page(browser, url, width=1200, height=600)
            wait_until_drawn(page)
            expect(page.get_by_text("train/resnet.ipynb")).to_be_attached()
            page.screenshot(path=str(artifact("notebook-memory.png")))
            loop.add_callback(store.append, snapshot(now + 1, NotebookView("pid_namespace", REASON, now + 1)))
            expect(page.get_by_text(REASON)).to_be_visible(timeout=30_000)
            page.screenshot(path=str(artifact("notebook-memory-degraded.png")))
            assert errors == []
    finally:
        executor.shutdown()
