"""``nvdash import`` of a long nvidia-smi log reads and writes in batches: its peak memory does not grow with the
log (measured in bytes, as the child's peak resident set, never in time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import nvdash_env
from tests.nvsmi_log import GPUS, write_log

MIB = 1 << 20


def import_peak_rss(log: Path, history: Path) -> tuple[int, str]:
    """Run ``nvdash import LOG`` as a child; its peak resident set in bytes (``wait4``) and its output."""
    process = subprocess.Popen([sys.executable, "-m", "nvdash", "import", str(log), "--history", str(history)],
                               env=nvdash_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, output
    return usage.ru_maxrss * 1024, output


def test_import_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    small, large = tmp_path / "small.csv", tmp_path / "large.csv"
    small_lines = write_log(small, 5 * MIB)
    large_lines = write_log(large, 20 * MIB)
    small_rss, small_out = import_peak_rss(small, tmp_path / "small.sqlite")
    large_rss, large_out = import_peak_rss(large, tmp_path / "large.sqlite")
    assert f"imported {small_lines} readings of {GPUS} GPUs" in small_out
    assert f"imported {large_lines} readings of {GPUS} GPUs" in large_out
    # Four times the log: the old import (every row held) took about three times the memory; a batched one
    # takes the same, give or take the page cache of a larger file.
    assert large_rss < 1.5 * small_rss, (small_rss // MIB, large_rss // MIB)
