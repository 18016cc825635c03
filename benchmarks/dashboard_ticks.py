"""What one live update costs the server, per dashboard: builds ``--sessions`` documents of every dashboard on the
real runtime of ``--simulate dgx-h100`` (store, accounting, history), then for ``--ticks`` sweeps runs each
document's periodic callbacks as the server's event loop would and turns the changes into the PATCH-DOC message
the server would send, timing each dashboard with ``time.process_time`` (CPU, so a busy machine skews it little).

    python benchmarks/dashboard_ticks.py [--sessions 10] [--ticks 60] [--fill 600] [--routes /A /B ...]
                                         [--profile FILE]

Columns per dashboard: CPU ms per session per tick, the same without building the messages, messages and their
bytes per session per tick, and the CPU of building a document (all its stages at once), the first of the route and
the median. ``--profile FILE`` writes a cProfile of the ticks (``python -m pstats FILE``).
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bokeh.document import Document
from bokeh.protocol import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvdash.apps.context import AppContext
from nvdash.apps.registry import available_apps
from nvdash.server.run import start_runtime
from nvdash.settings import Settings


@dataclass
class Route:
    """One dashboard's documents and what their ticks cost."""

    route: str
    docs: list[Document]
    events: list[list[Any]]
    callbacks_s: float = 0.0
    messages_s: float = 0.0
    messages: int = 0
    message_bytes: int = 0
    due: dict[int, float] = field(default_factory=dict)
    builds_s: list[float] = field(default_factory=list)


def run_callbacks(doc: Document, now_ms: float, due: dict[int, float], events: list[Any]) -> list[Any]:
    """Run ``doc``'s periodic callbacks that are due at ``now_ms`` (a simulated clock); return the changes (which
    the document's change listener appended to ``events``)."""
    events.clear()
    for callback in list(doc.session_callbacks):
        period = getattr(callback, "period", None)
        if period is None:
            continue
        key = id(callback)
        if due.get(key, 0.0) <= now_ms:
            due[key] = now_ms + period
            callback.callback()
    return list(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10, help="documents per dashboard")
    parser.add_argument("--ticks", type=int, default=60, help="sweeps measured")
    parser.add_argument("--fill", type=int, default=600, help="sweeps taken before the documents are built")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--routes", nargs="+", default=None, help="default: every dashboard offered")
    parser.add_argument("--profile", default=None, help="write a cProfile of the ticks here")
    args = parser.parse_args()

    history = Path(tempfile.mkdtemp(prefix="nvdash-bench-")) / "history.sqlite"
    settings = Settings(simulate="dgx-h100", interval_s=args.interval, history_path=str(history))
    hardware, runtime = start_runtime(settings)
    sampler = runtime.sampler
    assert sampler is not None
    for _ in range(args.fill):
        sampler.sample_once()
    ctx = AppContext(store=runtime.store, interval_s=args.interval, history=runtime.history.backend,
                     history_executor=runtime.history.executor, clock=runtime.history.clock,
                     accounting=runtime.accounting)
    protocol = Protocol()
    routes = []
    for spec in available_apps(runtime.store.inventory):
        if args.routes and spec.route not in args.routes:
            continue
        docs, changes, builds = [], [], []
        for _ in range(args.sessions):
            doc = Document()
            started = time.process_time()
            spec.build(doc, ctx)
            builds.append(time.process_time() - started)
            events: list[Any] = []
            doc.on_change(events.append)
            docs.append(doc)
            changes.append(events)
        routes.append(Route(spec.route, docs, changes, builds_s=builds))
    profiler = cProfile.Profile() if args.profile else None
    now_ms = 0.0
    for tick in range(args.ticks + 2):
        sampler.sample_once()
        now_ms += args.interval * 1000
        measured = tick >= 2  # the first ticks catch up with the rows taken while the pages were built
        for route in routes:
            for doc, changes in zip(route.docs, route.events, strict=True):
                if profiler is not None and measured:
                    profiler.enable()
                started = time.process_time()
                events = run_callbacks(doc, now_ms, route.due, changes)
                called = time.process_time()
                if events:
                    message = protocol.create("PATCH-DOC", events)
                    size = len(message.header_json) + len(message.content_json) + sum(
                        len(buffer.data) for buffer in message.buffers)
                done = time.process_time()
                if profiler is not None and measured:
                    profiler.disable()
                if measured:
                    route.callbacks_s += called - started
                    route.messages_s += done - called
                    if events:
                        route.messages += 1
                        route.message_bytes += size
    if profiler is not None:
        profiler.dump_stats(args.profile)
    per = args.sessions * args.ticks
    print(f"# --simulate dgx-h100, {args.fill} rows before, {args.sessions} sessions per dashboard, {args.ticks} ticks"
          f" of {args.interval:g} s; CPU (process_time) per session per tick")
    header = (f"| {'dashboard':<20} | {'CPU ms':>7} | {'callbacks ms':>12} | {'message ms':>10} | {'msgs':>5} "
              f"| {'bytes':>7} | {'build ms first / median':>23} |")
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    total = 0.0
    for route in routes:
        cost = (route.callbacks_s + route.messages_s) / per * 1000
        total += cost
        print(f"| {route.route:<20} | {cost:>7.3f} | {route.callbacks_s / per * 1000:>12.3f} "
              f"| {route.messages_s / per * 1000:>10.3f} | {route.messages / per:>5.2f} "
              f"| {route.message_bytes / per:>7.0f} "
              f"| {route.builds_s[0] * 1000:>10.1f} / {statistics.median(route.builds_s) * 1000:>10.1f} |")
    print(f"| {'all':<20} | {total:>7.3f} | {'':>12} | {'':>10} | {'':>5} | {'':>7} | {'':>23} |")
    runtime.history.close()
    if hardware is not None:
        hardware.close()


if __name__ == "__main__":
    main()
