"""What one process collection costs: 8 GPUs x 50 processes, NVML lists + per-process utilization + host lookups.

    python benchmarks/processes.py [--profile dgx-h100] [--per-gpu 50] [--runs 30]

Starts ``per-gpu`` real ``sleep`` children per GPU and lists them on the simulated GPUs (realistic NVML call
latencies), then times ``UsageCollector.collect`` (what the sampler runs every ``--process-interval``): the first
(cold) run, then the median, 95th percentile and max of the warm runs, with NVML calls per run. Also times a
sampler sweep with and without a collection in it, to show what a collection adds to the sweep it lands in.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.usage import UsageCollector
from nvdash.store import Store


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--per-gpu", type=int, default=50)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    hardware = open_hardware(args.profile)
    children: list[subprocess.Popen[bytes]] = []
    try:
        gpus = hardware.gpus
        fake = hardware.fake
        assert gpus is not None, "needs GPUs"
        count = len(hardware.inventory.gpus)
        for gpu in range(count):
            for _ in range(args.per_gpu):
                child = subprocess.Popen(["sleep", "600"])
                children.append(child)
                fake.add_process(gpu, child.pid, memory_mib=512)  # type: ignore[attr-defined]
        collector = UsageCollector(gpus, HostProcessTable())
        runs_ms: list[float] = []
        calls: list[int] = []
        for _ in range(args.runs + 1):
            before = gpus.calls
            started = time.perf_counter()
            usage = collector.collect(time.time(), 5.0)
            runs_ms.append((time.perf_counter() - started) * 1000)
            calls.append(gpus.calls - before)
            time.sleep(0.2)
        visible = sum(1 for p in usage.processes if p.visible)
        cold, warm = runs_ms[0], runs_ms[1:]
        print(f"# {args.profile}: {count} GPUs x {args.per_gpu} processes (+ the profile's own), "
              f"{len(usage.processes)} listed, {visible} visible on the host; {args.runs} warm runs")
        print("| collection | cold ms | median ms | p95 ms | max ms | NVML calls/run |")
        print("|---|---|---|---|---|---|")
        print(f"| UsageCollector.collect | {cold:.1f} | {statistics.median(warm):.1f} | "
              f"{_percentile(warm, 0.95):.1f} | {max(warm):.1f} | {statistics.median(calls):.0f} |")
        store = Store(hardware.inventory)
        for label, interval in (("sweep without collection", 3600.0), ("sweep with collection", 0.0)):
            sampler = Sampler(store, hardware.host, gpus, interval_s=0.5, usage=collector, usage_interval_s=interval)
            sampler.sample_once()
            sweeps = []
            for _ in range(args.runs):
                started = time.perf_counter()
                sampler.sample_once()
                sweeps.append((time.perf_counter() - started) * 1000)
                time.sleep(0.2)
            print(f"| {label} | | {statistics.median(sweeps):.1f} | {_percentile(sweeps, 0.95):.1f} "
                  f"| {max(sweeps):.1f} | |")
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()
        hardware.close()


if __name__ == "__main__":
    main()
