"""What telling the owners of shared GPUs apart costs: 8 GPUs x 50 processes x 20 pods per GPU by default.

    python benchmarks/shares.py [--profile dgx-h100] [--per-gpu 50] [--pods 20] [--runs 30]

Lists ``--per-gpu`` busy processes on each simulated GPU (realistic NVML call latencies; PIDs of another PID
namespace, so the host lookups are those of processes it cannot see: ``benchmarks/processes.py`` measures visible
ones), then times, per sweep: the process collection (``UsageCollector.collect`` with the time-weighted
per-process utilization), the share computation on a new process reading (``ShareTracker.update``: SM split, memory,
power, energy, with the processes spread over ``--pods`` pods per GPU), and the share update of a sweep without a new
reading (power and energy only). Percentages are of the default process interval (2 s) and sweep interval (0.5 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.shares import ShareTracker
from nvdash.sampling.usage import UsageCollector
from nvdash.sampling.usage_records import Usage

PROCESS_INTERVAL_S = 2.0
SWEEP_INTERVAL_S = 0.5


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def in_pods(usage: Usage, pods: int) -> Usage:
    """``usage`` with each GPU's processes spread round-robin over ``pods`` pods (as the collector names them)."""
    named = [
        dataclasses.replace(p, pod_namespace="bench", pod_name=f"gpu{p.gpu_index}-pod{i % pods}", container_name="main")
        for i, p in enumerate(usage.processes)
    ]
    return dataclasses.replace(usage, processes=tuple(named))


def row(label: str, values: list[float], budget_s: float) -> str:
    median = statistics.median(values)
    return (f"| {label} | {median:.2f} | {_percentile(values, 0.95):.2f} | {max(values):.2f} | "
            f"{100 * median / (budget_s * 1000):.2f} % of {budget_s:g} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--per-gpu", type=int, default=50)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    hardware = open_hardware(args.profile)
    try:
        gpus, fake = hardware.gpus, hardware.fake
        assert gpus is not None, "needs GPUs"
        count = len(hardware.inventory.gpus)
        for gpu in range(count):
            for n in range(args.per_gpu):
                fake.add_process(gpu, GHOST_PID_BASE + 10_000 + gpu * 1000 + n,  # type: ignore[attr-defined]
                                 memory_mib=256, sm_share=1.0 / args.per_gpu)
        collector = UsageCollector(gpus, HostProcessTable())
        tracker = ShareTracker()
        collect_ms: list[float] = []
        new_ms: list[float] = []
        tick_ms: list[float] = []
        collector.collect(time.time(), 5.0)
        for _ in range(args.runs):
            time.sleep(0.2)
            samples = gpus.read(5.0)
            started = time.perf_counter()
            usage = collector.collect(time.time(), 5.0)
            collect_ms.append((time.perf_counter() - started) * 1000)
            usage = in_pods(usage, args.pods)
            started = time.perf_counter()
            shares = tracker.update(time.time(), samples, usage)
            new_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            tracker.update(time.time(), samples, usage)
            tick_ms.append((time.perf_counter() - started) * 1000)
        owners = sum(len(unit.owners) for unit in shares)
        print(f"# {args.profile}: {count} GPUs x {args.per_gpu} processes in {args.pods} pods each "
              f"({len(usage.processes)} processes listed, {owners} owners); {args.runs} runs")
        print("| per sweep | median ms | p95 ms | max ms | median, share of the interval |")
        print("|---|---|---|---|---|")
        print(row("process collection (UsageCollector.collect)", collect_ms, PROCESS_INTERVAL_S))
        print(row("shares on a new process reading", new_ms, PROCESS_INTERVAL_S))
        print(row("collection + shares", [a + b for a, b in zip(collect_ms, new_ms, strict=True)],
                  PROCESS_INTERVAL_S))
        print(row("shares on a sweep without a new reading", tick_ms, SWEEP_INTERVAL_S))
    finally:
        hardware.close()


if __name__ == "__main__":
    main()
