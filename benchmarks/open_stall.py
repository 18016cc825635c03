"""How long opening a pane holds up everyone else: starts ``python -m nvdash --simulate dgx-h100`` with a
0.1 s interval, waits until the store is full (1200 samples), then opens one session per dashboard with
``bokeh.client`` and prints the open time and the longest event-loop stall the server saw meanwhile.

    python benchmarks/open_stall.py [--viewers 10] [--repeat 3] [--settle 2]

With ``--viewers N``, N viewers (a client process holding a session on each of the seven classic dashboards,
applying every update) watch before the panes are opened; measuring starts once all their sessions are open and
the event loop has been quiet (no lag over 50 ms) for 5 s. Each route (default: every dashboard the server
lists in ``/index.json``) is opened ``--repeat`` times; the stall is measured from the request until ``--settle``
seconds after the session opened (pages built in stages send their plots after the document), and the table
gives the median and the largest of the repeats. The first row measures the same window with nothing opened:
the stalls the viewers' own updates cause.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bokeh.client import pull_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.routes import CLASSIC
from benchmarks.settle import QUIET_MS, QUIET_S, wait_until_settled

VIEWERS = """
import sys, threading, time
from bokeh.client import pull_session
url, count, routes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def view(route):
    session = pull_session(url=url + route)
    while True:
        end = time.monotonic() + 5
        session._connection._loop_until(lambda: time.monotonic() >= end)
for _ in range(count):
    for route in routes:
        threading.Thread(target=view, args=(route,), daemon=True).start()
        time.sleep(0.05)
print("ready", flush=True)
threading.Event().wait()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, default=0, help="viewers watching the seven classic dashboards")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds measured after a session opened")
    parser.add_argument("--routes", nargs="*", default=None, help="default: every route of /index.json")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    # History on, as by default, but in a file of its own: a benchmark never writes into the user's history.
    history = Path(tempfile.mkdtemp(prefix="nvdash-bench-")) / "history.sqlite"
    command = [sys.executable, "-m", "nvdash", "--simulate", "dgx-h100", "--port", str(port), "--interval", "0.1",
               "--history", str(history)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def health(since: float | None = None) -> Any:
        query = "" if since is None else f"?since={since!r}"
        with urllib.request.urlopen(url + "/health" + query, timeout=30) as response:
            return json.loads(response.read())

    try:
        for _ in range(300):
            try:
                health()
                break
            except OSError:
                time.sleep(0.2)
        while health()["store"]["rows"] < health()["store"]["capacity"]:
            time.sleep(1.0)
        watchers = None
        if args.viewers:
            watchers = subprocess.Popen([sys.executable, "-c", VIEWERS, url, str(args.viewers), *CLASSIC],
                                        stdout=subprocess.PIPE, text=True)
            assert watchers.stdout is not None
            watchers.stdout.readline()
            if not wait_until_settled(health, args.viewers * len(CLASSIC)):
                print(f"# the event loop never stayed under {QUIET_MS:g} ms lag for {QUIET_S:g} s; measuring anyway")
        routes = args.routes
        if routes is None:
            with urllib.request.urlopen(url + "/index.json", timeout=30) as response:
                routes = list(json.loads(response.read()))
        print(f"{args.viewers} viewers watching; store full; {args.repeat} opens per route")
        print(f"| {'route':<20} | {'open ms (median)':>16} | {'loop stall ms (median / max)':>28} |")
        print(f"|{'-' * 22}|{'-' * 18}|{'-' * 30}|")
        try:
            stalls = []
            for _ in range(args.repeat):  # the same window with nothing opened: what the viewers alone cause
                time.sleep(0.5)
                before = health()["event_loop"]["at"]
                time.sleep(args.settle)
                stalls.append(health(since=before)["event_loop"]["max_lag_since_ms"])
            stall = f"{statistics.median(stalls):.1f} / {max(stalls):.1f}"
            print(f"| {'(nothing opened)':<20} | {'':>16} | {stall:>28} |", flush=True)
            for route in routes:
                opens, stalls = [], []
                for _ in range(args.repeat):
                    time.sleep(0.5)
                    before = health()["event_loop"]["at"]
                    started = time.perf_counter()
                    session = pull_session(url=url + route)
                    opens.append((time.perf_counter() - started) * 1000)
                    time.sleep(args.settle)
                    stalls.append(health(since=before)["event_loop"]["max_lag_since_ms"])
                    session.close()
                stall = f"{statistics.median(stalls):.1f} / {max(stalls):.1f}"
                print(f"| {route:<20} | {statistics.median(opens):>16.0f} | {stall:>28} |", flush=True)
        finally:
            if watchers is not None:
                watchers.kill()
                watchers.wait(10)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
