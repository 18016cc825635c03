"""What a ``/metrics`` scrape costs: the collector and the text exposition in-process, the HTTP round trip against
a real server, and the NVML calls concurrent scrapers add (none: a scrape reads the store).

    python benchmarks/metrics_scrape.py [--profile dgx-h100] [--scrapes 2000] [--http-scrapes 500]
                                        [--scrapers 8] [--window-sweeps 20] [--windows 3]

In-process: a store holding one real sweep of the simulated ``--profile`` (two sweeps read, so rates and GPM
metrics are there) with its usage reading (processes, MIG instances), plus kubelet allocations made up for the
profile's GPUs (a pod per GPU for the first six, the seventh time-sliced between two pods, the last one free).
Each scrape is what ``MetricsHandler.get`` does: a registry with the store's collector, ``collect()``, and the
text format; ``--scrapes`` of them per row, timed one by one.

HTTP: ``python -m nvdash --simulate PROFILE --metrics-pods --metrics-processes`` on a free port, with a real gRPC
kubelet pod-resources server (``tests/unit/kubelet_server.py``) serving the same allocations; ``--http-scrapes``
sequential GETs of ``/metrics`` over one keep-alive connection. Then ``--windows`` pairs of windows of
``--window-sweeps`` sampler sweeps: one with no scraper, one with ``--scrapers`` threads scraping back to back;
the fake NVML library counts every call the server makes (``/api/simulation.json``'s ``fake_nvml_calls``), per sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvdash.metrics.collector import ExportOptions
from nvdash.metrics.counters import default_counters
from nvdash.metrics.exposition import text_format
from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.hardware import Hardware, open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.records import GpuInfo, Inventory, Snapshot
from nvdash.sampling.usage import UsageCollector
from nvdash.sampling.usage_records import PodDevice, PodResources, Usage
from nvdash.server.metrics_handler import registry_for
from nvdash.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import get_json, nvdash_server
from tests.unit.kubelet_server import Container, Lister, Pod, serve_pods

TARGET_MS = 5.0
"""The issue's budget for one scrape of 8 GPUs with processes."""


def allocations(gpus: tuple[GpuInfo, ...]) -> list[tuple[str, str, str, str]]:
    """(namespace, pod, resource, device id) per allocation: a pod per GPU but the last two; the next-to-last GPU
    time-sliced between two pods; the last one free."""
    found = [("train", f"trainer-{gpu.index}", "nvidia.com/gpu", gpu.uuid) for gpu in gpus[:-2]]
    if len(gpus) >= 2:
        shared = gpus[-2].uuid
        found += [("serve", "server-a", "nvidia.com/gpu.shared", f"{shared}::0"),
                  ("serve", "server-b", "nvidia.com/gpu.shared", f"{shared}::1")]
    return found


def pod_resources(gpus: tuple[GpuInfo, ...]) -> PodResources:
    devices = tuple(PodDevice(namespace, pod, "main", resource, device,
                              "shared" if "::" in device else "whole")
                    for namespace, pod, resource, device in allocations(gpus))
    return PodResources(devices=devices, available=True, status="benchmark")


def lister(gpus: tuple[GpuInfo, ...]) -> Lister:
    return Lister(pods=[Pod(namespace, pod, [Container("main", {resource: [device]})])
                        for namespace, pod, resource, device in allocations(gpus)])


def read_store(profile: str) -> tuple[Store, Usage, Hardware]:
    """A store with one real sweep of ``profile`` and its usage reading, with the made-up allocations; the hardware
    stays open (the caller closes it), so that the fake library can tell whether scrapes call it."""
    hardware = open_hardware(profile, seed=0, faults=None)
    gpus = hardware.gpus
    assert gpus is not None, "needs GPUs"
    collector = UsageCollector(gpus, HostProcessTable())
    gpus.read(1.0)
    collector.collect(time.time(), 1.0)
    time.sleep(0.5)
    samples = gpus.read(1.0)
    usage = collector.collect(time.time(), 1.0)
    inventory: Inventory = hardware.inventory
    usage = dataclasses.replace(usage, pods=pod_resources(inventory.gpus))
    store = Store(inventory, capacity=10)
    store.append(Snapshot(time.time(), samples, hardware.host.read(), usage=usage))
    return store, usage, hardware


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def timed(action: Callable[[], Any], count: int) -> tuple[list[float], Any]:
    """Milliseconds of each of ``count`` calls (after 20 untimed ones) and the last result."""
    result = None
    for _ in range(20):
        result = action()
    spent = []
    for _ in range(count):
        started = time.perf_counter()
        result = action()
        spent.append((time.perf_counter() - started) * 1000)
    return spent, result


def in_process(store: Store, scrapes: int) -> list[tuple[str, int, int, list[float]]]:
    """Per option set: (name, series, bytes, milliseconds per scrape)."""
    counters = default_counters()
    rows = []
    for name, pods, processes in (("default", False, False), ("pods + processes", True, True)):
        options = ExportOptions(hostname="bench-node", pods=pods, processes=processes)

        def scrape(options: ExportOptions = options) -> bytes:
            return text_format(registry_for(store, counters, options, False).collect())

        spent, body = timed(scrape, scrapes)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        rows.append((name, series, len(body), spent))
    return rows


def http_scrapes(port: int, count: int) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def get() -> bytes:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, response.status
        return body

    try:
        spent, _ = timed(get, count)
    finally:
        connection.close()
    return spent


def _sweeps(url: str) -> tuple[int, int]:
    counts = get_json(url + "/api/simulation.json")
    return int(counts["sampler"]["sweeps"]), int(counts["fake_nvml_calls"])


def _sweep_boundary(url: str, multiple: int) -> tuple[int, int]:
    """(sweeps, NVML calls) just after the sweep count reaches a multiple of ``multiple``."""
    while True:
        sweeps, calls = _sweeps(url)
        if sweeps % multiple == 0:
            return sweeps, calls
        time.sleep(0.01)


def window(url: str, port: int, sweeps: int, scrapers: int) -> tuple[float, int, float]:
    """(NVML calls per sweep, scrapes, seconds) over ``sweeps`` sampler sweeps with ``scrapers`` threads scraping.

    Windows start when the sweep count is a multiple of ``sweeps``, so that each covers the same share of the
    slower cadences (health counters every 5 s, processes every 2 s)."""
    stop = threading.Event()
    done = [0] * scrapers

    def scrape_loop(slot: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            while not stop.is_set():
                connection.request("GET", "/metrics")
                response = connection.getresponse()
                response.read()
                done[slot] += 1
        finally:
            connection.close()

    first, calls_before = _sweep_boundary(url, sweeps)
    started = time.monotonic()
    threads = [threading.Thread(target=scrape_loop, args=(slot,), daemon=True) for slot in range(scrapers)]
    for thread in threads:
        thread.start()
    while True:
        count, calls_after = _sweeps(url)
        if count >= first + sweeps:
            break
        time.sleep(0.01)
    seconds = time.monotonic() - started
    stop.set()
    for thread in threads:
        thread.join(10)
    return (calls_after - calls_before) / (count - first), sum(done), seconds


def row(name: str, spent: list[float], *extra: object) -> str:
    cells = [name, *map(str, extra), f"{statistics.median(spent):.2f}", f"{percentile(spent, 0.95):.2f}",
             f"{max(spent):.2f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dgx-h100", help="simulation profile (default dgx-h100)")
    parser.add_argument("--scrapes", type=int, default=2000, help="in-process scrapes per row (default 2000)")
    parser.add_argument("--http-scrapes", type=int, default=500, help="sequential HTTP scrapes (default 500)")
    parser.add_argument("--scrapers", type=int, default=8, help="concurrent scrapers (default 8)")
    parser.add_argument("--window-sweeps", type=int, default=20,
                        help="sampler sweeps per NVML-call window (default 20: 10 s)")
    parser.add_argument("--windows", type=int, default=3, help="pairs of windows without and with scrapers")
    args = parser.parse_args()

    store, usage, hardware = read_store(args.profile)
    fake = hardware.fake
    assert isinstance(fake, FakeNvmlLibrary)
    gpus = len(store.inventory.gpus)
    print(f"profile {args.profile}: {gpus} GPUs, {len(usage.processes)} processes, "
          f"{len(usage.pods.devices)} allocations, {sum(len(g.instances) for g in usage.gpus)} MIG instances")
    print()
    print(f"In-process scrape (collector + text format), {args.scrapes} scrapes per row:")
    print("| options | series | bytes | median ms | p95 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    calls = fake.total_calls()
    try:
        results = in_process(store, args.scrapes)
        calls = fake.total_calls() - calls
    finally:
        hardware.close()
    for name, series, size, spent in results:
        print(row(name, spent, series, size))
    worst = percentile(results[-1][3], 0.95)
    verdict = "under" if worst < TARGET_MS else "OVER"
    print(f"p95 with pods and processes: {worst:.2f} ms, {verdict} the {TARGET_MS:.0f} ms budget; "
          f"NVML calls made by the {2 * (args.scrapes + 20)} scrapes: {calls}")

    with tempfile.TemporaryDirectory(prefix="nvdash-bench-") as directory:
        sock = Path(directory) / "kubelet.sock"
        server_args = ["--simulate", args.profile, "--interval", "0.5", "--no-history", "--metrics-pods",
                       "--metrics-processes", "--kubelet-socket", str(sock)]
        with serve_pods(sock, Path(directory), lister(store.inventory.gpus)), nvdash_server(server_args) as server:
            deadline = time.monotonic() + 60
            while b"nvdash_pod_gpu_allocated{" not in http_body(server.port):
                if time.monotonic() > deadline:
                    raise SystemExit("the server exported no pod allocation within 60 s")
                time.sleep(0.2)
            print()
            print(f"HTTP round trip (one keep-alive connection, {args.http_scrapes} sequential GETs):")
            print("| what | median ms | p95 ms | max ms |")
            print("|---|---:|---:|---:|")
            print(row("GET /metrics, pods + processes", http_scrapes(server.port, args.http_scrapes)))
            print()
            print(f"NVML calls per sampler sweep, windows of {args.window_sweeps} sweeps (interval 0.5 s), "
                  "alternating without and with scrapers:")
            print("| scrapers | scrapes | scrapes/s | NVML calls per sweep |")
            print("|---:|---:|---:|---:|")
            for scrapers in [0, args.scrapers] * args.windows:
                per_sweep, scrapes, seconds = window(server.url, server.port, args.window_sweeps, scrapers)
                print(f"| {scrapers} | {scrapes} | {scrapes / seconds:.0f} | {per_sweep:.1f} |")

def http_body(port: int) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read()
    finally:
        connection.close()


if __name__ == "__main__":
    main()
