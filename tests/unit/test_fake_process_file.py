"""The process file (``NVDASH_FAKE_PROCESS_FILE``) of the simulated NVML, and listed host processes that exit, read
back through the real pynvml.

Expected values follow NVML's definitions: ``nvmlDeviceGetComputeRunningProcesses`` lists the processes with a
compute context on the device, ``usedGpuMemory`` in bytes; a process that exits is no longer listed and its memory
no longer counts in ``nvmlDeviceGetMemoryInfo``'s ``used``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from nvdash.sampling.fake.process_file import READ_LIMIT, ProcessFileError, read_bounded
from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE
from tests.conftest import wait_for
from tests.fake_processes import write_process_file
from tests.unit.conftest import FakeClock, Install

MIB = 1 << 20
NEVER_ALIVE = 4242
"""A PID no process of this test has (listed as long as it is listed: never seen alive)."""
GPU1_OWN = GHOST_PID_BASE + 311
"""The timesliced profile's own process on GPU 1."""
LOGGER = "nvdash.sampling.fake.process_file"


def gpu(index: int) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def listed(clock: FakeClock, index: int = 0) -> dict[int, int]:
    """PID -> usedGpuMemory on GPU ``index``, a quarter of a second of the fake clock after the last look (past the
    file's and the liveness check's caching)."""
    clock.now += 0.25
    return {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu(index))}


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real ``sleep`` child, running (it has exec'd sleep); killed and reaped afterwards."""
    child = subprocess.Popen(["sleep", "600"])
    try:
        wait_for(lambda: Path(f"/proc/{child.pid}/comm").read_text().strip(), lambda comm: comm == "sleep")
        yield child
    finally:
        child.kill()
        child.wait(10)


def test_items_appear_once_written_and_go_once_removed(install: Install, clock: FakeClock, tmp_path: Path) -> None:
    path = tmp_path / "processes"  # missing at first: no items
    install("timesliced", process_file=str(path))
    before = listed(clock)
    assert NEVER_ALIVE not in before
    write_process_file(path, [f"process:0:{NEVER_ALIVE}:0.3:2048", "process:1:4243"])
    assert wait_for(lambda: listed(clock), lambda now: NEVER_ALIVE in now) == {**before, NEVER_ALIVE: 2048 * MIB}
    assert listed(clock, 1)[4243] == 256 * MIB  # the defaults of a process item
    write_process_file(path, ["process:1:4243:0:512"])
    assert wait_for(lambda: listed(clock), lambda now: NEVER_ALIVE not in now) == before
    assert listed(clock, 1)[4243] == 512 * MIB
    path.unlink()
    wait_for(lambda: listed(clock, 1), lambda now: 4243 not in now)


def test_the_profiles_own_processes_stay_unless_the_file_clears_them(
    install: Install, clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "processes"
    install("timesliced", process_file=str(path))
    assert GPU1_OWN in listed(clock, 1)
    write_process_file(path, ["clear_processes:1", f"process:1:{NEVER_ALIVE}"])
    assert wait_for(lambda: listed(clock, 1), lambda now: NEVER_ALIVE in now) == {NEVER_ALIVE: 256 * MIB}
    write_process_file(path, [f"process:1:{NEVER_ALIVE}"])  # the clear item removed: the profile's own are back
    on_gpu1 = wait_for(lambda: listed(clock, 1), lambda now: GPU1_OWN in now)
    assert on_gpu1[NEVER_ALIVE] == 256 * MIB


def test_a_killed_process_is_no_longer_listed_and_its_memory_is_freed(
    install: Install, clock: FakeClock, tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    path = tmp_path / "processes"
    install("timesliced", process_file=str(path))
    write_process_file(path, ["clear_processes:0", f"process:0:{sleeper.pid}:0.3:2048",
                              f"process:0:{NEVER_ALIVE}:0.2:1000"])
    expected = {sleeper.pid: 2048 * MIB, NEVER_ALIVE: 1000 * MIB}
    assert wait_for(lambda: listed(clock), lambda now: sleeper.pid in now) == expected
    used_before = pynvml.nvmlDeviceGetMemoryInfo(gpu(0)).used
    os.kill(sleeper.pid, signal.SIGKILL)  # not reaped: an exited process is gone for the driver while a zombie
    assert wait_for(lambda: listed(clock), lambda now: sleeper.pid not in now) == {NEVER_ALIVE: 1000 * MIB}
    assert used_before - pynvml.nvmlDeviceGetMemoryInfo(gpu(0)).used == 2048 * MIB
    sleeper.wait(10)
    assert listed(clock) == {NEVER_ALIVE: 1000 * MIB}


def test_a_process_of_a_fault_item_is_no_longer_listed_once_it_exits(
    install: Install, clock: FakeClock, sleeper: subprocess.Popen[bytes]
) -> None:
    fake = install("timesliced")
    fake.apply_faults(f"clear_processes:0;process:0:{sleeper.pid}:0.5:3000;process:0:{NEVER_ALIVE}:0:100")
    assert listed(clock) == {sleeper.pid: 3000 * MIB, NEVER_ALIVE: 100 * MIB}
    used_before = pynvml.nvmlDeviceGetMemoryInfo(gpu(0)).used
    sleeper.kill()
    sleeper.wait(10)
    assert wait_for(lambda: listed(clock), lambda now: sleeper.pid not in now) == {NEVER_ALIVE: 100 * MIB}
    assert used_before - pynvml.nvmlDeviceGetMemoryInfo(gpu(0)).used == 3000 * MIB


def test_a_process_a_test_adds_stays_until_removed(
    install: Install, clock: FakeClock, sleeper: subprocess.Popen[bytes]
) -> None:
    """``add_process`` lists what the test says, alive or not (tests remove it with ``remove_process``)."""
    fake = install("timesliced")
    fake.add_process(0, sleeper.pid, memory_mib=64)
    sleeper.kill()
    sleeper.wait(10)
    clock.now += 1.0
    assert listed(clock)[sleeper.pid] == 64 * MIB


def stat_line(pid: int, start_ticks: int, state: str = "S") -> str:
    """A ``/proc/PID/stat`` line (proc(5)): the start time is field 22; a command with spaces and parentheses."""
    after_state = ["1"] * 18 + [str(start_ticks)] + ["0"] * 30
    return f"{pid} (odd ) (name) {state} {' '.join(after_state)}\n"


def test_a_reused_pid_is_another_process(install: Install, clock: FakeClock, tmp_path: Path) -> None:
    """A PID whose start time changed is not the process seen: the one listed has exited."""
    proc = tmp_path / "proc"
    (proc / "4301").mkdir(parents=True)
    (proc / "4302").mkdir(parents=True)
    (proc / "4301" / "stat").write_text(stat_line(4301, 1000))
    (proc / "4302" / "stat").write_text(stat_line(4302, 2000))
    fake = install("timesliced", proc_root=str(proc))
    fake.apply_faults("clear_processes:0;process:0:4301:0:100;process:0:4302:0:200;process:0:4303:0:300")
    assert listed(clock) == {4301: 100 * MIB, 4302: 200 * MIB, 4303: 300 * MIB}
    (proc / "4301" / "stat").write_text(stat_line(4301, 1001))
    (proc / "4302" / "stat").write_text(stat_line(4302, 2000, "Z"))
    assert listed(clock) == {4303: 300 * MIB}  # 4303 was never seen alive: listed as NVML lists it
    (proc / "4301" / "stat").write_text(stat_line(4301, 1000))  # exited is final
    (proc / "4302" / "stat").write_text(stat_line(4302, 2000))
    assert listed(clock) == {4303: 300 * MIB}


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_a_bad_version_keeps_the_previous_items_and_is_logged_once(
    install: Install, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    path = tmp_path / "processes"
    install("timesliced", process_file=str(path))
    write_process_file(path, [f"process:0:{NEVER_ALIVE}:0.3:2048"])
    good = wait_for(lambda: listed(clock), lambda now: NEVER_ALIVE in now)
    bad_versions: list[tuple[bytes, str]] = [
        (b"process:0:4243\nprocess:0:lots\n", "bad item 'process:0:lots': PID 'lots' is not an integer"),
        (b"process:0:4243@5\n", "bad item 'process:0:4243@5': @SECONDS is not taken in the process file"),
        (b"process:2:4243\n", "bad item 'process:2:4243': device 2 out of range: the profile has 2 GPU(s)"),
        (b"lose:0\n", "bad item 'lose:0': a process file holds only process:UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]] "
                       "and clear_processes:GPU items"),
        (b"process:0:4243\n" * (READ_LIMIT // 15 + 1), "it is larger than 64 KiB"),
        (b"process:0:4243\xff\n", "it is not UTF-8 text"),
    ]
    for content, _ in bad_versions:
        temporary = tmp_path / "next"
        temporary.write_bytes(content)
        temporary.replace(path)
        for _ in range(5):  # five looks at the same bad version: one warning
            assert listed(clock) == good
    assert warnings(caplog) == [f"process file {path} left as it was: {message}" for _, message in bad_versions]
    write_process_file(path, ["process:0:4243;process:0:4244:0:1"])  # ';' separates items too
    assert wait_for(lambda: listed(clock), lambda now: NEVER_ALIVE not in now) == {
        **{pid: memory for pid, memory in good.items() if pid != NEVER_ALIVE}, 4243: 256 * MIB, 4244: MIB}
    assert all("\n" not in line for line in warnings(caplog))


def in_thread(work: object) -> threading.Thread:
    assert callable(work)
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(30.0)  # a deadline: it returns at once unless it hangs
    return thread


def test_a_fifo_at_the_path_does_not_hang_the_driver(
    install: Install, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    path = tmp_path / "processes"
    install("timesliced", process_file=str(path))
    write_process_file(path, [f"process:0:{NEVER_ALIVE}"])
    good = wait_for(lambda: listed(clock), lambda now: NEVER_ALIVE in now)
    path.unlink()
    os.mkfifo(path)
    answers: list[dict[int, int]] = []
    assert not in_thread(lambda: answers.extend(listed(clock) for _ in range(5))).is_alive()
    assert answers == [good] * 5
    assert warnings(caplog) == [f"process file {path} left as it was: it is not a regular file"]


def test_reading_a_fifo_does_not_block(tmp_path: Path) -> None:
    """Even if a FIFO replaces the file between its status and its opening (and a writer holds it open)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[str] = []

    def read() -> None:
        try:
            read_bounded(str(fifo))
        except ProcessFileError as error:
            outcome.append(str(error))

    assert not in_thread(read).is_alive()
    writer = os.open(fifo, os.O_RDWR)  # a writer that never writes
    try:
        assert not in_thread(read).is_alive()
    finally:
        os.close(writer)
    assert outcome == ["it is not a regular file"] * 2
