"""How long the cluster pages' Prometheus queries take, against a real Prometheus scraping three simulated nodes.

    python benchmarks/cluster_queries.py [--warmup 120] [--repeat 30]

Starts the tests' simulated cluster (node-a: DGX H100, node-b: 2 x A100 PCIe, node-c: A100 in MIG mode; 12 GPUs,
six pods holding nine devices), lets Prometheus scrape it every second for ``--warmup`` seconds, then measures
``--repeat`` times each:

- each of the poller's five instant queries, and one whole refresh (what the cluster pages wait on, every 5 s);
- a node's timelines (four metrics x min/mean/max = 12 range queries) over 30 min, 6 h and 7 d, as the
  range control asks for them (the longer ranges hold only the warm-up's readings here: Prometheus's cost grows
  with the samples it reads, so they are a lower bound).

Prints the best, median and worst of each, in milliseconds, and the series and points each answer held.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvdash.cluster.history import PrometheusHistory
from nvdash.cluster.model import ALLOCATED_QUERY, GPU_QUERY, IDLE_QUERY, POD_VALUES_QUERY, SEEN_QUERY
from nvdash.cluster.poller import ClusterPoller
from nvdash.cluster.promapi import PrometheusClient
from tests.conftest import wait_for
from tests.prometheus_cluster import prometheus_cluster, query

NODE_METRICS = ["utilization_pct", "memory_used_bytes", "power_w", "temperature_c"]


def timed(action: Callable[[], object], repeat: int) -> tuple[list[float], object]:
    """Milliseconds of each run, and the last result."""
    times = []
    result: object = None
    for _ in range(repeat):
        began = time.perf_counter()
        result = action()
        times.append((time.perf_counter() - began) * 1000.0)
    return times, result


def row(name: str, times: list[float], size: str) -> str:
    return f"{name:<34} {min(times):>8.1f} {statistics.median(times):>8.1f} {max(times):>8.1f}  {size}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds of scraping before measuring")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, prometheus_cluster(Path(folder), rules=False) as cluster:
        wait_for(lambda: query(cluster.url, "count by (Hostname) (nvdash_pod_gpu_allocated)"),
                 lambda rows: len(rows) == 3, timeout_s=120.0)
        time.sleep(args.warmup)  # a benchmark's fixed warm-up: history to read back
        client = PrometheusClient(cluster.url)
        print(f"Prometheus 1 s scrapes of 3 nodes, 12 GPUs, {args.warmup:.0f} s of readings; {args.repeat} runs")
        print(f"{'what':<34} {'best':>8} {'median':>8} {'worst':>8}  answer")
        for name, promql in (("overview: GPU families", GPU_QUERY), ("overview: GPUs seen in 1 h", SEEN_QUERY),
                             ("pods: allocations", ALLOCATED_QUERY), ("pods: readings", POD_VALUES_QUERY),
                             ("pods: idle for 30 min", IDLE_QUERY)):
            times, answer = timed(lambda q=promql: client.instant(q), args.repeat)
            print(row(name, times, f"{len(answer.samples)} series"))  # type: ignore[attr-defined]
        poller = ClusterPoller(client)
        times, state = timed(poller.refresh, args.repeat)
        print(row("one refresh (all five)", times, f"{len(state.gpus)} GPUs, {len(state.pods)} pods"))  # type: ignore[attr-defined]
        history = PrometheusHistory(client, "node-a")
        for label, seconds in (("30 min", 1800), ("6 h", 6 * 3600), ("7 d", 7 * 86400)):
            end = time.time()
            times, result = timed(lambda s=seconds, e=end: history.query(NODE_METRICS, e - s, e), args.repeat)
            series = result.series  # type: ignore[attr-defined]
            points = sum(len(item.time_s) for by_gpu in series.values() for item in by_gpu.values())
            print(row(f"node-a timelines, {label}", times,
                      f"{sum(len(v) for v in series.values())} series, {points} points, "
                      f"step {result.step_s:g} s"))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
