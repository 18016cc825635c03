"""How long a 7-day range of 8 GPUs takes to show: the server's query, and the whole thing in chromium.

    python benchmarks/history_render.py [--repeat 5]

Writes a week of readings (one a minute, with a 6-hour gap) through nvdash's own writer, starts a server on it,
and measures, ``--repeat`` times each:

- query: ``SqliteHistory.query`` for GPU Resources' four metrics over 7 days (what the server runs off its event
  loop when the range is chosen);
- api: ``GET /api/history.json?metric=utilization_pct&range=7d`` end to end;
- switch: in chromium, from choosing "Last 7 d" on a live GPU Resources page until the status line says the
  range is shown and the browser has painted twice since;
- open: loading ``/GPU-Resources?range=7d`` until the same point;
- open live: loading ``/GPU-Resources`` (Live) until its status says live and it has painted, for comparison.

Prints the best, median and worst of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvdash.history.query import SqliteHistory
from tests.browser.chromium import CHROMIUM_ARGS, chromium_path
from tests.conftest import free_port
from tests.history_week import write_week

METRICS = ["utilization_pct", "memory_used_bytes", "pcie_bytes_per_s", "nvlink_bytes_per_s"]
SHOWN = "last 7 d · 10 min buckets"
PAINTED_JS = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"


def _timed(run: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000.0)
    return times


def _row(name: str, times: list[float]) -> str:
    return f"| {name:<9} | {min(times):>9.1f} | {statistics.median(times):>9.1f} | {max(times):>9.1f} |"


def _wait_shown(page: Page) -> None:
    page.get_by_text(SHOWN).wait_for(timeout=60_000)
    page.evaluate(PAINTED_JS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp(prefix="nvdash-bench-")) / "history.sqlite"
    end = time.time()
    write_week(path, end)
    history = SqliteHistory(path)
    query = _timed(lambda: history.query(METRICS, end - 7 * 86_400, end), args.repeat)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "nvdash", "--simulate", "dgx-h100", "--port", str(port),
                               "--history", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=5).read()
                break
            except OSError:
                time.sleep(0.1)

        def api() -> None:
            with urllib.request.urlopen(url + "/api/history.json?metric=utilization_pct&range=7d", timeout=30) as r:
                json.loads(r.read())

        api_times = _timed(api, args.repeat)
        switch: list[float] = []
        opened: list[float] = []
        opened_live: list[float] = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            for _ in range(args.repeat):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                started = time.perf_counter()
                page.goto(url + "/GPU-Resources", wait_until="commit")
                page.get_by_text("live", exact=True).wait_for(timeout=60_000)
                page.wait_for_selector("canvas", state="attached")
                page.evaluate(PAINTED_JS)
                opened_live.append((time.perf_counter() - started) * 1000.0)
                page.get_by_role("button", name="Live").click()
                item = page.get_by_text("Last 7 d", exact=True)
                item.wait_for()
                started = time.perf_counter()
                item.click()
                _wait_shown(page)
                switch.append((time.perf_counter() - started) * 1000.0)
                page.close()
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                started = time.perf_counter()
                page.goto(url + "/GPU-Resources?range=7d", wait_until="commit")
                _wait_shown(page)
                opened.append((time.perf_counter() - started) * 1000.0)
                page.close()
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
    print(f"# 7 days x 8 GPUs ({path.stat().st_size / 1e6:.0f} MB file), {args.repeat} runs each, milliseconds")
    print(f"| {'what':<9} | {'best':>9} | {'median':>9} | {'worst':>9} |")
    print(f"|{'-' * 11}|{'-' * 11}|{'-' * 11}|{'-' * 11}|")
    rows = (("query", query), ("api", api_times), ("switch", switch), ("open", opened), ("open live", opened_live))
    for name, times in rows:
        print(_row(name, times))


if __name__ == "__main__":
    main()
