"""How nvdash's cost grows with viewers: starts ``python -m nvdash --simulate dgx-h100`` and opens V viewers,
each a bokeh.client session on every dashboard of ``/index.json``, and prints a table.

    python benchmarks/viewers.py [--viewers 1 10 50] [--window 20] [--per-worker 10] [--probe 0.25]
                                 [--soak 300] [--soak-viewers 20] [--soak-rows 10] [--routes all|classic|/A /B ...]
                                 [--profile FILE]

``--routes all`` (the default) opens every dashboard of ``/index.json``, ``--routes classic`` the seven classic
ones. Every viewer's session reads every websocket message and applies it to its client document, as a browser
does. Columns: NVML calls per second (counted by the fake NVML library), server CPU seconds per wall second, the
worst and the p99 event-loop stall during the window (``/health?since=`` is read every ``--probe`` seconds: the
p99 is over those slices' worst stalls, so it is an upper bound of the p99 of the server's 50 ms probe),
websocket bytes and messages received per session per second (counted on the client side), server RSS at the end
of the window. The soak phase keeps ``--soak-viewers`` viewers (default: the
largest count) connected for ``--soak`` seconds and prints, ``--soak-rows`` times, the server's sessions, RSS,
threads and open file descriptors (``/proc/<pid>/status`` and ``/proc/<pid>/fd``; flat means no leak), then
closes them and prints the same once Bokeh has discarded their sessions.
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
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.routes import CLASSIC
from benchmarks.settle import QUIET_MS, QUIET_S, wait_until_settled

SOAK_HEADER = f"| {'seconds':>7} | {'sessions':>8} | {'RSS MiB':>7} | {'threads':>7} | {'open fds':>8} |"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(url: str, since: float | None = None) -> Any:
    """``/health``; with ``since`` (an earlier answer's ``event_loop.at``), the longest loop stall after it."""
    query = "" if since is None else f"?since={since!r}"
    with urllib.request.urlopen(url + "/health" + query, timeout=30) as response:
        return json.loads(response.read())


def _nvml_calls(url: str) -> int:
    """The simulated library's call count (``/api/simulation.json``, served under ``--simulate`` only; a server
    older than that route had it in ``/health``, so a run can compare with one)."""
    try:
        with urllib.request.urlopen(url + "/api/simulation.json", timeout=30) as response:
            return int(json.loads(response.read())["fake_nvml_calls"])
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
    return int(_health(url)["fake_nvml_calls"])


def _routes(url: str) -> list[str]:
    """The dashboards this server serves."""
    with urllib.request.urlopen(url + "/index.json", timeout=30) as response:
        return list(json.loads(response.read()))


def resolve_routes(url: str, names: list[str]) -> list[str]:
    """``all``: every dashboard of ``/index.json``; ``classic``: the seven classic ones; else the routes given."""
    if names == ["all"]:
        return _routes(url)
    if names == ["classic"]:
        return list(CLASSIC)
    return names


def run_worker(url: str, viewers: int, ready_file: str, control_file: str, result_file: str, *,
               routes: list[str] | None = None) -> None:
    """Hold ``viewers`` x ``routes`` sessions (default: every dashboard), each applying its updates in a thread;
    report bytes received."""
    from bokeh.client import pull_session
    from bokeh.client.websocket import WebSocketClientConnectionWrapper

    lock = threading.Lock()
    received = [0, 0]
    original = WebSocketClientConnectionWrapper.read_message

    async def counting(self: Any, callback: Any = None) -> Any:
        message = await original(self, callback)
        if message is not None:
            with lock:
                received[0] += len(message)
                received[1] += 1
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
    routes = routes or _routes(url)
    for _ in range(viewers):
        for route in routes:
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
    start_bytes, start_frames, started = received[0], received[1], time.monotonic()
    while control.read_text() == "measure":
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    Path(result_file).write_text(json.dumps({"bytes": received[0] - start_bytes, "frames": received[1] - start_frames,
                                             "sessions": len(threads), "seconds": elapsed}))
    stop.set()
    deadline = time.monotonic() + 30  # the result is written: a session slow to close must not hold the run up
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


class Viewers:
    """``count`` viewers spread over client processes; ``measure()`` and ``stop()`` steer them all."""

    def __init__(self, url: str, count: int, per_worker: int, workdir: Path, tag: str, *,
                 routes: list[str] | None = None) -> None:
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
                *(routes or []),
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

    def stop(self) -> tuple[float, float]:
        """Disconnect everyone; returns websocket bytes per viewer per second and websocket frames per session per
        second while measuring."""
        self._control.write_text("stop")
        total, frames, sessions, seconds = 0.0, 0.0, 0, []
        for process, _, result in self._workers:
            process.wait(120)
            data = json.loads(result.read_text())
            total += data["bytes"]
            frames += data["frames"]
            sessions += data["sessions"]
            seconds.append(data["seconds"])
        mean_s = sum(seconds) / len(seconds)
        return total / self.count / mean_s, frames / max(1, sessions) / mean_s


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank ``fraction`` percentile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(fraction * len(ordered) + 0.999999) - 1))]


def stalls_over(url: str, window_s: float, probe_s: float) -> list[float]:
    """The worst event-loop stall (ms) of each ``probe_s`` slice of the next ``window_s`` seconds."""
    stalls = []
    at = _health(url)["event_loop"]["at"]
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        time.sleep(min(probe_s, max(0.0, end - time.monotonic())))
        loop = _health(url, since=at)["event_loop"]
        stalls.append(float(loop["max_lag_since_ms"]))
        at = loop["at"]
    return stalls


def measure(url: str, server: psutil.Process, viewers: Viewers, window_s: float, sessions: int, *,
            probe_s: float = 0.25) -> dict[str, float]:
    """Measure the server over ``window_s`` seconds with ``viewers`` connected (once their ``sessions`` are open
    and built: the loop quiet), then disconnect them."""
    if not wait_until_settled(lambda since=None: _health(url, since), sessions):
        print(f"# {viewers.count} viewers: the event loop never stayed under {QUIET_MS:g} ms lag for {QUIET_S:g} s;"
              " measured anyway")
    viewers.measure()
    first = _health(url)
    first_calls = _nvml_calls(url)
    cpu_first = sum(server.cpu_times()[:2])
    started = time.monotonic()
    stalls = stalls_over(url, window_s, probe_s)
    last = _health(url, since=first["event_loop"]["at"])
    last_calls = _nvml_calls(url)
    cpu_last = sum(server.cpu_times()[:2])
    elapsed = time.monotonic() - started
    rss = server.memory_info().rss / 2**20
    bytes_per_viewer_s, frames_per_session_s = viewers.stop()
    return {
        "viewers": viewers.count,
        "sessions": last["sessions"],
        "nvml_calls_per_s": (last_calls - first_calls) / elapsed,
        "sweeps_per_s": (last["sampler"]["sweeps"] - first["sampler"]["sweeps"]) / elapsed,
        "cpu_s_per_s": (cpu_last - cpu_first) / elapsed,
        "max_stall_ms": max([last["event_loop"]["max_lag_since_ms"], *stalls]),
        "p99_stall_ms": percentile(stalls, 0.99),
        "ws_bytes_per_viewer_s": bytes_per_viewer_s,
        "ws_frames_per_session_s": frames_per_session_s,
        "rss_mib": rss,
    }


def process_counts(pid: int) -> tuple[float, int, int]:
    """A process's resident memory (MiB), threads and open file descriptors, from ``/proc``."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    rss_mib = int(fields["VmRSS"].split()[0]) / 1024
    return rss_mib, int(fields["Threads"]), len(os.listdir(f"/proc/{pid}/fd"))


def soak_row(url: str, pid: int, label: str) -> str:
    """One line of the soak table: the server's sessions, RSS, threads and open file descriptors now."""
    sessions = _health(url)["sessions"]
    rss_mib, threads, fds = process_counts(pid)
    return f"| {label:>7} | {sessions:>8} | {rss_mib:>7.1f} | {threads:>7} | {fds:>8} |"


def wait_sessions_gone(url: str, timeout_s: float = 120.0) -> None:
    """Wait until Bokeh has discarded every session (10 to 15 s after its viewer left)."""
    deadline = time.monotonic() + timeout_s
    while _health(url)["sessions"] > 0 and time.monotonic() < deadline:
        time.sleep(1.0)


def soak(url: str, pid: int, viewers: Viewers, seconds: float, rows: int) -> None:
    """Keep ``viewers`` connected for ``seconds``, printing a row of :func:`soak_row` ``rows`` times (and at the
    start); then close them and print a last row once Bokeh has discarded their sessions (10 to 15 s)."""
    viewers.measure()
    started = time.monotonic()
    for step in range(rows + 1):
        time.sleep(max(0.0, started + seconds * step / rows - time.monotonic()))
        print(soak_row(url, pid, f"{time.monotonic() - started:.0f}"), flush=True)
    viewers.stop()
    wait_sessions_gone(url)
    print(soak_row(url, pid, "closed"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per viewer count")
    parser.add_argument("--soak", type=float, default=300.0, help="seconds of the soak (0 to skip)")
    parser.add_argument("--soak-viewers", type=int, default=None, help="viewers during the soak (default: the most)")
    parser.add_argument("--soak-rows", type=int, default=10, help="rows printed during the soak")
    parser.add_argument("--per-worker", type=int, default=10, help="viewers per client process")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--profile", default=None,
                        help="run the server under cProfile and write its event loop's profile here on exit")
    parser.add_argument("--probe", type=float, default=0.25, help="seconds between two reads of the loop stall")
    parser.add_argument("--routes", nargs="+", default=["all"],
                        help="the dashboards each viewer opens: all (every one of /index.json, the default), "
                             "classic (the seven classic ones) or routes")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        url, count, ready, stop, result, *routes = args.worker
        run_worker(url, int(count), ready, stop, result, routes=routes)
        return

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVDASH_")}
    profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
    command = [sys.executable, *profile, "-m", "nvdash", "--simulate", "dgx-h100", "--port", str(port)]
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
        routes = resolve_routes(url, args.routes)
        print(f"# nvdash --simulate dgx-h100 --interval {args.interval}; {psutil.cpu_count()} CPUs", end="")
        print(f"; {args.window:g} s per row; {len(routes)} dashboards per viewer: {' '.join(routes)}")
        header = (
            f"| {'viewers':>7} | {'sessions':>8} | {'NVML calls/s':>12} | {'sweeps/s':>8} | {'server CPU s/s':>14} "
            f"| {'worst stall ms':>14} | {'p99 stall ms':>12} | {'ws bytes/viewer/s':>17} "
            f"| {'msgs/session/s':>14} | {'RSS MiB':>7} |"
        )
        print(header)
        print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            for viewers in args.viewers:
                group = Viewers(url, viewers, args.per_worker, workdir, f"v{viewers}", routes=routes)
                row = measure(url, process, group, args.window, viewers * len(routes), probe_s=args.probe)
                print(
                    f"| {row['viewers']:>7.0f} | {row['sessions']:>8.0f} | {row['nvml_calls_per_s']:>12.1f} "
                    f"| {row['sweeps_per_s']:>8.2f} | {row['cpu_s_per_s']:>14.3f} | {row['max_stall_ms']:>14.1f} "
                    f"| {row['p99_stall_ms']:>12.1f} | {row['ws_bytes_per_viewer_s']:>17.0f} "
                    f"| {row['ws_frames_per_session_s']:>14.2f} | {row['rss_mib']:>7.1f} |",
                    flush=True,
                )
            if args.soak > 0:
                viewers = args.soak_viewers or max(args.viewers)
                print(f"\n# A {args.soak:g} s soak with {viewers} viewers (a session per dashboard each)")
                print(SOAK_HEADER)
                print("|" + "|".join("-" * (len(cell) - 1) + ":" for cell in SOAK_HEADER.split("|")[1:-1]) + "|")
                wait_sessions_gone(url)
                print(soak_row(url, server.pid, "before"), flush=True)
                group = Viewers(url, viewers, args.per_worker, workdir, "soak", routes=routes)
                soak(url, server.pid, group, args.soak, max(1, args.soak_rows))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
