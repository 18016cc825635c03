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

import os
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
from nvdash.accounting.ledger import HOUR_S, Key, Tally, hour_of
from nvdash.history.writer import HistoryWriter
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
    while (walker.nextNode()) parts.push(walker.currentNode.nodeValue);
    for (const el of root.querySelectorAll("*")) if (el.shadowRoot) visit(el.shadowRoot);
  };
  visit(document.body);
  return parts.join("\\n");
}
"""
"""The text of the page and of its shadow roots (the text nodes, so a script's source counts only if inserted)."""
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
    """Open the index and every dashboard the server offers; each shows its ``shown`` texts and nothing more."""
    routes = ["/", *get_json(server.url + "/index.json")]
    assert set(shown) <= set(routes), f"expected pages missing: {set(shown) - set(routes)}"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
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
            assert missing is None, f"{route} does not show {missing!r} as text; it shows:\n{page.evaluate(TEXT)[:3000]}"
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
        })
