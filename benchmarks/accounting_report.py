"""How long the accounting report takes over a month of jobs: 30 days x 8 GPUs x 1,000 jobs by default.

    python benchmarks/accounting_report.py [--days 30] [--gpus 8] [--jobs 1000] [--users 50] [--repeat 5]
                                           [--seed 1] [--path DIR] [--keep]

Fills a history file's accounting table the way the history writer does (``accounting_table.store``, one hourly
tally per job, GPU and hour the job ran in), for ``--jobs`` Slurm jobs of ``--users`` users in 10 projects: each
job takes 1, 2, 4 or all GPUs for an exponentially distributed time (mean chosen so that the jobs fill about 80 %
of the GPU-hours), starts at a random moment of the ``--days`` and may share GPUs with others (as MIG instances
or time-slicing do). Then times, for each grouping, the report over the whole range: in the process
(``make_report``: the query and the grouping, median of ``--repeat``), and as a user runs it
(``nvdash report --range 30d --by ... --format table`` as a command: Python's start included, median of 3).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import HOUR_S, Key, Tally, hour_of
from nvdash.accounting.report import AccountingBook, accounting_range, make_report
from nvdash.history import accounting_table
from nvdash.history.database import open_database
from nvdash.history.query import SqliteHistory

GROUPINGS = ("job", "user", "namespace", "pod")


def job_tallies(owner: Owner, gpus: list[int], start_s: float, end_s: float, rng: random.Random) -> dict[Key, Tally]:
    """The hourly tallies a job running on ``gpus`` from ``start_s`` to ``end_s`` leaves."""
    tallies: dict[Key, Tally] = {}
    hour = hour_of(start_s)
    utilization = rng.uniform(0.0, 1.0)
    while hour < end_s:
        low, high = max(start_s, hour), min(end_s, hour + HOUR_S)
        seconds = high - low
        for gpu in gpus:
            busy = seconds * (1.0 if rng.random() < utilization else 0.3)
            tallies[(owner, gpu, hour)] = Tally(
                start_s=low, end_s=high, allocated_s=seconds, busy_s=busy, activity_known_s=seconds,
                utilization_s=busy * utilization, energy_j=seconds * rng.uniform(80.0, 700.0), energy_known_s=seconds,
                memory_byte_s=seconds * 20e9, memory_known_s=seconds, peak_memory_bytes=rng.randrange(1, 80) << 30)
        hour += HOUR_S
    return tallies


def fill(path: Path, args: argparse.Namespace, now_s: float) -> int:
    """Write the jobs' tallies (as ``args`` asks) into a new history at ``path``; returns the rows."""
    days, gpus, jobs, users = args.days, args.gpus, args.jobs, args.users
    rng = random.Random(args.seed)
    span = days * 86_400.0
    sizes = [size for size in (1, 2, 4, gpus) if size <= gpus]
    mean_gpus = statistics.mean(sizes)
    mean_s = 0.8 * span * gpus / (jobs * mean_gpus)
    connection = open_database(path)
    rows = 0
    for number in range(jobs):
        user = f"user{rng.randrange(users):03d}"
        owner = Owner("slurm", str(100_000 + number), user, f"project{int(user[4:]) % 10}")
        size = rng.choice(sizes)
        start = now_s - span + rng.uniform(0.0, span)
        end = min(now_s, start + rng.expovariate(1.0 / mean_s))
        tallies = job_tallies(owner, rng.sample(range(gpus), size), start, end, rng)
        connection.execute("BEGIN IMMEDIATE")
        accounting_table.store(connection, tallies)
        connection.execute("COMMIT")
        rows += len(tallies)
    connection.close()
    return rows


def time_command(path: Path, by: str, days: float) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nvdash", "report", "--history", str(path), "--range", f"{days:g}d",
                    "--by", by, "--format", "table"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--path", default=None, help="directory for the history file (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the file")
    args = parser.parse_args()
    directory = Path(args.path or tempfile.mkdtemp(prefix="nvdash-accounting-"))
    path = directory / "history.sqlite"
    now_s = time.time()
    started = time.perf_counter()
    rows = fill(path, args, now_s)
    print(f"{args.jobs} jobs on {args.gpus} GPUs over {args.days:g} days: {rows} hourly rows, "
          f"{path.stat().st_size / 1e6:.1f} MB, written in {time.perf_counter() - started:.1f} s")
    history = SqliteHistory(path)
    book = AccountingBook(connection=history.connection)
    chosen = accounting_range({"range": f"{args.days:g}d"}, now_s + 1.0)
    print(f"{'by':<10} {'rows out':>8} {'in process (median)':>20} {'nvdash report (median of 3)':>28}")
    for by in GROUPINGS:
        timings = []
        report = None
        for _ in range(args.repeat):
            begin = time.perf_counter()
            report = make_report(book, chosen, by)
            timings.append(time.perf_counter() - begin)
        command = statistics.median(time_command(path, by, args.days) for _ in range(3))
        assert report is not None
        print(f"{by:<10} {len(report.rows):>8} {statistics.median(timings) * 1000:>17.1f} ms "
              f"{command * 1000:>25.0f} ms")
    if args.keep:
        print(f"kept {path}")
    else:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
