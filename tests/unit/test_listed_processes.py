"""Real processes listed on simulated GPUs (``process:UNIT:PID:...`` and ``clear_processes:GPU`` fault items), read
back through the real pynvml, and their strict parsing: a bad item is one line naming it, on a real server too."""

from __future__ import annotations

import subprocess
import sys

import pynvml
import pytest

from nvdash.sampling.fake.profiles import PROFILES
from nvdash.sampling.fake.usage_specs import GHOST_PID_BASE
from tests.conftest import free_port, nvdash_env
from tests.unit.conftest import FakeClock, Install

MIB = 1 << 20


def handles() -> list[object]:
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def test_listed_processes_replace_the_profiles_own_on_a_cleared_gpu(install: Install, clock: FakeClock) -> None:
    fake = install("timesliced")
    fake.apply_faults("clear_processes:0;process:0:4242:0.5:1000;process:0:4243:0.25:2000:compute+mps;"
                      "process:1:4244")
    gpu0, gpu1 = handles()
    listed = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0)}
    assert listed == {4242: 1000 * MIB, 4243: 2000 * MIB}
    assert [p.pid for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(gpu0)] == [4243]
    on_gpu1 = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu1)}
    assert on_gpu1[4244] == 256 * MIB  # the defaults: 256 MiB, compute, no work
    assert GHOST_PID_BASE + 311 in on_gpu1  # GPU 1 was not cleared
    clock.at(30.0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(gpu0, 0)
    by_pid: dict[int, list[int]] = {}
    for sample in samples:
        by_pid.setdefault(sample.pid, []).append(sample.smUtil)
    assert set(by_pid) == {4242, 4243}
    gpu_util = pynvml.nvmlDeviceGetUtilizationRates(gpu0).gpu
    assert gpu_util > 0
    # Each does its share of the GPU's work at every sample: the first twice the second's (within whole percents).
    assert sum(by_pid[4242]) == pytest.approx(2 * sum(by_pid[4243]), abs=len(by_pid[4242]))


def test_a_listed_process_with_a_start_time_is_idle_until_then(install: Install, clock: FakeClock) -> None:
    """``@SECONDS``: listed (holding its memory) from the start, no utilization sample before its work starts (the
    driver keeps samples only for periods in which a process ran), its share of the work from then on."""
    fake = install("timesliced")
    fake.apply_faults("clear_processes:0;process:0:4242:0.5:1000@20")
    gpu0 = handles()[0]
    clock.at(15.0)
    assert [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0)] == [
        (4242, 1000 * MIB)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(gpu0, 0)
    clock.at(24.0)
    stamps = sorted(s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(gpu0, 0) if s.pid == 4242)
    start_us = (fake.created_at + 20.0) * 1e6
    assert stamps
    assert min(stamps) >= start_us - 1
    assert max(stamps) > start_us + 3e6


def test_a_listed_process_in_a_mig_instance(install: Install) -> None:
    fake = install("h100-mig")
    fake.apply_faults("clear_processes:0;process:0/1:4242:1.0:3000")
    gpu0 = handles()[0]
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 1)
    assert [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [(4242, 3000 * MIB)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 0)) == []


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("process:2:4242", "device 2 out of range: the profile has 2 GPU(s)"),
        ("process:0:-1", "PID -1 must be positive"),
        ("process:0:4242:1.5", "SM share '1.5' must be between 0 and 1"),
        ("process:0:4242:nan", "SM share 'nan' must be between 0 and 1"),
        ("process:0:4242:0.5:lots", "memory (MiB) 'lots' is not an integer"),
        ("process:0:4242:0.5:100:cuda", "process kind 'cuda' must be one of compute, graphics, mps"),
        ("process:0:4242:0.5:100:compute+compute", "process kinds 'compute+compute' name one kind twice"),
        ("process:0/0:4242", "GPU 0 has no MIG instance 0 in this profile's layout (0 instances)"),
        ("process:0:4242:0.5:100:compute:extra", "process takes UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]]"),
        ("clear_processes:0:1", "clear_processes takes one GPU index"),
        ("clear_processes:0@5", "clear_processes applies from the start: it takes no @SECONDS"),
    ],
)
def test_bad_items_are_one_line_naming_them(install: Install, item: str, message: str) -> None:
    fake = install("timesliced")
    with pytest.raises(ValueError, match=r"^bad NVML fault ") as caught:
        fake.apply_faults(f"clear_processes:1;{item}")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"bad NVML fault {item!r}: {message}; expected ITEM")


def test_a_bad_listed_process_stops_a_server_with_one_line() -> None:
    command = [sys.executable, "-m", "nvdash", "--simulate", "timesliced", "--port", str(free_port()), "--no-history"]
    done = subprocess.run(command, env=nvdash_env({"NVDASH_FAKE_FAULTS": "process:0:4242:0.5:1000:gpu"}),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("nvdash: error: bad NVML fault 'process:0:4242:0.5:1000:gpu': process kind 'gpu' "
                               "must be one of compute, graphics, mps; expected ITEM[;ITEM...]")
    assert PROFILES["timesliced"].gpu_count == 2
