"""A real server over simulated GPUs that follow a process file (``NVDASH_FAKE_PROCESS_FILE``): a process written
into the file after the server started shows in ``/api/processes.json`` with its memory, and goes once it is
killed (NVML stops listing a process that exited); a bad version of the file is one warning line in the log."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import get_json, nvdash_server, wait_for
from tests.fake_processes import write_process_file

MIB = 1 << 20


def listed(url: str, pid: int) -> list[dict[str, Any]]:
    """The entries of ``pid`` in the newest process reading."""
    return [p for p in get_json(url + "/api/processes.json")["processes"] if p["pid"] == pid]


def test_a_process_written_into_the_file_is_listed_until_killed(tmp_path: Path) -> None:
    path = tmp_path / "processes"
    args = ["--simulate", "timesliced", "--process-interval", "0.5", "--no-history"]
    with nvdash_server(args, env={"NVDASH_FAKE_PROCESS_FILE": str(path)}) as server:
        child = subprocess.Popen(["sleep", "600"])
        try:
            wait_for(lambda: Path(f"/proc/{child.pid}/comm").read_text().strip(), lambda comm: comm == "sleep")
            write_process_file(path, [f"process:0:{child.pid}:0.3:2048"])
            [entry] = wait_for(lambda: listed(server.url, child.pid), bool)
            assert (entry["gpu"], entry["gpu_memory_bytes"], entry["types"]) == (0, 2048 * MIB, ["compute"])
            assert entry["command"] is not None
            assert "sleep" in entry["command"]  # a host process: nvdash reads its command line
            child.kill()
            child.wait(10)
            wait_for(lambda: listed(server.url, child.pid), lambda entries: entries == [])
        finally:
            child.kill()
            child.wait(10)
        # A bad version: one warning line in the log, however often the GPUs are read after it.
        write_process_file(path, ["process:0:4301:half"])
        wait_for(server.output, lambda output: "left as it was" in output)
        first = get_json(server.url + "/api/processes.json")["time_s"]
        wait_for(lambda: get_json(server.url + "/api/processes.json")["time_s"], lambda t: t >= first + 2.0)
        warnings = [line for line in server.output().splitlines() if "process file" in line]
        assert warnings == [f"nvdash: WARNING: process file {path} left as it was: bad item 'process:0:4301:half': "
                            "SM share 'half' is not a number"]
        assert "Traceback" not in server.output()
