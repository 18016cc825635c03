"""How long one sampler sweep takes with every reading, and what the XID event thread costs.

    python benchmarks/sweep.py [--profile dgx-h100] [--interval 0.5] [--seconds 30]

Runs the real sampler (NVML source with the simulated library's realistic call latencies, host source, event
derivation) for ``--seconds`` at ``--interval`` with the XID watcher started, then prints a table: sweep
duration (mean, median, 95th percentile, max) and as a share of the interval, NVML calls per sweep and per
second, and how many event waits the XID thread made per second. Also splits a sweep into its fast part and a
sweep that includes the slow-cadence health counters.
"""

from __future__ import annotations

import argparse
import statistics
import time

from nvdash.health.events import EventDetector
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.sampler import Sampler
from nvdash.store import Store


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    hardware = open_hardware(args.profile)
    try:
        inventory = hardware.inventory
        store = Store(inventory)
        detector = EventDetector(inventory)
        sampler = Sampler(store, hardware.host, hardware.gpus, interval_s=args.interval, derive_events=detector)
        fake = hardware.fake
        counts = getattr(fake, "call_counts", dict)
        gpus = hardware.gpus
        assert gpus is not None, "needs GPUs"
        xid = gpus.watch_xids(lambda event: store.add_events([event]))
        durations: list[float] = []
        calls: list[int] = []
        started = time.monotonic()
        waits_before = counts().get("nvmlEventSetWait_v2", 0)
        next_due = started
        while time.monotonic() - started < args.seconds:
            before = gpus.calls
            t0 = time.perf_counter()
            sampler.sample_once()
            durations.append(time.perf_counter() - t0)
            calls.append(gpus.calls - before)
            next_due += args.interval
            time.sleep(max(0.0, next_due - time.monotonic()))
        elapsed = time.monotonic() - started
        waits = counts().get("nvmlEventSetWait_v2", 0) - waits_before
        ms = [d * 1000 for d in durations]
        fast = [m for m, c in zip(ms, calls, strict=True) if c <= min(calls)]
        slow = [m for m, c in zip(ms, calls, strict=True) if c > min(calls)]
        print(f"# {args.profile}: {len(inventory.gpus)} GPUs, interval {args.interval} s, {len(ms)} sweeps "
              f"in {elapsed:.0f} s, XID watcher: {xid or 'watching'}")
        print("| sweeps | mean ms | median ms | p95 ms | max ms | max % of interval | NVML calls/sweep (fast/with "
              "health counters) | NVML calls/s | XID waits/s |")
        print("|---|---|---|---|---|---|---|---|---|")
        print(f"| {len(ms)} | {statistics.mean(ms):.1f} | {statistics.median(ms):.1f} | {_percentile(ms, 0.95):.1f} "
              f"| {max(ms):.1f} | {max(ms) / (args.interval * 1000) * 100:.0f} % | {min(calls)} / {max(calls)} "
              f"| {sum(calls) / elapsed:.0f} | {waits / elapsed:.1f} |")
        if slow:
            print(f"\nfast sweeps: median {statistics.median(fast):.1f} ms; sweeps with the health counters: "
                  f"median {statistics.median(slow):.1f} ms, max {max(slow):.1f} ms ({len(slow)} of them)")
        print(f"events recorded: {store.event_seq}")
    finally:
        hardware.close()


if __name__ == "__main__":
    main()
