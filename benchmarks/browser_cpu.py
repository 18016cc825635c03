"""What the viewer's machine pays: the CPU a headless chromium spends drawing nvdash's live dashboards.

    python benchmarks/browser_cpu.py [--each] [--hidden] [--baseline] [--routes /A /B ...]
                                     [--warmup 20] [--window 30] [--repeat 1] [--full-store]

Starts ``python -m nvdash --simulate dgx-h100 --interval 0.5 --no-history`` on a free port and, for each
scenario, a fresh chromium (the tests' own, ``tests/browser/chromium.py``) with one page per route, all of
them visible at once (1280 x 900 each). Once every page has drawn its canvases and ``--warmup`` seconds have
passed, it measures over ``--window`` seconds, ``--repeat`` windows in a row:

- chromium CPU s/s: user + system CPU seconds per wall second of the browser process and all its descendants
  (from ``/proc/PID/stat``), split into renderers, the GPU process (software compositing, as ``--disable-gpu``)
  and the rest (browser, network and storage services, zygotes);
- server CPU s/s: the same for the nvdash process (its sampler included: see ``--baseline``);
- ws kB/s: websocket payload bytes the pages received per second (Playwright's frame events);
- rAF/s: animation-frame callbacks that ran per second, summed over pages (Bokeh paints a plot in one).

Scenarios: GPU Resources alone and the seven classic dashboards together (or ``--routes`` together); ``--each``
adds each route alone; ``--baseline`` adds a blank page (the server's cost with no viewer); ``--hidden`` adds GPU
Resources in a tab put in the background by another tab of the same window, and in a ``display: none`` iframe
(what a JupyterLab pane behind another tab is). Headless chromium runs a background tab's animation frames about
once a second but, unlike a desktop browser, still says the page is visible: the benchmark makes
``document.hidden`` true there, as a desktop browser would.
The store keeps filling while the benchmark runs, so the timelines hold more points in later scenarios (the
rows column); ``--full-store`` first waits until the store is full (10 minutes at 0.5 s) so that every scenario
draws full timelines. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, Frame, Page, WebSocket

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.routes import CLASSIC
from tests.browser.chromium import chromium
from tests.conftest import free_port, http_get

VIEWPORT = {"width": 1280, "height": 900}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Counts the animation-frame callbacks a frame runs from now on (Bokeh looks requestAnimationFrame up per call).
COUNT_RAF_JS = """() => {
    if (window.__nvdashRafs === undefined) {
        window.__nvdashRafs = 0;
        const original = window.requestAnimationFrame.bind(window);
        window.requestAnimationFrame = (callback) => original((t) => { window.__nvdashRafs += 1; callback(t); });
    }
    return window.__nvdashRafs;
}"""
PAINTED_JS = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"
# Headless chromium reports every page visible, even a tab behind another one: say what a desktop browser says.
BACKGROUND_JS = """() => {
    Object.defineProperty(document, "hidden", {configurable: true, get: () => true});
    Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "hidden"});
    document.dispatchEvent(new Event("visibilitychange"));
}"""
HIDDEN_IFRAME_HTML = (
    "<!doctype html><html><body><p>host page</p>"
    "<iframe id='pane' src='{src}' style='display: none; width: 1280px; height: 900px'></iframe></body></html>"
)


@dataclass(frozen=True)
class Scenario:
    """Routes opened together, and how: ``pages`` (each visible), ``background-tab`` or ``hidden-iframe``."""

    name: str
    routes: tuple[str, ...]
    mode: str = "pages"


@dataclass
class Viewer:
    """What a scenario opened: the frames that show a dashboard, and the bytes their websockets received."""

    pages: list[Page] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    received: list[int] = field(default_factory=lambda: [0])
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far, per process, and when they were read."""

    at: float
    seconds: dict[int, float]
    kinds: dict[int, str]


def _read_stat(pid: int) -> tuple[int, float] | None:
    """Parent PID and user + system CPU seconds of one process, or ``None`` if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _kind(pid: int) -> str:
    """A chromium process's role from its ``--type=`` argument; the browser process has none."""
    try:
        # Chromium rewrites its process title: the arguments may be one space-separated string.
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return "other"
    for argument in arguments:
        if argument.startswith(b"--type="):
            return argument[len(b"--type=") :].decode()
    return "browser"


def _all_stats() -> dict[int, tuple[int, float]]:
    return {int(name): stat for name in os.listdir("/proc") if name.isdigit() and (stat := _read_stat(int(name)))}


def process_tree(root: int) -> CpuSample:
    """CPU seconds of ``root``'s descendants (not ``root``), found by scanning ``/proc`` for parent PIDs."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return CpuSample(time.monotonic(), {pid: stats[pid][1] for pid in found}, {pid: _kind(pid) for pid in found})


def one_process(pid: int) -> CpuSample:
    """CPU seconds of one process (all its threads)."""
    stat = _read_stat(pid)
    return CpuSample(time.monotonic(), {pid: stat[1]} if stat else {}, {pid: "server"})


def cpu_per_s(first: CpuSample, last: CpuSample, kinds: tuple[str, ...] = ()) -> float:
    """CPU seconds per wall second between two samples; a process started in between counts from zero."""
    used = sum(
        seconds - first.seconds.get(pid, 0.0)
        for pid, seconds in last.seconds.items()
        if not kinds or last.kinds[pid] in kinds
    )
    return used / (last.at - first.at)


def playwright_driver() -> int:
    """The Playwright driver (node) this process started: chromium runs as its child."""
    for pid in [pid for pid, (ppid, _) in _all_stats().items() if ppid == os.getpid()]:
        try:
            if b"playwright" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise SystemExit("could not find the Playwright driver process")


def _health(url: str) -> Any:
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        return json.loads(response.read())


@contextmanager
def nvdash(interval_s: float) -> Iterator[tuple[str, int]]:
    """A simulated dgx-h100 server without history, on a free port: its URL and PID."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVDASH_") and k != "BOKEH_RESOURCES"}
    env["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="nvdash-bench-")
    command = [sys.executable, "-m", "nvdash", "--simulate", "dgx-h100", "--interval", str(interval_s),
               "--no-history", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _health(url)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start: {' '.join(command)}") from None
                time.sleep(0.2)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(10)


def _new_page(browser: Browser, viewer: Viewer) -> Page:
    """A page like ``open_page``'s, listening before it navigates (so the websocket is seen from the start)."""
    page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]

    def on_websocket(socket: WebSocket) -> None:
        def count(payload: str | bytes) -> None:
            viewer.received[0] += len(payload.encode() if isinstance(payload, str) else payload)

        socket.on("framereceived", count)

    page.on("websocket", on_websocket)
    page.on("pageerror", lambda error: viewer.errors.append(str(error)))
    page.on("console", lambda message: viewer.errors.append(message.text) if message.type == "error" else None)
    viewer.pages.append(page)
    return page


def _drawn(frame: Frame) -> None:
    frame.wait_for_selector("canvas", state="attached", timeout=120_000)
    frame.evaluate(PAINTED_JS)


def open_scenario(browser: Browser, url: str, scenario: Scenario) -> Viewer:
    """Open a scenario's pages, one at a time, each drawn before the next opens."""
    viewer = Viewer()
    if scenario.mode == "hidden-iframe":
        page = _new_page(browser, viewer)
        page.route(url + "/__host", lambda route: route.fulfill(
            content_type="text/html", body=HIDDEN_IFRAME_HTML.format(src=url + scenario.routes[0])))
        page.goto(url + "/__host", wait_until="load")
        element = page.wait_for_selector("#pane", state="attached")
        frame = element.content_frame() if element else None
        if frame is None:
            raise SystemExit("the hidden iframe has no document")
        # A display: none frame may never run its animation frames: wait for the canvases, not a paint.
        frame.wait_for_selector("canvas", state="attached", timeout=120_000)
        viewer.frames.append(frame)
        return viewer
    for route in scenario.routes:
        page = _new_page(browser, viewer)
        page.goto(url + route, wait_until="load")
        _drawn(page.main_frame)
        viewer.frames.append(page.main_frame)
    if scenario.mode == "background-tab":
        page = viewer.pages[-1]
        with page.context.expect_page() as opened:
            page.evaluate("() => { window.open('about:blank'); }")
        opened.value.bring_to_front()
        page.evaluate(BACKGROUND_JS)
    return viewer


def raf_counts(viewer: Viewer) -> int:
    return sum(int(frame.evaluate(COUNT_RAF_JS)) for frame in viewer.frames)


def measure(viewer: Viewer, driver: int, server: int, url: str, window_s: float) -> dict[str, float]:
    """One window's figures (see the module docstring)."""
    rafs, received = raf_counts(viewer), viewer.received[0]
    browser_first, server_first = process_tree(driver), one_process(server)
    # Playwright delivers the frame events while it waits; time.sleep would hold them back.
    viewer.pages[0].wait_for_timeout(window_s * 1000)
    browser_last, server_last = process_tree(driver), one_process(server)
    elapsed = browser_last.at - browser_first.at
    return {
        "rows": _health(url)["store"]["rows"],
        "chromium": cpu_per_s(browser_first, browser_last),
        "renderers": cpu_per_s(browser_first, browser_last, ("renderer",)),
        "gpu": cpu_per_s(browser_first, browser_last, ("gpu-process",)),
        "other": cpu_per_s(browser_first, browser_last) - cpu_per_s(browser_first, browser_last,
                                                                    ("renderer", "gpu-process")),
        "server": cpu_per_s(server_first, server_last),
        "ws_kb": (viewer.received[0] - received) / elapsed / 1000,
        "rafs": (raf_counts(viewer) - rafs) / elapsed,
    }


def run_scenario(url: str, server: int, scenario: Scenario, args: argparse.Namespace) -> list[dict[str, float]]:
    """A fresh chromium for one scenario: open, warm up, measure ``--repeat`` windows."""
    with chromium() as browser:
        driver = playwright_driver()
        viewer = open_scenario(browser, url, scenario) if scenario.routes else Viewer(pages=[browser.new_page()])
        raf_counts(viewer)
        viewer.pages[0].wait_for_timeout(args.warmup * 1000)
        results = [measure(viewer, driver, server, url, args.window) for _ in range(args.repeat)]
        states = {frame.evaluate("document.visibilityState") for frame in viewer.frames}
    if viewer.errors:
        print(f"warning: {scenario.name}: script errors: {viewer.errors[:3]}", file=sys.stderr)
    if scenario.mode == "pages" and states - {"visible"}:
        print(f"warning: {scenario.name}: pages not visible: {states}", file=sys.stderr)
    return results


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios the options ask for, in order, without duplicates."""
    together = tuple(args.routes or CLASSIC)
    chosen = [] if args.routes else [Scenario("/GPU-Resources", ("/GPU-Resources",))]
    name = together[0] if len(together) == 1 else f"{len(together)} routes together"
    chosen.append(Scenario("the seven classic, together" if not args.routes else name, together))
    if args.each:
        chosen += [Scenario(route, (route,)) for route in together]
    if args.hidden:
        chosen.append(Scenario("/GPU-Resources, background tab", ("/GPU-Resources",), "background-tab"))
        chosen.append(Scenario("/GPU-Resources, display:none iframe", ("/GPU-Resources",), "hidden-iframe"))
    if args.baseline:
        chosen.insert(0, Scenario("(blank page)", ()))
    unique: dict[tuple[tuple[str, ...], str], Scenario] = {}
    for scenario in chosen:
        unique.setdefault((scenario.routes, scenario.mode), scenario)
    return list(unique.values())


def _route(value: str) -> str:
    if not value.startswith("/") or any(c in value for c in "?# "):
        raise argparse.ArgumentTypeError(f"not a dashboard route: {value!r} (expected e.g. /GPU-Memory)")
    return value


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {value}")
    return number


def _revision() -> str:
    """The checkout's commit (``-dirty`` with local changes), or ``unknown`` outside a git checkout."""
    try:
        result = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).resolve().parents[1], check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip()


def _wait(read: Callable[[], Any], check: Callable[[Any], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check(read()):
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting after {timeout_s:g} s")
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routes", nargs="+", type=_route, help="routes opened together (default: the seven)")
    parser.add_argument("--each", action="store_true", help="also measure each route alone")
    parser.add_argument("--hidden", action="store_true", help="also GPU Resources in a background tab and iframe")
    parser.add_argument("--baseline", action="store_true", help="also a blank page (the server with no viewer)")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds after the pages drew (default 20)")
    parser.add_argument("--window", type=_positive, default=30.0, help="seconds per measurement (default 30)")
    parser.add_argument("--repeat", type=int, default=1, help="windows measured per scenario (default 1)")
    parser.add_argument("--interval", type=_positive, default=0.5, help="the server's interval (default 0.5)")
    parser.add_argument("--full-store", action="store_true", help="wait until the store is full first")
    args = parser.parse_args()
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be at least 1 and --warmup at least 0")
    with nvdash(args.interval) as (url, server):
        for route in args.routes or []:
            status = http_get(url + route)[0]
            if status != 200:
                raise SystemExit(f"{route} is not a dashboard of this server (it answered {status})")
        if args.full_store:
            capacity = _health(url)["store"]["capacity"]
            _wait(lambda: _health(url)["store"]["rows"], lambda rows: rows >= capacity,
                  capacity * args.interval * 2 + 60)
        print(f"# nvdash {_revision()} --simulate dgx-h100 --interval {args.interval:g} --no-history; "
              f"chromium headless, {VIEWPORT['width']}x{VIEWPORT['height']} pages; {os.cpu_count()} CPUs; "
              f"warm-up {args.warmup:g} s, window {args.window:g} s; load average {os.getloadavg()[0]:.2f} at start")
        header = ("| scenario | pages | run | store rows | chromium CPU s/s | renderers | GPU process | browser+other "
                  "| server CPU s/s | ws kB/s | rAF/s |")
        print(header)
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        totals: dict[str, list[float]] = {}
        for scenario in scenarios(args):
            for run, row in enumerate(run_scenario(url, server, scenario, args), start=1):
                totals.setdefault(scenario.name, []).append(row["chromium"])
                print(f"| {scenario.name} | {len(scenario.routes)} | {run} | {row['rows']:.0f} "
                      f"| {row['chromium']:.3f} | {row['renderers']:.3f} | {row['gpu']:.3f} | {row['other']:.3f} "
                      f"| {row['server']:.3f} | {row['ws_kb']:.1f} | {row['rafs']:.1f} |", flush=True)
        if args.repeat > 1:
            print("\n| scenario | chromium CPU s/s, median of runs |\n|---|---:|")
            for name, values in totals.items():
                print(f"| {name} | {statistics.median(values):.3f} |")
        print(f"# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
