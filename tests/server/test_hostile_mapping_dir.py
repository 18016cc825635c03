"""A job-mapping directory with hostile entries (a FIFO, links to ``/dev/zero`` and out of the directory, a huge
file) given to a real server: the sampler keeps sweeping, the other files still map their jobs, memory stays
bounded, and ``/health`` names what was refused and why."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.conftest import nvdash_server, wait_for
from tests.server.proc_stats import proc_stats

SUPERVISED = ("nvdash-xid", "nvdash-kubelet", "nvdash-names")
ARGS = ("--simulate", "dgx-h100", "--interval", "0.25", "--process-interval", "0.25", "--no-history")


def _sweeps(health: dict[str, Any]) -> int:
    sampler = health["sampler"]
    return int(sampler["sweeps"]) if sampler is not None else 0


def _keeps_sweeping(server: Any) -> None:
    """The sampler's sweep count goes on rising (a blocked sampler thread would leave it where it is)."""
    before = _sweeps(server.health())
    wait_for(server.health, lambda h: _sweeps(h) >= before + 8, timeout_s=60.0)


def test_a_fifo_in_the_mapping_directory_neither_blocks_the_sampler_nor_hides_the_other_files(tmp_path: Path) -> None:
    mapping = tmp_path / "map"
    mapping.mkdir()
    os.mkfifo(mapping / "0")  # read first (names are read in order): it must not stop the reads after it
    (mapping / "3").write_text("31337\n")
    with nvdash_server((*ARGS, "--job-mapping-dir", str(mapping))) as server:
        status = wait_for(lambda: server.health()["accounting"], lambda s: s["mapped_jobs"] == ["31337"],
                          timeout_s=60.0)
        assert status["job_mapping_refused"] == {"0": "a FIFO"}
        _keeps_sweeping(server)
        (mapping / "5").write_text("4711 1000\n")  # a prolog writes a file later: it is read as usual
        status = wait_for(lambda: server.health()["accounting"], lambda s: s["mapped_jobs"] == ["31337", "4711"],
                          timeout_s=60.0)
        assert status["job_mapping_refused"] == {"0": "a FIFO"}
        _keeps_sweeping(server)
        assert "not reading 0: a FIFO" in server.output()
        # The XID waiter, the kubelet watcher and the name resolver (asked for UID 1000) run supervised.
        threads = wait_for(lambda: server.health()["threads"],
                           lambda t: all(t.get(name, {}).get("last_beat_at") for name in SUPERVISED))
        assert all(threads[name]["running"] and threads[name]["deaths"] == 0 for name in SUPERVISED), threads


def test_links_out_of_the_directory_and_a_huge_file_are_refused_and_memory_stays_bounded(tmp_path: Path) -> None:
    mapping = tmp_path / "map"
    mapping.mkdir()
    outside = tmp_path / "secret"
    outside.write_text("999\n")
    (mapping / "0").symlink_to("/dev/zero")
    (mapping / "1").symlink_to(outside)
    (mapping / "2").write_bytes(b"31337\n" + b"7" * (64 << 20))  # 64 MiB: far over the cap
    (mapping / "3").write_text("4711\n")
    with nvdash_server((*ARGS, "--job-mapping-dir", str(mapping))) as server:
        status = wait_for(lambda: server.health()["accounting"], lambda s: s["mapped_jobs"] == ["4711"],
                          timeout_s=60.0)
        assert status["job_mapping_refused"] == {
            "0": "a symbolic link (not followed)",
            "1": "a symbolic link (not followed)",
            "2": "larger than 65536 bytes",
        }
        _keeps_sweeping(server)
        rss_mib = proc_stats(server.process.pid).rss_bytes >> 20
        assert rss_mib < 1024, f"the server holds {rss_mib} MiB"
        assert server.process.poll() is None
