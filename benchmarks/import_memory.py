"""Peak memory of ``nvdash import`` against the length of the nvidia-smi log imported.

    python benchmarks/import_memory.py [--sizes 10,40]

Writes an nvidia-smi ``--query-gpu`` loop log of 8 GPUs (13 fields) of each size in MB, imports it into a new
history file with ``python -m nvdash import`` as a child process, and prints the child's peak resident set
(``wait4``'s ``ru_maxrss``), the readings imported and the time taken. A batched import holds one batch whatever
the log's length: its peak stays flat as the log grows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.nvsmi_log import write_log

MIB = 1 << 20


def measure(log: Path, history: Path) -> tuple[float, float]:
    """The child's peak resident set in MiB and its wall time in seconds."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "nvdash", "import", str(log), "--history", str(history)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"import of {log} failed: {errors.decode()[-500:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,40", help="log sizes in MB, comma separated")
    args = parser.parse_args()
    print(f"{'log MB':>7} {'readings':>9} {'peak RSS MiB':>13} {'seconds':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for size in (int(part) for part in args.sizes.split(",")):
            log = Path(folder) / f"log{size}.csv"
            readings = write_log(log, size * MIB)
            rss, seconds = measure(log, Path(folder) / f"history{size}.sqlite")
            print(f"{size:>7} {readings:>9} {rss:>13.0f} {seconds:>8.1f}")


if __name__ == "__main__":
    main()
