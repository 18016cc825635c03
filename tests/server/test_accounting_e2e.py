"""Accounting end to end: simulated GPUs, the real sampler, real child processes in Slurm cgroups and a real
job-mapping directory, the history writer's SQLite file, and ``nvdash report`` run as a command.

What each job is charged is compared with what the simulated GPUs' own readings add up to: GPU-seconds are the
time between the readings that closed the job's intervals, joules the energy counter's difference over them.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.accounting.accountant import Accountant
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.hardware import Hardware, open_hardware
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.records import Snapshot
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.usage import UsageCollector
from nvdash.store import Store
from tests.conftest import nvdash_env, wait_for
from tests.unit.test_usage import proc_root_with_cgroup

INTERVAL_S = 0.25
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_9003/step_0/user/task_0\n"
UNNAMED_UID = 4_000_042


@pytest.fixture
def hardware() -> Iterator[Hardware]:
    opened = open_hardware("dgx-h100")
    yield opened
    opened.close()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    # Lives until the test closes its standard input.
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "--nvdash-test-child"],
                               stdin=subprocess.PIPE)
    yield process
    assert process.stdin is not None
    process.stdin.close()
    process.wait(10)


def report(history: Path, by: str) -> dict[str, dict[str, object]]:
    """``nvdash report --format json`` over the file, rows by key."""
    result = subprocess.run(
        [sys.executable, "-m", "nvdash", "report", "--history", str(history), "--range", "1h", "--by", by,
         "--format", "json"], capture_output=True, text=True, timeout=120, env=nvdash_env(), check=False)
    assert result.returncode == 0, result.stderr
    return {row["key"]: row for row in json.loads(result.stdout)["rows"]}


def charged(snapshots: list[Snapshot], gpu: int, first: int, last: int) -> tuple[float, float]:
    """Seconds and joules of ``gpu`` over the intervals closed by readings ``first`` to ``last`` (inclusive)."""
    assert 1 <= first <= last
    before, end = snapshots[first - 1], snapshots[last]
    energy = [next(g.energy_mj for g in s.gpus if g.index == gpu) for s in (before, end)]
    assert None not in energy
    return end.time_s - before.time_s, (energy[1] - energy[0]) / 1000.0  # type: ignore[operator]


def test_jobs_are_charged_what_the_gpus_readings_add_up_to(
    hardware: Hardware, child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    fake = hardware.fake
    assert isinstance(fake, FakeNvmlLibrary)
    assert hardware.gpus is not None
    inventory = hardware.inventory
    uuids = {gpu.index: gpu.uuid for gpu in inventory.gpus}
    mapping = tmp_path / "job-mapping"
    mapping.mkdir()
    (mapping / "0").write_text(f"9001 {UNNAMED_UID}\n")  # by index, with the job's user
    (mapping / uuids[1]).write_text("9002\n")  # by UUID
    fake.add_process(7, child.pid, memory_mib=300)  # a real process on GPU 7, in Slurm job 9003's cgroup
    host = HostProcessTable(proc_root_with_cgroup(tmp_path / "proc", child.pid, SLURM_V2), follow_links=True)

    store = Store(inventory, capacity=10_000)
    accountant = Accountant(uuids, job_mapping_dir=mapping, idle_after_s=3600.0)
    store.add_listener(accountant)
    owners = OwnersSeen(accountant)
    store.add_listener(owners)  # after the accountant: sees the shares it just gave each reading
    history = tmp_path / "history.sqlite"
    writer = HistoryWriter(history, inventory, "simulated:dgx-h100", INTERVAL_S, accounting=accountant)
    writer.start()
    sampler = Sampler(store, hardware.host, hardware.gpus, INTERVAL_S,
                      usage=UsageCollector(hardware.gpus, host), usage_interval_s=2 * INTERVAL_S)
    sampler.start()
    try:
        def snapshots() -> list[Snapshot]:
            return store.since(0)[0]

        def seen_on_7(rows: list[Snapshot]) -> list[int]:
            return [i for i, s in enumerate(rows)
                    if s.usage is not None and any(p.pid == child.pid for p in s.usage.processes)]

        wait_for(snapshots, lambda rows: len(seen_on_7(rows)) >= 8, timeout_s=120.0)
        rewritten_at = len(snapshots())
        (mapping / "0").write_text("9004\n")  # the next job's prolog rewrites GPU 0's file
        wait_for(lambda: owners.gpu0, lambda seen: "9004" in seen[-4:], timeout_s=60.0)
        wait_for(lambda: owners.gpu0, lambda seen: seen[-4:] == ["9004"] * 4, timeout_s=60.0)
    finally:
        sampler.stop()
    writer.stop()
    rows = snapshots()
    assert len(rows) < store.capacity, "every reading is still in the store"
    last = len(rows) - 1
    tolerance_s = 1.5 * INTERVAL_S

    jobs = report(history, "job")
    assert set(jobs) >= {"9001", "9002", "9003", "9004"}

    # GPU 1: job 9002 from the first interval to the last.
    seconds, joules = charged(rows, 1, 1, last)
    assert jobs["9002"]["gpus"] == [1]
    assert jobs["9002"]["gpu_seconds"] == pytest.approx(seconds, abs=1e-3)
    assert jobs["9002"]["energy_j"] == pytest.approx(joules, abs=1e-2)
    assert jobs["9002"]["energy_complete"] is True

    # GPU 0: job 9001, then 9004 once its file was read; each interval charged to one of them, never both.
    seconds, joules = charged(rows, 0, 1, last)
    assert len(owners.gpu0) == len(rows)
    first_9004 = owners.gpu0.index("9004")
    assert set(owners.gpu0[:first_9004]) == {"9001"}
    assert set(owners.gpu0[first_9004:]) == {"9004"}
    assert first_9004 >= rewritten_at - 1, "the file is read at the next usage reading, not before it was written"
    on_9001, energy_9001 = charged(rows, 0, 1, first_9004 - 1)
    assert jobs["9001"]["gpus"] == [0]
    assert jobs["9001"]["gpu_seconds"] + jobs["9004"]["gpu_seconds"] == pytest.approx(seconds, abs=1e-3)
    assert jobs["9001"]["energy_j"] + jobs["9004"]["energy_j"] == pytest.approx(joules, abs=1e-2)
    assert jobs["9001"]["gpu_seconds"] == pytest.approx(on_9001, abs=1e-3)
    one_sample_j = max(charged(rows, 0, i, i)[1] for i in range(1, last + 1))
    assert jobs["9001"]["energy_j"] == pytest.approx(energy_9001, abs=1e-2)
    assert jobs["9004"]["gpu_seconds"] == pytest.approx(seconds - on_9001, abs=1e-3)

    # GPU 7: Slurm job 9003 from its cgroup, from the reading that first listed the child's process.
    first_7 = max(seen_on_7(rows)[0], 1)  # the first reading only opens the count
    seconds, joules = charged(rows, 7, first_7, last)
    assert jobs["9003"]["gpus"] == [7]
    assert jobs["9003"]["kinds"] == ["slurm"]
    assert jobs["9003"]["gpu_seconds"] == pytest.approx(seconds, abs=tolerance_s)
    assert jobs["9003"]["energy_j"] == pytest.approx(joules, abs=one_sample_j)

    users = report(history, "user")
    me = pwd.getpwuid(os.getuid()).pw_name
    assert users[f"uid {UNNAMED_UID}"]["gpus"] == [0], "job 9001's user, from the mapping file"
    assert 7 in users[me]["gpus"], "job 9003's user, from its process"


class OwnersSeen:
    """A store listener that notes GPU 0's owner at each reading (after the accountant gave it its shares)."""

    def __init__(self, accountant: Accountant) -> None:
        self._accountant = accountant
        self.gpu0: list[str] = []

    def submit(self, snapshot: Snapshot) -> None:
        jobs = sorted(share.owner.job for share in self._accountant.shares if share.gpu_index == 0)
        self.gpu0.append(",".join(jobs))

    def submit_events(self, events: object) -> None:
        """Events are not needed."""
