"""How long opening a pane holds up everyone else: starts ``python -m nvdash --simulate dgx-h100`` with a
0.1 s interval, waits until the store is full (1200 samples), then opens one session per dashboard with
``bokeh.client`` and prints the open time and the longest event-loop stall the server saw meanwhile.

    python benchmarks/open_stall.py
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bokeh.client import pull_session

from nvdash.apps import APPS

ROUTES = [spec.route for spec in APPS]


def main() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    # History on, as by default, but in a file of its own: a benchmark never writes into the user's history.
    history = Path(tempfile.mkdtemp(prefix="nvdash-bench-")) / "history.sqlite"
    command = [sys.executable, "-m", "nvdash", "--simulate", "dgx-h100", "--port", str(port), "--interval", "0.1",
               "--history", str(history)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def health(reset: bool = False) -> Any:
        with urllib.request.urlopen(url + "/health" + ("?reset=1" if reset else ""), timeout=30) as response:
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
        print(f"| {'route':<20} | {'open ms':>7} | {'longest loop stall ms':>21} |")
        print(f"|{'-' * 22}|{'-' * 9}|{'-' * 23}|")
        for route in ROUTES:
            time.sleep(0.3)
            health(reset=True)
            started = time.perf_counter()
            session = pull_session(url=url + route)
            opened_ms = (time.perf_counter() - started) * 1000
            time.sleep(0.3)
            stall = health()["event_loop"]["window_max_lag_ms"]
            print(f"| {route:<20} | {opened_ms:>7.0f} | {stall:>21.1f} |", flush=True)
            session.close()
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
