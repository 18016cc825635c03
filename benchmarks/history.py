"""What a week of history costs: file size, rows per table, write cost per sweep, and query latency per range.

    python benchmarks/history.py [--days 7] [--gpus 8] [--interval 0.5] [--bulk-batch 120] [--live-batch 2]
                                 [--live-sweeps 2000] [--repeat 7] [--path DIR] [--keep]

Writes ``--days`` of history for ``--gpus`` GPUs through the product's write path (``HistoryWriter.submit`` and
``flush``: one transaction per batch, the tiers' rollup, retention pruning), as a server started ``--days`` ago
and sampling every ``--interval`` seconds would have. The readings are ``--samples`` real sweeps of the
simulated dgx-h100 (GPU and host samples, and its process list every ``--process-interval`` seconds as the
sampler reads it), cycled with new timestamps: the first reading is ``--days`` before now, each next one
``--interval`` later.

Batches: a live server's writer thread flushes once a second (2 sweeps at 0.5 s). The bulk of the history is
written in batches of ``--bulk-batch`` sweeps (120: one minute of readings), which is quicker; the last
``--live-sweeps`` sweeps are written at ``--live-batch`` sweeps a flush, each flush timed, on a file that holds
what a server that has been running that long holds (the steady state). ``--bulk-batch 2`` writes everything
at the live batch size.

Pruning: the writer deletes rows older than their table's horizon at most once per ``PRUNE_EVERY_S`` (60 s) of
monotonic time. Here the writer's (injected) monotonic clock is the newest reading's time, so it prunes once per
60 s of readings, as a live server does, and the file ends as a week-old server's does: raw rows 6 h, the 10 s
tier 2 days, the coarser tiers the whole retention.

Queries: for each preset range ending at the newest reading, the GPU Resources page's four metrics for every
GPU in one query, and one metric for every GPU as ``/api/history.json`` asks; ``--repeat`` times each, each
through a new read-only connection whose opening is timed apart. The file is in the page cache by then.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nvdash.history.writer as writer_module
from nvdash.history.database import uri
from nvdash.history.query import SqliteHistory
from nvdash.history.ranges import PRESETS, parse_duration
from nvdash.history.tiers import DAY_S, DEFAULT_RETENTION_S
from nvdash.history.writer import PRUNE_EVERY_S, HistoryWriter
from nvdash.sampling.hardware import open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.records import GpuSample, HostSample, Inventory, Snapshot
from nvdash.sampling.usage import UsageCollector
from nvdash.sampling.usage_records import Usage

PAGE_METRICS = ("utilization_pct", "memory_used_bytes", "pcie_bytes_per_s", "nvlink_bytes_per_s")
"""What the GPU Resources page asks for at once."""
SINGLE_METRIC = ("utilization_pct",)
MB = 1e6


@dataclass
class Pool:
    """Real readings to cycle through: sweeps (GPU samples and host sample) and process lists."""

    inventory: Inventory
    sweeps: list[tuple[tuple[GpuSample, ...], HostSample]]
    usages: list[Usage]


@dataclass
class Build:
    """What writing the history took."""

    sweeps: int = 0
    bulk_s: float = 0.0
    live_s: float = 0.0
    total_s: float = 0.0
    flush_ms: list[float] = field(default_factory=list)
    """Each live-batch flush, whole: inserts, rollup, commit, and the prune when one ran."""
    rollup_ms: list[float] = field(default_factory=list)
    prune_flush_ms: list[float] = field(default_factory=list)
    """The live-batch flushes that also pruned."""
    prune_ms: list[float] = field(default_factory=list)
    """The prunes' DELETE statements alone (live window)."""
    prunes: int = 0
    pruned_rows: int = 0
    wal_bytes_before_checkpoint: int = 0


class _ReadingClock:
    """Stands in for the writer module's ``time``: ``monotonic()`` is the newest reading's time."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class _Timed:
    """Wraps one of the writer module's functions and adds up the milliseconds spent in it."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.ms = 0.0
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.function(*args)
        finally:
            self.ms += (time.perf_counter() - started) * 1000
            self.calls += 1


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _gpus(samples: tuple[GpuSample, ...], count: int) -> tuple[GpuSample, ...]:
    """``count`` GPU samples: the profile's first ``count``, or its samples repeated under new indices."""
    return tuple(samples[i] if i < len(samples) else dataclasses.replace(samples[i % len(samples)], index=i)
                 for i in range(count))


def read_pool(profile: str, samples: int, count: int, gap_s: float, process_every: int) -> Pool:
    """``samples`` sweeps of the simulated ``profile``, ``gap_s`` apart, and its process list every few sweeps."""
    hardware = open_hardware(profile, seed=0, faults=None)
    try:
        gpus = hardware.gpus
        assert gpus is not None, "needs GPUs"
        infos = hardware.inventory.gpus
        inventory = dataclasses.replace(
            hardware.inventory,
            gpus=tuple(infos[i] if i < len(infos) else dataclasses.replace(
                infos[i % len(infos)], index=i, uuid=f"{infos[i % len(infos)].uuid}-{i}") for i in range(count)),
            topology=hardware.inventory.topology if count == len(infos) else ())
        collector = UsageCollector(gpus, HostProcessTable())
        gpus.read(1.0)
        hardware.host.read()
        sweeps: list[tuple[tuple[GpuSample, ...], HostSample]] = []
        usages: list[Usage] = []
        for index in range(samples):
            time.sleep(gap_s)
            sweeps.append((_gpus(gpus.read(1.0), count), hardware.host.read()))
            if process_every and index % process_every == 0:
                usage = collector.collect(time.time(), 1.0)
                processes = tuple(process for process in usage.processes if process.gpu_index < count)
                usages.append(dataclasses.replace(usage, processes=processes))
        return Pool(inventory, sweeps, usages)
    finally:
        hardware.close()


def build_history(path: Path, pool: Pool, args: argparse.Namespace) -> Build:
    """Write ``args.days`` of readings through ``HistoryWriter``; time the last ``args.live_sweeps`` flushes."""
    result = Build()
    total = round(args.days * DAY_S / args.interval)
    live = min(args.live_sweeps, total)
    bulk = total - live
    now = time.time()
    first_s = (now - total * args.interval) // 60 * 60
    process_every = round(args.process_interval / args.interval) if args.process_interval else 0
    clock = _ReadingClock()
    rollup = _Timed(vars(writer_module)["rollup"])
    prune = _Timed(vars(writer_module)["prune"])
    patched = {"time": clock, "rollup": rollup, "prune": prune}
    originals = {name: vars(writer_module)[name] for name in patched}
    vars(writer_module).update(patched)
    clock.now_s = first_s
    writer = HistoryWriter(path, pool.inventory, f"simulated:{args.profile}", args.interval,
                           retention_s=args.retention_days * DAY_S, clock=lambda: first_s, monotonic=clock.monotonic)
    try:
        writer.open()
        sweeps, usages = pool.sweeps, pool.usages
        usage: Usage | None = None
        started = time.perf_counter()
        phase_started = started
        next_report = DAY_S
        for index in range(total):
            time_s = first_s + index * args.interval
            if process_every and index % process_every == 0:
                usage = dataclasses.replace(usages[(index // process_every) % len(usages)], time_s=time_s)
            gpus, host = sweeps[index % len(sweeps)]
            writer.submit(Snapshot(time_s, gpus, host, usage))
            clock.now_s = time_s
            done = index + 1
            if done <= bulk:
                if done % args.bulk_batch == 0 or done == bulk:
                    writer.flush()
                    if done == bulk:
                        result.bulk_s = time.perf_counter() - phase_started
                        phase_started = time.perf_counter()
            elif (done - bulk) % args.live_batch == 0 or done == total:
                rollup.ms = prune.ms = 0.0
                prunes = prune.calls
                flush_started = time.perf_counter()
                writer.flush()
                elapsed_ms = (time.perf_counter() - flush_started) * 1000
                result.flush_ms.append(elapsed_ms)
                result.rollup_ms.append(rollup.ms)
                if prune.calls > prunes:
                    result.prune_flush_ms.append(elapsed_ms)
                    result.prune_ms.append(prune.ms)
            if time_s - first_s >= next_report:
                print(f"  {next_report / DAY_S:.0f} d written in {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)
                next_report += DAY_S
        result.live_s = time.perf_counter() - phase_started
        result.total_s = time.perf_counter() - started
        result.sweeps = total
        result.prunes = prune.calls
        result.pruned_rows = writer.stats.pruned_rows
        if writer.stats.errors:
            raise RuntimeError(f"the writer failed {writer.stats.errors} times: {writer.stats.last_error}")
        wal = path.with_name(path.name + "-wal")
        result.wal_bytes_before_checkpoint = wal.stat().st_size if wal.exists() else 0
        checkpoint = sqlite3.connect(path)
        try:
            checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            checkpoint.close()
    finally:
        writer.stop()
        vars(writer_module).update(originals)
    return result


def file_report(path: Path) -> tuple[int, int, int, list[tuple[str, int, float]]]:
    """File bytes, -wal bytes, free-page bytes, and per table: rows and MB (tables and their indexes' pages)."""
    size = path.stat().st_size
    wal = path.with_name(path.name + "-wal")
    wal_size = wal.stat().st_size if wal.exists() else 0
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        free = connection.execute("PRAGMA freelist_count").fetchone()[0] * connection.execute(
            "PRAGMA page_size").fetchone()[0]
        tables = [row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        owners = dict(connection.execute("SELECT name, tbl_name FROM sqlite_master"))
        pages: dict[str, int] = {}
        for name, bytes_ in connection.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
            owner = owners.get(name, name)
            pages[owner] = pages.get(owner, 0) + bytes_
        rows = [(table, connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0],
                 pages.get(table, 0) / MB) for table in tables]
    finally:
        connection.close()
    return size, wal_size, free, rows


@dataclass
class QueryRow:
    """One preset range's query timings."""

    range: str
    resolution: str
    step_s: float
    points: int
    page_ms: list[float]
    single_ms: list[float]
    open_ms: list[float]


def time_queries(path: Path, end_s: float, repeat: int) -> list[QueryRow]:
    """Each preset range ending at ``end_s``: the page's query and the single-metric one, ``repeat`` times."""
    rows = []
    for preset in PRESETS:
        start_s = end_s - parse_duration(preset)
        timings: dict[tuple[str, ...], list[float]] = {PAGE_METRICS: [], SINGLE_METRIC: []}
        opens: list[float] = []
        result = None
        for _ in range(repeat):
            for metrics, spent in timings.items():
                history = SqliteHistory(path)
                started = time.perf_counter()
                connection = history.connection()
                opened = time.perf_counter()
                result = history.query(list(metrics), start_s, end_s)
                spent.append((time.perf_counter() - opened) * 1000)
                opens.append((opened - started) * 1000)
                connection.close()
        assert result is not None
        points = len(next(iter(result.series[SINGLE_METRIC[0]].values())).time_s)
        rows.append(QueryRow(preset, result.resolution, result.step_s, points, timings[PAGE_METRICS],
                             timings[SINGLE_METRIC], opens))
    return rows


def newest_reading(path: Path) -> float:
    connection = sqlite3.connect(uri(path), uri=True)
    try:
        return float(connection.execute("SELECT max(t) FROM gpu_raw").fetchone()[0])
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=7.0, help="days of readings to write (default 7)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per sweep (default 8)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between sweeps (default 0.5)")
    parser.add_argument("--retention-days", type=float, default=DEFAULT_RETENTION_S / DAY_S,
                        help="the writer's retention (default 7)")
    parser.add_argument("--process-interval", type=float, default=2.0,
                        help="seconds between process lists, 0 for none (default 2, as the server)")
    parser.add_argument("--profile", default="dgx-h100", help="simulation profile the readings come from")
    parser.add_argument("--samples", type=int, default=300, help="real sweeps read and cycled (default 300)")
    parser.add_argument("--bulk-batch", type=int, default=120,
                        help="sweeps per flush before the timed window (default 120: 60 s at 0.5 s)")
    parser.add_argument("--live-batch", type=int, default=2,
                        help="sweeps per flush in the timed window (default 2: the writer's 1 s at 0.5 s)")
    parser.add_argument("--live-sweeps", type=int, default=2000, help="sweeps in the timed window (default 2000)")
    parser.add_argument("--repeat", type=int, default=7, help="repetitions of each query (default 7)")
    parser.add_argument("--path", type=Path, help="directory for the history file (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the history file afterwards")
    args = parser.parse_args()
    if args.bulk_batch > writer_module.QUEUE_LIMIT or args.live_batch > writer_module.QUEUE_LIMIT:
        parser.error(f"a batch holds at most {writer_module.QUEUE_LIMIT} sweeps (the writer's queue limit)")

    directory = args.path or Path(tempfile.mkdtemp(prefix="nvdash-history-"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "history.sqlite"
    if path.exists():
        parser.error(f"{path} exists already; give an empty directory")
    try:
        process_every = round(args.process_interval / args.interval) if args.process_interval else 0
        pool = read_pool(args.profile, args.samples, args.gpus, 0.05, process_every)
        print(f"  read {len(pool.sweeps)} sweeps of the simulated {args.profile}; writing {args.days:g} d",
              file=sys.stderr, flush=True)
        build = build_history(path, pool, args)
        size, wal_size, free, tables = file_report(path)
        queries = time_queries(path, newest_reading(path), args.repeat)
        report(args, build, size=size, wal_size=wal_size, free=free, tables=tables, queries=queries)
    finally:
        if args.keep:
            print(f"\nkept {path}")
        elif args.path is None:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for suffix in ("", "-wal", "-shm", ".lock"):
                path.with_name(path.name + suffix).unlink(missing_ok=True)


def report(args: argparse.Namespace, build: Build, *, size: int, wal_size: int, free: int,
           tables: list[tuple[str, int, float]], queries: list[QueryRow]) -> None:
    """Print the tables (Markdown)."""
    live = len(build.flush_ms) * args.live_batch
    bulk = build.sweeps - live
    print(f"# {args.days:g} d x {args.gpus} GPUs at {args.interval:g} s ({build.sweeps:,} sweeps, readings of the "
          f"simulated {args.profile}, process list every {args.process_interval:g} s), retention "
          f"{args.retention_days:g} d; {bulk:,} sweeps flushed {args.bulk_batch} at a time, then {live:,} "
          f"flushed {args.live_batch} at a time (timed); pruned once per {PRUNE_EVERY_S:g} s of readings")
    print()
    print("| file | MB |")
    print("|---|---:|")
    print(f"| history.sqlite after `wal_checkpoint(TRUNCATE)` | {size / MB:.1f} |")
    print(f"| of which free pages | {free / MB:.1f} |")
    print(f"| -wal after the checkpoint (before it) | {wal_size / MB:.1f} "
          f"({build.wal_bytes_before_checkpoint / MB:.1f}) |")
    print()
    print("| table | rows | MB |")
    print("|---|---:|---:|")
    for table, rows, megabytes in tables:
        print(f"| {table} | {rows:,} | {megabytes:.1f} |")
    print()
    print("| writing | median ms | p95 ms | max ms | count |")
    print("|---|---:|---:|---:|---:|")
    per_sweep = [ms / args.live_batch for ms in build.flush_ms]
    print(f"| flush of {args.live_batch} sweeps (inserts, rollup, commit; a prune once a minute) | "
          f"{statistics.median(build.flush_ms):.2f} | {_percentile(build.flush_ms, 0.95):.2f} | "
          f"{max(build.flush_ms):.2f} | {len(build.flush_ms)} |")
    print(f"| per sweep (flush / {args.live_batch}) | {statistics.median(per_sweep):.2f} | "
          f"{_percentile(per_sweep, 0.95):.2f} | {max(per_sweep):.2f} | |")
    print(f"| tier rollup per flush (in the above) | {statistics.median(build.rollup_ms):.2f} | "
          f"{_percentile(build.rollup_ms, 0.95):.2f} | {max(build.rollup_ms):.2f} | {len(build.rollup_ms)} |")
    if build.prune_flush_ms:
        print(f"| flush that also pruned (whole flush) | {statistics.median(build.prune_flush_ms):.1f} | "
              f"{_percentile(build.prune_flush_ms, 0.95):.1f} | {max(build.prune_flush_ms):.1f} | "
              f"{len(build.prune_flush_ms)} |")
        print(f"| prune DELETEs alone | {statistics.median(build.prune_ms):.1f} | "
              f"{_percentile(build.prune_ms, 0.95):.1f} | {max(build.prune_ms):.1f} | {len(build.prune_ms)} |")
    print()
    print("| build | seconds | sweeps/s |")
    print("|---|---:|---:|")
    if bulk:
        print(f"| {bulk:,} sweeps in batches of {args.bulk_batch} | {build.bulk_s:.0f} | {bulk / build.bulk_s:,.0f} |")
    print(f"| {live:,} sweeps in batches of {args.live_batch} | {build.live_s:.1f} | {live / build.live_s:,.0f} |")
    print(f"| total ({build.prunes:,} prunes, {build.pruned_rows:,} rows pruned) | {build.total_s:.0f} | "
          f"{build.sweeps / build.total_s:,.0f} |")
    print()
    opens = [ms for row in queries for ms in row.open_ms]
    print(f"Queries over ranges ending at the newest reading, {args.repeat} runs each, a new connection each run "
          f"(opening it: median {statistics.median(opens):.1f} ms, max {max(opens):.1f} ms, not included); "
          f"p95 of {args.repeat} runs is their slowest.")
    print()
    print(f"| range | resolution | step s | points/series | GPU Resources: {len(PAGE_METRICS)} metrics x "
          f"{args.gpus} GPUs, median ms | p95 ms | utilization_pct x {args.gpus} GPUs, median ms | p95 ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in queries:
        print(f"| {row.range} | {row.resolution} | {row.step_s:g} | {row.points:,} | "
              f"{statistics.median(row.page_ms):.1f} | {_percentile(row.page_ms, 0.95):.1f} | "
              f"{statistics.median(row.single_ms):.1f} | {_percentile(row.single_ms, 0.95):.1f} |")


if __name__ == "__main__":
    main()
