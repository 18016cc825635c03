"""How nvdash's cost grows with viewers: starts ``python -m nvdash --simulate dgx-h100`` and opens V viewers,
each a bokeh.client session on all seven dashboards, and prints a table.

    python benchmarks/viewers.py [--viewers 1 10 50] [--window 20] [--soak 300] [--per-worker 10]

Columns: NVML calls per second (counted by the fake NVML library), server CPU seconds per wall second, the
longest event-loop stall during the window, websocket bytes received per viewer per second (counted on the
client side), server RSS at the end of the window. The soak phase keeps the largest viewer count connected
for ``--soak`` seconds and prints RSS over time (flat means no leak).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from nvdash.apps import APPS

ROUTES = [spec.route for spec in APPS]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(url: str, reset: bool = False) -> Any:
    with urllib.request.urlopen(url + "/health" + ("?reset=1" if reset else ""), timeout=30) as response:
        return json.loads(response.read())


def run_worker(url: str, viewers: int, ready_file: str, control_file: str, result_file: str) -> None:
    """Hold ``viewers`` x 7 sessions, each applying its updates in a thread; report bytes received."""
    from bokeh.client import pull_session
    from bokeh.client.websocket import WebSocketClientConnectionWrapper

    lock = threading.Lock()
    received = [0]
    original = WebSocketClientConnectionWrapper.read_message

    async def counting(self: Any, callback: Any = None) -> Any:
        message = await original(self, callback)
        if message is not None:
            with lock:
                received[0] += len(message)
        return message

    WebSocketClientConnectionWrapper.read_message = counting  # type: ignore[method-assign]
    stop = threading.Event()
    failures: list[str] = []

    def view(route: str, opened: threading.Event) -> None:
        try:
            session = pull_session(url=url + route)
        except OSError as error:
            failures.append(f"{route}: {error}")
            opened.set()
            return
        opened.set()
        # bokeh.client applies pushed updates only while its connection's loop runs, and each message it
        # applies nests one call deeper: run the loop in slices of a few seconds until told to stop.
        while not stop.is_set():
            end = time.monotonic() + 5.0
            session._connection._loop_until(lambda end=end: stop.is_set() or time.monotonic() >= end)
        session.close()

    threads = []
    for _ in range(viewers):
        for route in ROUTES:
            # One session at a time, as people open panes: the server builds each document on its event loop.
            opened = threading.Event()
            thread = threading.Thread(target=view, args=(route, opened), daemon=True)
            thread.start()
            opened.wait(120)
            threads.append(thread)
            if failures:
                stop.set()
                raise SystemExit(f"a viewer could not connect: {failures[0]}")
    control = Path(control_file)
    Path(ready_file).write_text("ready")
    while control.read_text() != "measure":
        time.sleep(0.05)
    start_bytes, started = received[0], time.monotonic()
    while control.read_text() == "measure":
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    Path(result_file).write_text(json.dumps({"bytes": received[0] - start_bytes, "seconds": elapsed}))
    stop.set()
    for thread in threads:
        thread.join(10)


class Viewers:
    """``count`` viewers spread over client processes; ``measure()`` and ``stop()`` steer them all."""

    def __init__(self, url: str, count: int, per_worker: int, workdir: Path, tag: str) -> None:
        self.count = count
        self._control = workdir / f"control-{tag}"
        self._control.write_text("warmup")
        chunks = [per_worker] * (count // per_worker) + ([count % per_worker] if count % per_worker else [])
        self._workers: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
        for i, size in enumerate(chunks):
            ready, result = workdir / f"ready-{tag}-{i}", workdir / f"result-{tag}-{i}"
            command = [
                sys.executable,
                __file__,
                "--worker",
                url,
                str(size),
                str(ready),
                str(self._control),
                str(result),
            ]
            self._workers.append((subprocess.Popen(command), ready, result))
        deadline = time.monotonic() + 300
        while not all(ready.exists() for _, ready, _ in self._workers):
            if time.monotonic() > deadline or any(p.poll() is not None for p, _, _ in self._workers):
                raise SystemExit("viewers failed to connect")
            time.sleep(0.2)

    def measure(self) -> None:
        """Start counting received bytes."""
        self._control.write_text("measure")

    def stop(self) -> float:
        """Disconnect everyone; returns websocket bytes per viewer per second while measuring."""
        self._control.write_text("stop")
        total, seconds = 0.0, []
        for process, _, result in self._workers:
            process.wait(120)
            data = json.loads(result.read_text())
            total += data["bytes"]
            seconds.append(data["seconds"])
        return total / self.count / (sum(seconds) / len(seconds))


def measure(url: str, server: psutil.Process, viewers: Viewers, window_s: float) -> dict[str, float]:
    """Measure the server over ``window_s`` seconds with ``viewers`` connected, then disconnect them."""
    time.sleep(3.0)
    viewers.measure()
    first = _health(url, reset=True)
    cpu_first = sum(server.cpu_times()[:2])
    started = time.monotonic()
    time.sleep(window_s)
    last = _health(url, reset=True)
    cpu_last = sum(server.cpu_times()[:2])
    elapsed = time.monotonic() - started
    rss = server.memory_info().rss / 2**20
    return {
        "viewers": viewers.count,
        "sessions": last["sessions"],
        "nvml_calls_per_s": (last["fake_nvml_calls"] - first["fake_nvml_calls"]) / elapsed,
        "sweeps_per_s": (last["sampler"]["sweeps"] - first["sampler"]["sweeps"]) / elapsed,
        "cpu_s_per_s": (cpu_last - cpu_first) / elapsed,
        "max_stall_ms": last["event_loop"]["window_max_lag_ms"],
        "ws_bytes_per_viewer_s": viewers.stop(),
        "rss_mib": rss,
    }


def soak(server: psutil.Process, viewers: Viewers, seconds: float) -> list[tuple[float, float]]:
    """Keep viewers connected for ``seconds`` and sample the server's RSS every tenth of it."""
    viewers.measure()
    samples = []
    started = time.monotonic()
    for step in range(11):
        time.sleep(max(0.0, started + seconds * step / 10 - time.monotonic()))
        samples.append((time.monotonic() - started, server.memory_info().rss / 2**20))
    viewers.stop()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per viewer count")
    parser.add_argument("--soak", type=float, default=300.0, help="seconds of the RSS soak (0 to skip)")
    parser.add_argument("--per-worker", type=int, default=10, help="viewers per client process")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        url, count, ready, stop, result = args.worker
        run_worker(url, int(count), ready, stop, result)
        return

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVDASH_")}
    command = [sys.executable, "-m", "nvdash", "--simulate", "dgx-h100", "--port", str(port)]
    command += ["--interval", str(args.interval)]
    # History on, as by default, but in a file of its own: a benchmark never writes into the user's history.
    command += ["--history", str(Path(tempfile.mkdtemp(prefix="nvdash-bench-")) / "history.sqlite")]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    process = psutil.Process(server.pid)
    try:
        for _ in range(300):
            try:
                _health(url)
                break
            except OSError:
                time.sleep(0.1)
        print(f"# nvdash --simulate dgx-h100 --interval {args.interval}; {psutil.cpu_count()} CPUs", end="")
        print(f"; {args.window:g} s per row")
        header = (
            f"| {'viewers':>7} | {'sessions':>8} | {'NVML calls/s':>12} | {'sweeps/s':>8} | {'server CPU s/s':>14} "
            f"| {'max loop stall ms':>17} | {'ws bytes/viewer/s':>17} | {'RSS MiB':>7} |"
        )
        print(header)
        print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            for viewers in args.viewers:
                group = Viewers(url, viewers, args.per_worker, workdir, f"v{viewers}")
                row = measure(url, process, group, args.window)
                print(
                    f"| {row['viewers']:>7.0f} | {row['sessions']:>8.0f} | {row['nvml_calls_per_s']:>12.1f} "
                    f"| {row['sweeps_per_s']:>8.2f} | {row['cpu_s_per_s']:>14.3f} | {row['max_stall_ms']:>17.1f} "
                    f"| {row['ws_bytes_per_viewer_s']:>17.0f} | {row['rss_mib']:>7.1f} |",
                    flush=True,
                )
            if args.soak > 0:
                viewers = max(args.viewers)
                print(f"\n# RSS over a {args.soak:g} s soak with {viewers} viewers")
                print("| seconds | RSS MiB |")
                print("|--------:|--------:|")
                group = Viewers(url, viewers, args.per_worker, workdir, "soak")
                for seconds, rss in soak(process, group, args.soak):
                    print(f"| {seconds:>7.0f} | {rss:>7.1f} |", flush=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
