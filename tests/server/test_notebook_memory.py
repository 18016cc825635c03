"""The "GPU Memory by Notebook" page through a real Bokeh server, read by bokeh.client as a viewer gets it: a store
fed with hand-made snapshots and a real history file; and through ``python -m nvdash``: offered only when started
by a Jupyter server (``--jupyter-kernels``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.client import ClientSession, pull_session
from bokeh.document import Document
from bokeh.models import ColumnDataSource, Legend
from bokeh.models.widgets import Div
from bokeh.server.server import Server
from tornado.ioloop import IOLoop

from nvdash.apps.context import AppContext
from nvdash.apps.notebook_memory import LINE_PREFIX, MESSAGE_NAME, WAITING, build
from nvdash.history.query import SqliteHistory
from nvdash.sampling.notebook_records import NotebookView
from nvdash.store import Store
from tests.conftest import free_port, get_json, http_get, nvdash_server, wait_for
from tests.notebook_views import MIB, snapshot, use, view
from tests.server.bokeh_viewer import receive_until
from tests.unit.test_history_store import T0, inventory, write

ROUTE = "/GPU-Memory-by-Notebook"
NOW = T0 + 3600.0
A, B, C = "aaaa1111-0000", "bbbb2222-0000", "cccc3333-0000"
TRAIN = "train/a.ipynb"
B_TITLE = "Kernel python3 bbbb2222"
"""Kernel B has no session: its legend is the kernel's name and id prefix."""
REASON = ("NVML lists GPU processes but none of their PIDs is visible here: nvdash runs in another PID namespace "
          "than the driver's.")


@contextmanager
def page_server(ctx: AppContext) -> Iterator[tuple[str, IOLoop]]:
    """A Bokeh server in a thread serving the page over ``ctx``."""
    port = free_port()
    started = threading.Event()
    loops: list[IOLoop] = []

    def make(doc: Document) -> None:
        build(doc, ctx)

    def serve() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        loop = IOLoop.current()
        server = Server({ROUTE: Application(FunctionHandler(make))}, io_loop=loop, port=port, address="127.0.0.1",
                        allow_websocket_origin=[f"127.0.0.1:{port}"])
        server.start()
        loops.append(loop)
        started.set()
        loop.start()
        server.stop()
        loop.close(all_fds=True)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert started.wait(30)
        yield f"http://127.0.0.1:{port}{ROUTE}", loops[0]
    finally:
        loops[0].add_callback(loops[0].stop)
        thread.join(30)


def lines(session: ClientSession) -> dict[str, dict[str, list[object]]]:
    """Each kernel's line source, as the viewer holds it."""
    return {source.name.removeprefix(LINE_PREFIX): {name: list(values) for name, values in source.data.items()}
            for source in session.document.select({"type": ColumnDataSource})
            if source.name and source.name.startswith(LINE_PREFIX)}


def message(session: ClientSession) -> Div:
    (div,) = session.document.select({"name": MESSAGE_NAME})
    assert isinstance(div, Div)
    return div


def test_two_notebooks_lines_carry_the_histories_minutes_then_the_live_readings_and_stream(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    past = NOW - 600.0  # a whole minute, 10 minutes ago: two readings a minute, two minutes
    write(path, [snapshot(past + offset, view(past + offset, use(A, TRAIN, (0, memory * MIB, 10.0))))
                 for offset, memory in ((0, 100), (30, 300), (60, 500), (90, 500))], gpus=2)
    # An older minute beyond the 30 minutes shown, and a kernel that never holds memory.
    write(path, [snapshot(NOW - 3000.0, view(NOW - 3000.0, use(C, "old.ipynb", (0, 7 * MIB, 1.0))))], gpus=2)
    store = Store(inventory(2), capacity=100)
    live = [(NOW - 6, [use(A, TRAIN, (0, 1000 * MIB, 50.0)), use(B, None, (0, 20 * MIB, 5.0), (1, 30 * MIB, 5.0))]),
            (NOW - 4, [use(A, TRAIN, (0, 1200 * MIB, 50.0)), use(B, None, (1, 40 * MIB, 5.0)), use(C, "idle.ipynb")]),
            (NOW - 2, [use(A, TRAIN, (0, 1200 * MIB, 50.0)), use(C, "idle.ipynb")])]
    for time_s, kernels in live:
        store.append(snapshot(time_s, view(time_s, *kernels)))
        store.append(snapshot(time_s + 1, view(time_s, *kernels)))  # the same reading in the next snapshot
    executor = ThreadPoolExecutor(1)
    ctx = AppContext(store=store, interval_s=1.0, history=SqliteHistory(path), history_executor=executor,
                     clock=lambda: NOW)
    try:
        with page_server(ctx) as (url, loop):
            session = pull_session(url=url)
            try:
                receive_until(session, lambda: len(lines(session)) == 2)
                found = lines(session)
                # A: the history's two minutes (means 200 and 500 MiB, at their middles), then the live readings.
                assert found[A] == {
                    "time": [(past + 30) * 1e3, (past + 90) * 1e3, (NOW - 6) * 1e3, (NOW - 4) * 1e3, (NOW - 2) * 1e3],
                    "memory": [200.0 * MIB, 500.0 * MIB, 1000.0 * MIB, 1200.0 * MIB, 1200.0 * MIB],
                    "title": [TRAIN] * 5,
                }
                # B: 50 MiB over two GPUs, then 40 MiB, then it holds nothing: it drops to 0 and ends.
                assert found[B] == {"time": [(NOW - 6) * 1e3, (NOW - 4) * 1e3, (NOW - 2) * 1e3],
                                    "memory": [50.0 * MIB, 40.0 * MIB, 0.0], "title": [B_TITLE] * 3}
                (legend,) = session.document.select({"type": Legend})
                assert [item.label.value for item in legend.items] == [TRAIN, B_TITLE]
                assert message(session).visible is False

                # A new reading streams on: A's next point; B comes back from 0; a new notebook gets its line.
                later = view(NOW, use(A, TRAIN, (0, 900 * MIB, 1.0)), use(B, None, (0, 8 * MIB, 1.0)),
                             use(C, "new/c.ipynb", (1, 64 * MIB, 3.0)))
                loop.add_callback(store.append, snapshot(NOW, later))
                receive_until(session, lambda: len(lines(session)) == 3 and len(lines(session)[A]["time"]) == 6
                              and len(lines(session)[B]["time"]) == 5 and len(legend.items) == 3)
                found = lines(session)
                assert found[A]["memory"][-1] == 900.0 * MIB
                assert found[B]["time"][-2:] == [NOW * 1e3, NOW * 1e3]
                assert found[B]["memory"][-2:] == [0.0, 8.0 * MIB]
                assert found[C] == {"time": [NOW * 1e3], "memory": [64.0 * MIB], "title": ["new/c.ipynb"]}
                assert [item.label.value for item in legend.items] == [TRAIN, B_TITLE, "new/c.ipynb"]

                # The kernels can no longer be matched: the page says why, plainly; the lines stay.
                degraded = NotebookView("pid_namespace", REASON, NOW + 2)
                loop.add_callback(store.append, snapshot(NOW + 2, degraded))
                receive_until(session, lambda: message(session).visible is True)
                assert message(session).text == REASON
                assert len(lines(session)[A]["time"]) == 6
            finally:
                session.close()
    finally:
        executor.shutdown()


def test_before_the_first_process_reading_the_page_says_it_waits() -> None:
    store = Store(inventory(1), capacity=10)
    store.append(snapshot(NOW, None))
    with page_server(AppContext(store=store, interval_s=1.0, clock=lambda: NOW)) as (url, _loop):
        session = pull_session(url=url)
        try:
            assert message(session).visible is True
            assert message(session).text == WAITING
            assert lines(session) == {}
        finally:
            session.close()


def test_the_page_is_offered_only_when_a_jupyter_server_started_nvdash(tmp_path: Path) -> None:
    with nvdash_server(("--simulate", "dgx-h100", "--no-history")) as server:
        assert ROUTE not in get_json(server.url + "/index.json")
        status, body, _ = http_get(server.url + ROUTE)
        assert status == 404
        assert "--jupyter-kernels" in body
    kernels = tmp_path / "nvdash-kernels-4242.json"
    with nvdash_server(("--simulate", "dgx-h100", "--no-history", "--jupyter-kernels", str(kernels))) as server:
        assert get_json(server.url + "/index.json")[ROUTE] == "GPU Memory by Notebook"
        session = pull_session(url=server.url + ROUTE)
        try:
            wait_for(lambda: message(session).text, bool)
            assert message(session).visible is True
        finally:
            session.close()
    with nvdash_server(("--simulate", "dgx-h100", "--no-history", "--process-interval", "0",
                        "--jupyter-kernels", str(kernels))) as server:
        assert ROUTE not in get_json(server.url + "/index.json")


def test_a_history_that_cannot_be_read_is_said_on_the_page_and_the_live_lines_still_drawn(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    path.write_bytes(b"not a database at all\n" * 100)
    store = Store(inventory(1), capacity=10)
    store.append(snapshot(NOW - 2, view(NOW - 2, use(A, TRAIN, (0, 300 * MIB, 10.0)))))
    executor = ThreadPoolExecutor(1)
    ctx = AppContext(store=store, interval_s=1.0, history=SqliteHistory(path), history_executor=executor,
                     clock=lambda: NOW)
    try:
        with page_server(ctx) as (url, _loop):
            session = pull_session(url=url)
            try:
                receive_until(session, lambda: message(session).visible is True and A in lines(session))
                assert message(session).text.startswith("The history could not be read: ")
                assert str(path) in message(session).text
                assert "\n" not in message(session).text
                assert lines(session)[A] == {"time": [(NOW - 2) * 1e3], "memory": [300.0 * MIB], "title": [TRAIN]}
            finally:
                session.close()
    finally:
        executor.shutdown()
