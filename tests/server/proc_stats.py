"""What a server process holds, read from ``/proc``: resident memory, threads, open file descriptors."""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcStats(NamedTuple):
    rss_bytes: int
    threads: int
    fds: int


def proc_stats(pid: int) -> ProcStats:
    """``VmRSS`` and ``Threads`` from ``/proc/<pid>/status`` and the entries of ``/proc/<pid>/fd``."""
    fields: dict[str, str] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    rss_kib = int(fields["VmRSS"].split()[0])
    return ProcStats(rss_kib * 1024, int(fields["Threads"]), len(os.listdir(f"/proc/{pid}/fd")))
