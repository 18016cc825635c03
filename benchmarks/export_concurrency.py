"""A page's history query while big exports run: ``/api/history.json`` latency alone and under four exports.

    python benchmarks/export_concurrency.py [--repeat 5] [--exports 4]

Writes a week of readings of 8 GPUs (one a minute) through nvdash's own writer, replays it with ``nvdash replay``
and, ``--repeat`` times each, measures a 1 h ``/api/history.json`` query: alone, then issued once ``--exports``
concurrent ``/export.csv`` downloads of the whole week have started. Prints the best, median and worst query
latency in milliseconds, and how long the exports took.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import free_port, nvdash_env, stop_process
from tests.history_week import write_week

END_S = 1_790_000_000.0
QUERY = "/api/history.json?metric=utilization_pct&range=1h"


def get(port: int, target: str) -> bytes:
    """The body of ``GET target``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"{target}: {response.status} {body[:200]!r}")
        return body
    finally:
        connection.close()


def timed_query(port: int) -> float:
    started = time.perf_counter()
    get(port, QUERY)
    return (time.perf_counter() - started) * 1000


def under_exports(port: int, exports: int) -> tuple[float, float]:
    """A query's latency issued right after ``exports`` downloads began, and the exports' total time."""
    started = time.perf_counter()
    threads = [threading.Thread(target=get, args=(port, "/export.csv?range=7d")) for _ in range(exports)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # the exports are under way (this is a measurement, not a test)
    latency = timed_query(port)
    for thread in threads:
        thread.join()
    return latency, time.perf_counter() - started


def row(name: str, values: list[float]) -> str:
    return f"{name:<28} {min(values):>9.0f} {statistics.median(values):>9.0f} {max(values):>9.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--exports", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "week.sqlite"
        write_week(path, END_S)
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "nvdash", "replay", str(path), "--port", str(port)],
                                   env=nvdash_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    get(port, "/health")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            alone = [timed_query(port) for _ in range(args.repeat)]
            loaded = [under_exports(port, args.exports) for _ in range(args.repeat)]
        finally:
            stop_process(process)
    print(f"{'1 h query latency (ms)':<28} {'best':>9} {'median':>9} {'worst':>9}")
    print(row("alone", alone))
    print(row(f"under {args.exports} exports of 7 d", [latency for latency, _ in loaded]))
    print(row(f"the {args.exports} exports (ms)", [seconds * 1000 for _, seconds in loaded]))


if __name__ == "__main__":
    main()
