"""Markup in what a file, the system or a user controls reaches every page as text, in a real chromium.

Three channels, each a real server with every page it offers opened in one browser:

- ``nvdash replay`` of a history file written by nvdash's own writer, whose host name, GPU names, driver version,
  events (kind, severity, message) and accounting owners (jobs, users, pods, namespaces) carry markup, under a
  file name that carries markup too;
- ``nvdash import`` of an nvidia-smi CSV log whose GPU names, bus ids and driver version carry markup, replayed;
- a live server on the simulated NVML with a GPU named with markup, a real process whose command line carries
  it, and a kubelet whose pods, namespaces and containers are named with it.

On each page no element is created from the markup (no ``img[src=x]``, no ``#xss``, no script of ours, the flag
the handlers would set stays unset) and, where the page shows the field as text, the literal text is there.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import Key, Tally, hour_of
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.fake.mig import mig_uuid
from nvdash.sampling.fake.profiles import gpu_uuid
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, Snapshot
from tests.browser.chromium import chromium, wait_until_drawn
from tests.conftest import NvdashServer, free_port, get_json, nvdash_env, stop_process, wait_for
from tests.history_week import dgx_inventory
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

pytestmark = pytest.mark.browser

MARKUP = '<img src=x onerror=window.__xss=1><b id=xss>"></b><script>window.__xss=2</script>'
"""Would create an image (whose error handler sets a flag), a bold element and a script, were it parsed as HTML."""
SLASHLESS = '<img src=x onerror=window.__xss=3>"><b id=xss>'
"""The same without ``/``, for file names."""
SHORT = "<img src=x onerror=window.__xss=4>"
"""For fields kept short (a GPU name fits in 96 bytes; nvidia-smi's columns split at ", ")."""


def marked(tag: str, payload: str = MARKUP) -> str:
    """``payload`` after a tag that says which field it came from, so that each field's text is found."""
    return f"{tag}{payload}"


DEEP = """
(selector) => {
  const found = [];
  const visit = (root) => {
    found.push(...root.querySelectorAll(selector));
    for (const el of root.querySelectorAll("*")) if (el.shadowRoot) visit(el.shadowRoot);
  };
  visit(document);
  return found.length;
}
"""
"""How many elements match ``selector`` in the page and in every (open) shadow root: Bokeh draws in shadow DOM."""
TEXT = """
() => {
  const parts = [];
  const visit = (root) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const node = walker.currentNode;
      if (!["SCRIPT", "STYLE"].includes(node.parentNode.nodeName) && node.nodeValue.trim()) parts.push(node.nodeValue);
    }
    for (const el of root.querySelectorAll("*")) if (el.shadowRoot) visit(el.shadowRoot);
  };
  visit(document.body);
  return parts.join("\\n");
}
"""
"""The text of the page and of its shadow roots: their text nodes, but not those of scripts and style sheets."""
OURS = """
() => {
  const scripts = [];
  const visit = (root) => {
    for (const el of root.querySelectorAll("script")) if (el.textContent.includes("__xss")) scripts.push(el);
    for (const el of root.querySelectorAll("*")) if (el.shadowRoot) visit(el.shadowRoot);
  };
  visit(document);
  return scripts.length;
}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@contextmanager
def served(arguments: Sequence[str], env: dict[str, str] | None = None) -> Iterator[NvdashServer]:
    """``python -m nvdash ARGUMENTS --port N`` (a subcommand first), until it answers; stopped afterwards."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed after the process ends
    process = subprocess.Popen([sys.executable, "-m", "nvdash", *arguments, "--port", str(port)],
                               env=nvdash_env(env), stdout=log, stderr=subprocess.STDOUT, text=True)
    server = NvdashServer(process, port, "", log)
    try:
        def answer() -> object:
            if process.poll() is not None:
                raise AssertionError(f"nvdash exited with {process.returncode}: {server.output()}")
            try:
                return server.health()
            except (OSError, AssertionError):
                return None

        wait_for(answer, lambda health: health is not None, timeout_s=60.0)
        yield server
    finally:
        stop_process(process)
        log.close()


def _wait_for_texts(page: Page, texts: Sequence[str], timeout_ms: float = 30_000) -> str | None:
    """Wait until the page's text holds each of ``texts``; the first one it still lacks at the deadline, if any."""
    for text in texts:
        try:
            page.wait_for_function(f"(text) => ({TEXT})().includes(text)", arg=text, timeout=timeout_ms)
        except PlaywrightTimeout:
            return text
    return None


def check_pages(browser: Browser, server: NvdashServer, shown: dict[str, list[str]]) -> None:
    """Open the index, every dashboard the server offers and the other URLs in ``shown`` (a dashboard with query
    arguments); each shows its ``shown`` texts, and none makes an element or runs a script from markup."""
    offered = ["/", *get_json(server.url + "/index.json")]
    routes = offered + [route for route in shown if route not in offered]
    missing_pages = {route for route in routes if route.partition("?")[0] not in offered}
    assert not missing_pages, f"expected pages not offered: {missing_pages}"
    page = browser.new_page(viewport={"width": 1400, "height": 2000})  # tall: every table row is drawn
    try:
        for route in routes:
            page.goto(server.url + route, wait_until="load")
            if route != "/":
                wait_until_drawn(page)
            missing = _wait_for_texts(page, shown.get(route, []))
            created = {selector: page.evaluate(DEEP, selector) for selector in ("img[src='x']", "#xss")}
            assert created == {"img[src='x']": 0, "#xss": 0}, f"{route} made elements of markup: {created}"
            assert page.evaluate(OURS) == 0, f"{route} inserted a script from markup"
            assert page.evaluate("() => window.__xss") is None, f"{route} ran a handler from markup"
            assert missing is None, f"{route} shows no {missing!r} as text; it shows:\n{page.evaluate(TEXT)[:3000]}"
    finally:
        page.close()


# Replay of a file written by nvdash's writer


HOST = marked("host")
GPU_NAME = marked("gpu", SHORT)
DRIVER = marked("driver", SHORT)
EVENT = GpuEvent(time_s=0.0, gpu_index=0, kind=marked("kind"), message=marked("message"), severity=marked("sev"))
XID = GpuEvent(time_s=0.0, gpu_index=1, kind="xid", message=marked("xid message"), severity="critical", code=79)
JOB = Owner("slurm", marked("job"), marked("user"), marked("project"))
POD = Owner("pod", marked("ns") + "/" + marked("pod"), marked("podowner"), marked("ns"))


class _Tallies:
    """An accounting source that hands the writer fixed tallies once."""

    retention_s = 86_400.0

    def __init__(self, tallies: dict[Key, Tally]) -> None:
        self._tallies = tallies

    def drain(self) -> dict[Key, Tally]:
        tallies, self._tallies = self._tallies, {}
        return tallies

    def restore(self, tallies: dict[Key, Tally]) -> None:
        self._tallies.update(tallies)


def write_recording(path: Path, end_s: float) -> None:
    """Two minutes of two GPUs' readings, the events and the accounting, through nvdash's own writer."""
    base = dgx_inventory()
    gpus = tuple(replace(gpu, name=GPU_NAME) for gpu in base.gpus[:2])
    inventory = replace(base, host=replace(base.host, hostname=HOST), gpus=gpus, driver_version=DRIVER,
                        topology=tuple(row[:2] for row in base.topology[:2]))
    hour = hour_of(end_s)
    start = max(hour, end_s - 120.0)
    tallies: dict[Key, Tally] = {
        (owner, gpu, hour): Tally(start_s=start, end_s=end_s, allocated_s=60.0, busy_s=30.0, activity_known_s=60.0,
                                  utilization_s=15.0, energy_j=6000.0, energy_known_s=60.0)
        for gpu, owner in enumerate((JOB, POD))}
    writer = HistoryWriter(path, inventory, "simulated:dgx-h100", 1.0, accounting=_Tallies(tallies))
    writer.open()
    try:
        for second in range(121):
            time_s = end_s - 120.0 + second
            writer.submit(Snapshot(time_s=time_s, host=HostSample(cpu_pct=10.0), gpus=tuple(
                GpuSample(index=gpu.index, utilization_pct=50.0, memory_used_bytes=1 << 30,
                          memory_total_bytes=gpu.memory_total_bytes, temperature_c=50.0) for gpu in gpus)))
        writer.submit_events([replace(EVENT, time_s=end_s - 30.0), replace(XID, time_s=end_s - 20.0)])
        writer.flush()
    finally:
        writer.stop()


def test_a_replayed_history_shows_its_markup_as_text(browser: Browser, tmp_path: Path) -> None:
    end = float(int(datetime.now().timestamp()))
    path = tmp_path / f"{SLASHLESS}.sqlite"
    write_recording(path, end)
    with served(["replay", str(path)]) as server:
        check_pages(browser, server, {
            "/": [HOST, GPU_NAME, DRIVER, SLASHLESS],
            "/GPU-Health": [GPU_NAME, EVENT.message, EVENT.severity, EVENT.kind],
            "/GPU-Details": [GPU_NAME],
            "/GPU-Topology": [GPU_NAME],
            "/GPU-Accounting": [JOB.job],
            "/GPU-Accounting?by=user": [JOB.user, POD.user],
            "/GPU-Accounting?by=namespace": [JOB.project, POD.project],
            "/GPU-Accounting?by=pod": [POD.job],
        })
        # The file goes bad under the server: the errors name it, and a browser shows them as text.
        with path.open("r+b") as file:
            file.seek(4096)
            file.write(b"\xff" * (path.stat().st_size - 4096))
        page = browser.new_page()
        try:
            page.goto(server.url + "/export.csv?range=1h", wait_until="load")
            assert page.evaluate(DEEP, "img[src='x']") == 0, "the export's error made an element of the file's name"
            assert SLASHLESS in page.evaluate(TEXT), "the export's error does not name the file"
        finally:
            page.close()


# An nvidia-smi log imported with `nvdash import`, replayed


CSV_NAME = marked("csvgpu", SHORT)
CSV_DRIVER = marked("csvdriver", SHORT)
CSV_HEADER = "timestamp, index, name, uuid, driver_version, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"


def nvidia_smi_log(end_s: float) -> str:
    """A minute of two GPUs as ``nvidia-smi --query-gpu=... --format=csv -l 1`` logs it (local time, no zone)."""
    lines = [CSV_HEADER]
    for second in range(60):
        stamp = datetime.fromtimestamp(end_s - 60 + second).strftime("%Y/%m/%d %H:%M:%S.000")
        for index in range(2):
            lines.append(f"{stamp}, {index}, {CSV_NAME}, GPU-{index}{SHORT}, {CSV_DRIVER}, 40 %, 1024 MiB, 40960 MiB")
    return "\n".join(lines) + "\n"


def test_an_imported_nvidia_smi_log_shows_its_markup_as_text(browser: Browser, tmp_path: Path) -> None:
    log = tmp_path / f"{SLASHLESS}.csv"
    log.write_text(nvidia_smi_log(float(int(datetime.now().timestamp()))))
    history = tmp_path / "imported.sqlite"
    done = subprocess.run([sys.executable, "-m", "nvdash", "import", str(log), "--history", str(history)],
                          env=nvdash_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "imported 120 readings of 2 GPUs" in done.stdout
    with served(["replay", str(history)]) as server:
        check_pages(browser, server, {
            "/": [f"import:{log.name}", CSV_NAME, CSV_DRIVER],
            "/GPU-Health": [CSV_NAME],
            "/GPU-Details": [CSV_NAME],
        })


# Live: the simulated NVML, a real process and a kubelet


LIVE_GPU = marked("livegpu", SHORT)
COMMAND = marked("cmd", SHORT + '"><b id=xss>')
"""The child's ``argv[0]``: its command line begins with it, and the page shows a command's first 80 characters."""
NAMESPACE, POD_NAME, CONTAINER = marked("ns"), marked("pod"), marked("ctr")
IDLE_POD = marked("idlepod")
ARGUMENT = quote(marked("arg"), safe="")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A real process whose command line carries markup; it lives until its standard input closes."""
    process = subprocess.Popen([COMMAND, "-c", "import sys; sys.stdin.read()"], executable=sys.executable,
                               stdin=subprocess.PIPE)
    yield process
    assert process.stdin is not None
    process.stdin.close()
    process.wait(10)


def test_live_pages_show_markup_from_nvml_processes_and_pods_as_text(
    browser: Browser, child: subprocess.Popen[bytes], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sock = tmp_path / "kubelet.sock"
    uuids = [gpu_uuid("a100-mig", 0, i) for i in range(2)]
    lister = Lister(pods=[
        Pod(NAMESPACE, POD_NAME, [Container(CONTAINER, {"nvidia.com/gpu": [uuids[1]]})]),
        Pod(NAMESPACE, IDLE_POD, [Container(CONTAINER, {"nvidia.com/mig-1g.5gb": [mig_uuid(uuids[0], 14, 0)]})]),
    ])
    faults = f"name:1:{quote(LIVE_GPU, safe='')};process:1:{child.pid}"
    args = ["serve", "--simulate", "a100-mig", "--interval", "0.25", "--process-interval", "0.5",
            "--kubelet-socket", str(sock), "--no-history"]
    with serve_pods(sock, tmp_path_factory.mktemp("kubelet_api"), lister), \
            served(args, {"NVDASH_FAKE_FAULTS": faults}) as server:
        wait_for(lambda: get_json(server.url + "/api/processes.json"),
                 lambda doc: any(p["pid"] == child.pid and p["command"] for p in doc["processes"])
                 and any((p["pod"] or {}).get("name") == POD_NAME for p in doc["processes"]), timeout_s=60.0)
        wait_for(lambda: get_json(server.url + "/api/accounting.json?by=pod"),
                 lambda doc: any(POD_NAME in row["key"] for row in doc["rows"]), timeout_s=60.0)
        check_pages(browser, server, {
            "/": [LIVE_GPU],
            "/GPU-Processes": [COMMAND, NAMESPACE, POD_NAME, CONTAINER, IDLE_POD],
            "/GPU-Health": [LIVE_GPU],
            "/GPU-Details": [LIVE_GPU],
            "/GPU-Accounting": [POD_NAME],
            # A link someone was sent: what a query argument says comes back, at most, as text.
            f"/GPU-Accounting?range={ARGUMENT}&by={ARGUMENT}": [],
            f"/GPU-Accounting?from={ARGUMENT}&to={ARGUMENT}": [],
            f"/GPU-Utilization?from={ARGUMENT}&to={ARGUMENT}&theme={ARGUMENT}": [],
            f"/GPU-Details?gpu={ARGUMENT}": [],
        })
