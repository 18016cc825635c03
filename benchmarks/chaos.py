"""nvdash under faults: one real server (``python -m nvdash --simulate dgx-h100``, its clock under libfaketime),
watched by viewers, while faults are injected one after another; prints a markdown table.

    python benchmarks/chaos.py [--viewers 10] [--quick] [--interval 0.5]

The server gets a history file, a job-mapping directory and a Prometheus of the script's own (on loopback) that
can answer well, answer a malformed shape, or drip bytes. Faults, in order: a FIFO and a symbolic link to
/dev/zero in the mapping directory; a stuck sampler (the fake NVML's ``hang_host:PATH`` while PATH exists);
Prometheus malformed, then dripping (each followed by a good answer); the wall clock 7 days ahead, then back;
a 95 MB POST; 200 half-sent requests; a DNS-rebinding Host header; markup in query strings.

Columns: how long until /health said so ("n/a" where it is not meant to change), how long until it recovered (for
the client-side faults: until the server refused or closed them), readings lost (sweeps the sampler missed
against the wall time of the phase; new history rows per GPU short of the sweeps; history rows that existed before
the phase and were gone after it; sweep gaps in the new history rows beyond twice the interval), the worst event
loop stall of the phase, and the server's RSS, threads and open fds before -> after. Traffic goes to 127.0.0.1
only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import socketserver
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.settle import wait_until_settled
from benchmarks.viewers import Viewers, _free_port, process_counts

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
DEFAULT_ROUTES = ["/GPU-Utilization", "/Cluster-Nodes"]
"""Each viewer reads the sampler's updates and keeps the cluster poller wanted (it polls only while watched)."""
JUMP_S = 3600.0
"""A gap between history rows this long is a clock jump, not missed readings."""
POST_BYTES = 95 * 1000 * 1000
HALF_SENT = 200
MARKUP = "<script>alert(1)</script>"

GOOD_ANSWER = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node-a", "gpu": "0", "UUID": "GPU-a-0",
                "modelName": "NVIDIA H100 80GB HBM3"}, "value": [1_800_000_000.0, "42"]}]}}).encode()
MALFORMED_ANSWER = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                             "result": {"not": "a list"}}}).encode()


def _http(body: bytes, length: int | None = None) -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            f"{len(body) if length is None else length}\r\nConnection: close\r\n\r\n").encode() + body


class RoguePrometheus(socketserver.ThreadingTCPServer):
    """A Prometheus on loopback whose ``mode`` is read per request: ``good``, ``malformed`` (a result that is no
    list) or ``drip`` (headers promising a body, then a byte every half second, 120 at most)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.mode = "good"
        self.requests = 0
        self.closing = threading.Event()
        super().__init__(("127.0.0.1", 0), _RogueHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RogueHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: RoguePrometheus = self.server  # type: ignore[assignment]
        server.requests += 1
        connection: socket.socket = self.request
        connection.settimeout(10)
        buffer = b""
        try:
            while b"\r\n\r\n" not in buffer and len(buffer) < 65536:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                buffer += chunk
            mode = server.mode
            if mode == "drip":
                connection.sendall(_http(b"", length=len(GOOD_ANSWER)))
                for byte in GOOD_ANSWER[:120]:
                    connection.sendall(bytes([byte]))
                    if server.closing.wait(0.5) or server.mode != "drip":
                        return
                return
            connection.sendall(_http(MALFORMED_ANSWER if mode == "malformed" else GOOD_ANSWER))
        except OSError:
            return


@dataclass
class Server:
    """The nvdash process and what the script knows about it."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    history: Path
    mapping: Path
    clock_file: Path
    hang_file: Path
    rogue: RoguePrometheus
    interval_s: float
    connection_timeout_s: float
    statuses: list[tuple[float, int, list[str]]] = field(default_factory=list)

    def health(self, since: float | None = None) -> tuple[int, Any]:
        """``/health``'s status code and body (a 503 is an answer too)."""
        query = "" if since is None else f"?since={since!r}"
        try:
            with urllib.request.urlopen(self.url + "/health" + query, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def set_clock(self, offset: str) -> None:
        """Rewrite libfaketime's offset (atomically: the library rereads the file at every clock call)."""
        new = self.clock_file.with_suffix(".new")
        new.write_text(offset + "\n")
        os.replace(new, self.clock_file)


def poll_until(server: Server, condition: Callable[[int, Any], bool], timeout_s: float) -> float | None:
    """Seconds until ``condition(status, health)`` held (polled every 0.25 s), None if not within ``timeout_s``.
    Every answer's status and stuck parts are kept in ``server.statuses``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        code, body = server.health()
        server.statuses.append((time.monotonic(), code, stuck_parts(body)))
        if condition(code, body):
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def stuck_parts(body: Any) -> list[str]:
    """The names of the parts /health calls stuck."""
    return [item["part"] if isinstance(item, dict) else str(item) for item in body.get("stuck", [])]


def watch(server: Server, seconds: float) -> None:
    """Poll /health for ``seconds`` (recording statuses), as a viewer's monitor would."""
    poll_until(server, lambda code, body: False, seconds)


def history_rows(path: Path) -> dict[int, set[float]]:
    """The raw history's timestamps per GPU (read-only; the server keeps writing)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows: dict[int, set[float]] = {}
        for t, gpu in connection.execute("SELECT t, gpu FROM gpu_raw"):
            rows.setdefault(gpu, set()).add(t)
        return rows
    finally:
        connection.close()


Outcome = tuple[float | str | None, float | str | None, str]
"""A fault's result: seconds until /health said so ("n/a"), seconds until recovered (None: never), a note."""


@dataclass
class Before:
    """What a phase compares against."""

    at: float
    loop_at: float
    sweeps: int
    counts: tuple[float, int, int]
    rows: dict[int, set[float]]
    statuses_from: int


def begin(server: Server) -> Before:
    _, body = server.health()
    return Before(time.monotonic(), body["event_loop"]["at"], body["sampler"]["sweeps"],
                  process_counts(server.process.pid), history_rows(server.history), len(server.statuses))


def missed_in(new: list[float], anchor: float | None, interval_s: float) -> tuple[int, int]:
    """Readings missing between consecutive rows (from ``anchor``, the row before), and clock jumps seen."""
    missed = jumps = 0
    previous = anchor
    for t in new:
        if previous is not None:
            gap = t - previous
            if gap >= JUMP_S:
                jumps += 1
            elif gap > 1.9 * interval_s:
                missed += round(gap / interval_s) - 1
        previous = t
    return missed, jumps


def finish(server: Server, before: Before, name: str, outcome: Outcome) -> str:
    """The phase's table row, once history has written the phase's readings (a few intervals)."""
    detect, recover, note = outcome
    _, flushed = server.health()
    target = flushed["sampler"]["sweeps"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, body = server.health()
        if body["history"]["snapshots"] >= target:
            break
        time.sleep(0.25)
    elapsed = time.monotonic() - before.at
    _, body = server.health(since=before.loop_at)
    sweeps = body["sampler"]["sweeps"] - before.sweeps
    store_missed = max(0, round(elapsed / server.interval_s) - sweeps)
    after_rows = history_rows(server.history)
    gpus = sorted(set(before.rows) | set(after_rows))
    new_counts, pruned, gaps, jumps = [], 0, 0, 0
    for gpu in gpus:
        old, now = before.rows.get(gpu, set()), after_rows.get(gpu, set())
        new = sorted(now - old)
        new_counts.append(len(new))
        pruned += len(old - now)
        anchor = max((t for t in old if new and t < new[0]), default=None)
        missed, jumped = missed_in(new, anchor, server.interval_s)
        gaps, jumps = max(gaps, missed), max(jumps, jumped)
    history_short = max(0, sweeps - min(new_counts, default=0))
    lost = f"store {store_missed}, history {history_short}, pruned {pruned}, gaps {gaps}"
    if jumps:
        lost += f", jumps {jumps}"
    alarms = [(code_, stuck) for _, code_, stuck in server.statuses[before.statuses_from:] if code_ != 200]
    if alarms:
        parts = sorted({part for _, stuck in alarms for part in stuck})
        note += f"; /health non-200 {len(alarms)}x ({', '.join(parts) or 'no stuck part'})"
    rss0, threads0, fds0 = before.counts
    rss1, threads1, fds1 = process_counts(server.process.pid)
    stall = body["event_loop"]["max_lag_since_ms"]
    return (f"| {name} | {_seconds(detect)} | {_seconds(recover)} | {lost} | {stall:.0f} | {rss0:.0f} -> {rss1:.0f} "
            f"| {threads0} -> {threads1} | {fds0} -> {fds1} | {note} |")


def _seconds(value: float | str | None) -> str:
    if value is None:
        return "never"
    return value if isinstance(value, str) else f"{value:.1f} s"



def fault_none(server: Server, hold_s: float) -> Outcome:
    """The viewers alone: what the other rows compare against (a loaded machine misses sweeps too)."""
    watch(server, hold_s)
    return "n/a", "n/a", f"{hold_s:g} s of viewers only"


def fault_mapping_file(server: Server, name: str, make: Callable[[Path], None], hold_s: float) -> Outcome:
    """A hostile entry in the job-mapping directory: named in accounting.job_mapping_refused, and gone from it
    once removed; the valid file next to it stays mapped."""
    path = server.mapping / name
    make(path)

    def refused(code: int, body: Any) -> bool:
        return name in body["accounting"]["job_mapping_refused"]

    detect = poll_until(server, refused, 60)
    _, body = server.health()
    reason = body["accounting"]["job_mapping_refused"].get(name, "")
    jobs = len(body["accounting"]["mapped_jobs"])
    watch(server, hold_s)
    path.unlink()
    recover = poll_until(server, lambda code, body: not refused(code, body), 60)
    return detect, recover, f"refused: {reason!r}; mapped jobs meanwhile {jobs}"


def fault_stuck_sampler(server: Server, hold_s: float) -> Outcome:
    server.hang_file.write_text("hang")
    detect = poll_until(server, lambda code, body: code == 503 and "sampler" in stuck_parts(body), 120)
    watch(server, hold_s)
    server.hang_file.unlink()
    recover = poll_until(server, lambda code, body: code == 200, 120)
    return detect, recover, "503 with stuck [sampler] expected"


def fault_prometheus(server: Server, mode: str, hold_s: float) -> Outcome:
    server.rogue.mode = mode
    detect = poll_until(server, lambda code, body: bool(body["cluster"]["error"]), 120)
    _, body = server.health()
    error = str(body["cluster"]["error"] or "")
    watch(server, hold_s)
    server.rogue.mode = "good"
    recover = poll_until(server, lambda code, body: body["cluster"]["error"] is None
                         and body["cluster"]["last_answer_at"] is not None, 120)
    return detect, recover, f"error: {error[:90]!r}"


def fault_clock(server: Server, offset: str, expect_ahead_s: float, hold_s: float) -> Outcome:
    """Move the server's wall clock; recovered once it sweeps with the new time and /health is 200."""
    server.set_clock(offset)
    began = time.time()

    def moved(code: int, body: Any) -> bool:
        seen = body["sampler"]["last_sweep_at"] or 0.0
        return code == 200 and abs(seen - (time.time() + expect_ahead_s)) < 60

    recover = poll_until(server, moved, 60)
    watch(server, hold_s)
    note = f"server clock {offset} after {time.time() - began:.0f} s of real time"
    return "n/a", recover, note


def fault_big_post(server: Server, timeout_s: float) -> Outcome:
    """95 MB POST to /health: refused (the 64 KiB cap) before the body is read; recovered = the server answered
    or closed the connection."""
    started = time.monotonic()
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as sock:
        sock.sendall((f"POST /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                      f"Content-Type: application/octet-stream\r\nContent-Length: {POST_BYTES}\r\n\r\n").encode())
        chunk = b"x" * (1 << 20)
        try:
            while sent < POST_BYTES and time.monotonic() - started < timeout_s:
                sock.sendall(chunk[: POST_BYTES - sent])
                sent += min(len(chunk), POST_BYTES - sent)
        except OSError:
            pass
        try:
            while len(answer) < 4096 and time.monotonic() - started < timeout_s:
                piece = sock.recv(4096)
                if not piece:
                    break
                answer += piece
        except OSError:
            pass
    status = answer.split(b"\r\n", 1)[0].decode(errors="replace") or "connection reset, no answer read"
    return "n/a", time.monotonic() - started, f"{sent / 1e6:.1f} MB sent before it was cut; {status!r}"


def fault_half_sent(server: Server, timeout_s: float) -> Outcome:
    """``HALF_SENT`` connections that send part of a request and wait: closed by the server after its connection
    timeout; /health meanwhile answers (its latency is noted)."""
    started = time.monotonic()
    sockets = []
    for _ in range(HALF_SENT):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nX-Half: ".encode())
        sock.setblocking(False)
        sockets.append(sock)
    worst_health = 0.0
    open_ = list(sockets)
    closed_at = None
    while open_ and time.monotonic() - started < timeout_s:
        asked = time.monotonic()
        server.health()
        worst_health = max(worst_health, time.monotonic() - asked)
        still = []
        for sock in open_:
            try:
                if sock.recv(4096):
                    still.append(sock)  # an answer to half a request: keep waiting for the close
            except BlockingIOError:
                still.append(sock)
            except OSError:
                pass
        open_ = still
        if not open_:
            closed_at = time.monotonic() - started
        time.sleep(0.5)
    for sock in sockets:
        sock.close()
    note = (f"{HALF_SENT - len(open_)}/{HALF_SENT} closed by the server (timeout "
            f"{server.connection_timeout_s:g} s); slowest /health meanwhile {worst_health * 1000:.0f} ms")
    return "n/a", closed_at, note


def _get(server: Server, path: str, host: str, extra: str = "") -> tuple[str, bytes, bytes]:
    """A GET's status line, headers (lower case) and body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode())
        answer = b""
        while len(answer) < 4 * 2**20:
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
    head, _, body = answer.partition(b"\r\n\r\n")
    status, _, headers = head.partition(b"\r\n")
    return status.decode(errors="replace"), headers.lower(), body


def fault_rebinding(server: Server) -> Outcome:
    host = f"rebind.example:{server.port}"
    page, _, _ = _get(server, "/GPU-Utilization", host)
    ws, _, _ = _get(server, "/GPU-Utilization/ws", host, "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    health, _, _ = _get(server, "/health", host)
    return "n/a", "n/a", f"page {page[9:12]}, websocket {ws[9:12]}, /health {health[9:12]}"


def fault_markup(server: Server) -> Outcome:
    quoted = urllib.parse.quote(MARKUP)
    paths = [f"/GPU-Utilization?x={quoted}", f"/health?since={quoted}", f"/no-such-page?{quoted}",
             f"/history.json?range={quoted}", f"/{quoted}"]
    html = other = 0
    codes = []
    for path in paths:
        status, headers, body = _get(server, path, f"127.0.0.1:{server.port}")
        codes.append(status[9:12])
        if MARKUP.encode() in body:
            if b"content-type: text/html" in headers:
                html += 1
            else:
                other += 1
    return "n/a", "n/a", (f"answers {'/'.join(codes)}; markup unescaped in {html}/{len(paths)} HTML answers, "
                          f"echoed verbatim in {other} non-HTML (JSON, nosniff) answers")


def start_server(args: argparse.Namespace, workdir: Path, rogue: RoguePrometheus) -> Server:
    port = _free_port()
    history, mapping = workdir / "history.sqlite", workdir / "job-mapping"
    mapping.mkdir()
    (mapping / "0").write_text("4242 1000\n")
    clock_file, hang_file = workdir / "faketime", workdir / "hang"
    clock_file.write_text("+0\n")
    timeout_s = 5.0 if args.quick else 10.0
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVDASH_")}
    env.update({"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(clock_file), "FAKETIME_NO_CACHE": "1",
                # A wall-clock jump (NTP, an operator's date -s) leaves the monotonic clock alone.
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "NVDASH_FAKE_FAULTS": f"hang_host:{hang_file}", "NVDASH_CONNECTION_TIMEOUT": str(timeout_s)})
    command = [sys.executable, "-c", LAUNCHER, "--simulate", "dgx-h100", "--port", str(port),
               "--interval", str(args.interval), "--history", str(history), "--job-mapping-dir", str(mapping),
               "--prometheus", rogue.url]
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", port, process, history, mapping, clock_file, hang_file, rogue,
                    args.interval, timeout_s)
    for _ in range(600):
        if process.poll() is not None:
            raise SystemExit(f"nvdash exited with {process.returncode}:\n{(workdir / 'server.log').read_text()}")
        try:
            server.health()
            return server
        except OSError:
            time.sleep(0.1)
    raise SystemExit("nvdash did not answer /health within 60 s")


def phases(server: Server, quick: bool) -> list[tuple[str, Callable[[], Outcome]]]:
    hold = 3.0 if quick else 10.0
    # Forward long enough for the history writer's once-a-minute pruning to run under the new clock.
    jump_hold = 10.0 if quick else 70.0
    return [
        ("no fault (baseline)", lambda: fault_none(server, hold)),
        ("FIFO in mapping dir", lambda: fault_mapping_file(server, "3", os.mkfifo, hold)),
        ("symlink to /dev/zero in mapping dir",
         lambda: fault_mapping_file(server, "5", lambda p: p.symlink_to("/dev/zero"), hold)),
        ("stuck sampler (hang_host)", lambda: fault_stuck_sampler(server, hold)),
        ("Prometheus malformed shape", lambda: fault_prometheus(server, "malformed", hold)),
        ("Prometheus dripping bytes", lambda: fault_prometheus(server, "drip", hold)),
        ("wall clock +7 d", lambda: fault_clock(server, "+7d", 7 * 86400.0, jump_hold)),
        ("wall clock back to now", lambda: fault_clock(server, "+0", 0.0, hold)),
        ("95 MB POST", lambda: fault_big_post(server, 60.0)),
        (f"{HALF_SENT} half-sent connections", lambda: fault_half_sent(server, 3 * server.connection_timeout_s + 30)),
        ("rebinding Host header", lambda: fault_rebinding(server)),
        ("markup in query string", lambda: fault_markup(server)),
    ]


LAUNCHER = (
    "import runpy, threading, time\n"
    "_never = threading.Event()\n"
    "time.sleep = lambda seconds: None if _never.wait(max(0.0, seconds)) else None\n"
    "runpy.run_module('nvdash', run_name='__main__', alter_sys=True)\n"
)
"""``python -m nvdash`` with ``time.sleep`` as a timed wait: libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC
fails Python's sleep (clock_nanosleep on the monotonic clock, absolute) with EINVAL; condition waits work."""

HEADER = ("| fault | /health said so | recovered | readings lost | worst loop stall ms | RSS MiB | threads | open fds "
          "| notes |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="shorter holds (the clock jump misses a prune)")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--per-worker", type=int, default=10, help="viewers per client process")
    parser.add_argument("--routes", nargs="+", default=DEFAULT_ROUTES, help="the dashboards each viewer opens")
    args = parser.parse_args()
    if not Path(LIBFAKETIME).exists():
        raise SystemExit(f"{LIBFAKETIME} is missing: apt-get install faketime")
    rogue = RoguePrometheus()
    threading.Thread(target=rogue.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="nvdash-chaos-") as tmp:
        workdir = Path(tmp)
        server = start_server(args, workdir, rogue)
        viewers: Viewers | None = None
        try:
            viewers = Viewers(server.url, args.viewers, args.per_worker, workdir, "chaos", routes=args.routes)
            sessions = args.viewers * len(args.routes)
            if not wait_until_settled(lambda since=None: server.health(since)[1], sessions, timeout_s=180):
                print("# the event loop never settled after the viewers opened; went on anyway")
            viewers.measure()
            print(f"# nvdash --simulate dgx-h100 --interval {args.interval:g}, {args.viewers} viewers x "
                  f"{len(args.routes)} dashboards ({' '.join(args.routes)}), {os.cpu_count()} CPUs"
                  f"{', quick' if args.quick else ''}")
            print(HEADER)
            print("|" + "|".join("---" for _ in HEADER.split("|")[1:-1]) + "|", flush=True)
            for name, run in phases(server, args.quick):
                before = begin(server)
                print(finish(server, before, name, run()), flush=True)
            _, body = server.health()
            print(f"\n# after all faults: /health {body['status']}, sessions {body['sessions']}, threads "
                  + ", ".join(f"{k}: deaths {v['deaths']}" for k, v in body["threads"].items())
                  + f"; viewers received {viewers.stop()[0]:.0f} websocket bytes/viewer/s")
            viewers = None
        finally:
            if viewers is not None:
                viewers.stop()
            rogue.closing.set()
            server.process.terminate()
            server.process.wait(30)
            rogue.shutdown()
            print(f"# server exited with {server.process.returncode}; last log lines:")
            print("\n".join("#   " + line for line in (workdir / "server.log").read_text().splitlines()[-8:]))


if __name__ == "__main__":
    main()
