"""What looking up GPU processes on the host costs: starts 400 ``sleep`` children (8 GPUs x 50 processes),
times ``HostProcessTable.lookup`` on them (the first, cold call, then the median and max of 20 warm calls),
and the same with psutil for comparison, and prints a table. The budget is well under 15 ms per warm call.

    python benchmarks/process_lookup.py [--processes 400] [--calls 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

from nvdash.sampling.host_processes import HostProcessTable


def _time_ms(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def _psutil_lookup(pids: list[int]) -> Callable[[], Any]:
    """The same fields through psutil, keeping Process objects between calls (as a psutil-based table would)."""
    import psutil

    processes: dict[int, psutil.Process] = {}

    def lookup() -> dict[int, tuple[Any, ...]]:
        found = {}
        for pid in pids:
            try:
                process = processes.get(pid) or processes.setdefault(pid, psutil.Process(pid))
                with process.oneshot():
                    found[pid] = (
                        process.username(),
                        process.cmdline(),
                        process.cpu_percent(None),
                        process.memory_info().rss,
                        process.create_time(),
                    )
            except psutil.Error:
                continue
        return found

    return lookup


def _row(name: str, first_ms: float, lookup: Callable[[], Any], calls: int) -> str:
    warm = [_time_ms(lookup) for _ in range(calls)]
    return f"| {name:<36} | {first_ms:>13.2f} | {statistics.median(warm):>14.2f} | {max(warm):>11.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=400)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    children = [subprocess.Popen(["sleep", "600"]) for _ in range(args.processes)]
    try:
        pids = [child.pid for child in children]
        time.sleep(1.0)  # let every child finish exec, so the cold call sees "sleep 600" and not python
        table = HostProcessTable()
        started = time.perf_counter()
        found = table.lookup(pids)
        first_ms = (time.perf_counter() - started) * 1000
        assert len(found) == len(pids), f"saw {len(found)} of {len(pids)} children"
        print(f"{len(pids)} live processes, {args.calls} warm calls each\n")
        print(f"| {'lookup':<36} | {'first call ms':>13} | {'warm median ms':>14} | {'warm max ms':>11} |")
        print(f"|{'-' * 38}|{'-' * 15}|{'-' * 16}|{'-' * 13}|")
        print(_row("HostProcessTable.lookup", first_ms, lambda: table.lookup(pids), args.calls))
        psutil_lookup = _psutil_lookup(pids)
        print(_row("psutil Process.oneshot (comparison)", _time_ms(psutil_lookup), psutil_lookup, args.calls))
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()


if __name__ == "__main__":
    main()
