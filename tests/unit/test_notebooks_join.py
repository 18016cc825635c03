"""The join of a Jupyter server's kernels to the GPU processes: nearest ancestor kernel, sums per GPU, the trend of
each kernel over time, and every state in which the join cannot be made.

The process tree is a stand-in ``/proc`` built in a temporary folder (``stat`` files), or the real one with real
processes (a parent with a child and a grandchild).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from nvdash.sampling.jupyter_kernels import (
    JupyterKernel,
    JupyterKernels,
    JupyterServer,
    KernelSession,
    read_boot_id,
    write_kernels_file,
)
from nvdash.sampling.notebook_records import KernelUse, NotebookView
from nvdash.sampling.notebooks import PROCESSES_OFF, WAITING_FIRST, NotebookTracker
from nvdash.sampling.process_tree import MAX_DEPTH, ProcessTree, nearest_known
from nvdash.sampling.records import GpuSample, HostInfo, HostSample, Inventory
from nvdash.sampling.sampler import Sampler
from nvdash.sampling.usage_records import GpuProcess, GpuUsage, HostProcess, MigInstance, Usage
from nvdash.server.options import UsageError, parse_settings
from nvdash.store import Store

MIB = 1 << 20
BTIME = 1_700_000_000
TICKS = os.sysconf("SC_CLK_TCK")
HOST = "gpu-07"
BOOT = "6f1c0000-boot"
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


def started(ticks: int) -> float:
    """The start time (epoch seconds) of a process that started ``ticks`` after boot."""
    return BTIME + ticks / TICKS


class FakeProc:
    """A stand-in ``/proc``: the boot time and one ``stat`` file per process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)
        (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BTIME}\nprocesses 10\n")

    def add(self, pid: int, ppid: int, ticks: int, comm: str = "python3") -> None:
        folder = self.root / str(pid)
        folder.mkdir(exist_ok=True)
        rest = " ".join(["0"] * 17)
        (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {rest} {ticks} 0 0 0\n")


def kernel(number: int, pid: int | None, started_s: float | None, *, local: bool = True,
           path: str | None = None) -> JupyterKernel:
    sessions = () if path is None else (KernelSession(path, path.rsplit("/", 1)[-1], "notebook"),)
    return JupyterKernel(id=f"k{number}-0b8f", name="python3", pid=pid, started_s=started_s, local=local,
                         execution_state="idle", sessions=sessions)


def write(path: Path, kernels: Sequence[JupyterKernel], hostname: str = HOST, boot_id: str | None = BOOT) -> None:
    write_kernels_file(path, JupyterKernels(JupyterServer(4242, hostname, boot_id, "/user/alice/"), 1.0,
                                            tuple(kernels)))


def process(pid: int, memory_mib: int | None, sm_pct: float | None, gpu: int = 0, *, visible: bool = True,
            mig_uuid: str | None = None) -> GpuProcess:
    return GpuProcess(gpu_index=gpu, gpu_uuid=(GPU0, GPU1)[gpu], pid=pid, kinds=("compute",),
                      gpu_memory_bytes=None if memory_mib is None else memory_mib * MIB, sm_pct=sm_pct,
                      mig_uuid=mig_uuid, host=HostProcess(pid) if visible else None)


def usage(time_s: float, processes: Sequence[GpuProcess], readable: bool = True) -> Usage:
    gpus = tuple(GpuUsage(index, uuid, processes_readable=readable, process_utilization=True)
                 for index, uuid in enumerate((GPU0, GPU1)))
    return Usage(time_s=time_s, gpus=gpus, processes=tuple(processes))


def samples(*used_mib: int, reserved: bool = True) -> tuple[GpuSample, ...]:
    return tuple(GpuSample(index, memory_used_bytes=mib * MIB, memory_reserved_bytes=300 * MIB if reserved else None)
                 for index, mib in enumerate(used_mib))


def by_id(view: NotebookView) -> dict[str, KernelUse]:
    return {use.kernel.id: use for use in view.kernels}


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def tracker(path: Path, proc: FakeProc) -> NotebookTracker:
    return NotebookTracker(path, proc_root=proc.root, hostname=HOST, boot_id=BOOT)


# -- the join ----------------------------------------------------------------------------------------------------------


def test_processes_count_for_their_nearest_kernel_summed_per_gpu(tmp_path: Path, proc: FakeProc) -> None:
    # Kernel 1 (100) -> worker 101 -> its worker 102; worker 101 also started kernel 2 (200) -> 201.
    proc.add(1, 0, 1)
    proc.add(10, 1, 50)
    proc.add(100, 10, 1000)
    proc.add(101, 100, 1100)
    proc.add(102, 101, 1200)
    proc.add(200, 101, 2000)
    proc.add(201, 200, 2100)
    proc.add(300, 1, 3000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000), path="train/a.ipynb"), kernel(2, 200, started(2000)),
                 kernel(3, None, None, local=False)])
    view = tracker(path, proc).update(50.0, usage(50.0, [
        process(100, 1000, 10.0), process(102, 500, 20.0), process(102, 300, 5.0, gpu=1),
        process(201, 2000, 0.0), process(300, 4000, 60.0),
    ]), samples(7800, 300))
    assert view.state == "ok"
    assert view.reason is None
    assert view.time_s == 50.0
    assert view.base_url == "/user/alice/"
    assert [use.kernel.id for use in view.kernels] == ["k1-0b8f", "k2-0b8f", "k3-0b8f"]
    first, second, remote = view.kernels
    assert [(u.gpu_index, u.gpu_uuid, u.memory_bytes, u.sm_pct, u.pids) for u in first.gpus] == [
        (0, GPU0, 1500 * MIB, 30.0, (100, 102)), (1, GPU1, 300 * MIB, 5.0, (102,))]
    assert first.memory_bytes == 1800 * MIB
    assert first.sm_pct == 17.5
    assert first.sm_pct_1min == 17.5
    assert first.idle_since_s is None
    assert first.holding_since_s == 50.0
    assert [(u.gpu_index, u.memory_bytes, u.sm_pct, u.pids) for u in second.gpus] == [(0, 2000 * MIB, 0.0, (201,))]
    assert second.memory_bytes == 2000 * MIB
    assert second.sm_pct == 0.0
    assert second.idle_since_s == 50.0
    assert second.holding_since_s == 50.0
    assert remote.gpus == ()
    assert remote.memory_bytes is None


def test_sm_sum_is_capped_and_unknown_memory_or_sm_is_unknown(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    proc.add(101, 100, 1001)
    proc.add(200, 1, 2000)
    proc.add(201, 200, 2001)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000)), kernel(2, 200, started(2000))])
    view = tracker(path, proc).update(10.0, usage(10.0, [
        process(100, 100, 70.0), process(101, 100, 60.0), process(200, None, 5.0), process(201, 10, None, gpu=1),
    ]), samples(1000, 1000))
    first, second = view.kernels
    assert first.gpus[0].sm_pct == 100.0
    assert first.memory_bytes == 200 * MIB
    assert [(u.memory_bytes, u.sm_pct) for u in second.gpus] == [(None, 5.0), (10 * MIB, None)]
    assert second.memory_bytes is None
    assert second.sm_pct is None
    assert second.sm_pct_1min is None
    assert second.holds_memory
    assert second.idle_since_s is None
    assert second.holding_since_s == 10.0


def test_a_process_that_reused_a_kernels_pid_is_not_that_kernel(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000 + 5 * TICKS)  # started 5 s after the kernel the file names
    proc.add(101, 100, 9000)
    proc.add(200, 1, 2000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000)), kernel(2, 200, started(2000) + 0.4)])  # 0.4 s: still kernel 2
    view = tracker(path, proc).update(10.0, usage(10.0, [process(100, 800, 50.0), process(101, 200, 1.0),
                                                         process(200, 64, 3.0)]), samples(1064))
    first, second = view.kernels
    assert first.gpus == ()
    assert first.memory_bytes == 0
    assert first.holding_since_s is None
    assert second.memory_bytes == 64 * MIB
    assert second.gpus[0].pids == (200,)


def test_nearest_known_stops_at_pid_1_at_a_loop_and_after_max_depth(proc: FakeProc) -> None:
    proc.add(5, 6, 10)  # a loop: 5 -> 6 -> 5
    proc.add(6, 5, 10)
    for pid in range(1000, 1000 + MAX_DEPTH + 2):  # a chain deeper than the walk goes
        proc.add(pid, pid - 1, 100)
    proc.add(999, 1, 50)
    proc.add(1, 0, 1)
    tree = ProcessTree(proc.root)
    known = {999: started(50), 1: started(1)}
    deepest = 1000 + MAX_DEPTH + 1
    assert nearest_known([5, deepest, 1000 + MAX_DEPTH - 2, 424242], known, tree) == {1000 + MAX_DEPTH - 2: 999}
    assert nearest_known([999, 1], known, tree) == {999: 999, 1: 1}


# -- over time ---------------------------------------------------------------------------------------------------------


def test_one_minute_mean_idle_and_holding_runs(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))])
    notebooks = tracker(path, proc)
    # (time, memory MiB, SM %): busy, busy, idle, idle, nothing held, held idle, busy, then after a minute.
    readings = [(0.0, 500, 40.0), (20.0, 500, 20.0), (40.0, 500, 0.0), (60.0, 500, 0.0), (80.0, None, None),
                (100.0, 500, 0.0), (110.0, 500, 30.0), (180.0, 500, 0.0)]
    seen = []
    for time_s, memory, sm in readings:
        listed = [] if memory is None else [process(100, memory, sm)]
        use = notebooks.update(time_s, usage(time_s, listed), samples(0 if memory is None else 600)).kernels[0]
        seen.append((use.sm_pct, use.sm_pct_1min, use.idle_since_s, use.holding_since_s))
    assert seen == [
        (40.0, 40.0, None, 0.0),
        (20.0, 30.0, None, 0.0),
        (0.0, 20.0, 40.0, 0.0),  # idle from the first reading at 0 % that holds memory
        (0.0, 15.0, 40.0, 0.0),  # the readings of 0 to 60 s: (40 + 20 + 0 + 0) / 4
        (None, 20 / 3, None, None),  # 20 to 80 s: (20 + 0 + 0) / 3; holds nothing: neither idle nor holding
        (0.0, 0.0, 100.0, 100.0),  # 40 to 100 s: 0, 0, (none), 0
        (30.0, 10.0, None, 100.0),  # busy: no longer idle; 50 to 110 s: (0 + 0 + 30) / 3
        (0.0, 0.0, 180.0, 100.0),  # a new idle run; only its own reading is in the last minute
    ]


def test_a_restarted_kernel_starts_its_trend_over(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))])
    notebooks = tracker(path, proc)
    notebooks.update(0.0, usage(0.0, [process(100, 500, 50.0)]), samples(500))
    held = notebooks.update(10.0, usage(10.0, [process(100, 500, 0.0)]), samples(500)).kernels[0]
    assert (held.sm_pct_1min, held.idle_since_s, held.holding_since_s) == (25.0, 10.0, 0.0)
    proc.add(150, 1, 5000)  # the same kernel id restarted: a new process
    write(path, [kernel(1, 150, started(5000))])
    again = notebooks.update(20.0, usage(20.0, [process(150, 700, 0.0)]), samples(700)).kernels[0]
    assert (again.memory_bytes, again.sm_pct_1min, again.idle_since_s, again.holding_since_s) == (
        700 * MIB, 0.0, 20.0, 20.0)


def test_the_file_is_read_again_only_when_its_stat_changes(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    proc.add(200, 1, 2000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000)), kernel(2, 200, started(2000))])
    notebooks = tracker(path, proc)
    reading = usage(0.0, [process(100, 10, 1.0), process(200, 20, 2.0)])
    for time_s in (0.0, 2.0, 4.0):
        assert [use.kernel.id for use in notebooks.update(time_s, reading, samples(30)).kernels] == [
            "k1-0b8f", "k2-0b8f"]
    assert notebooks.reads == 1
    write(path, [kernel(1, 100, started(1000))])
    view = notebooks.update(6.0, reading, samples(30))
    assert notebooks.reads == 2
    assert [(use.kernel.id, use.memory_bytes) for use in view.kernels] == [("k1-0b8f", 10 * MIB)]


# -- the states in which the join cannot be made -----------------------------------------------------------------------


def test_waiting_before_the_first_reading_and_while_the_file_is_missing(tmp_path: Path, proc: FakeProc) -> None:
    path = tmp_path / "kernels.json"
    notebooks = tracker(path, proc)
    assert notebooks.view == NotebookView("waiting", WAITING_FIRST)
    view = notebooks.update(5.0, usage(5.0, []), samples(0))
    assert view == NotebookView("waiting", f"The Jupyter server has not written its kernels file {path} yet.", 5.0)
    write(path, [])
    assert notebooks.update(7.0, usage(7.0, []), samples(0)) == NotebookView("ok", None, 7.0, (), "/user/alice/")
    path.unlink()
    assert notebooks.update(9.0, usage(9.0, []), samples(0)).state == "waiting"


@pytest.mark.parametrize(("content", "reason"), [
    (b"{not json", "is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)."),
    (b'{"version": 2}', "is malformed: version 2 is not 1."),
])
def test_a_malformed_file_is_unreadable_with_its_reason(tmp_path: Path, proc: FakeProc, content: bytes,
                                                         reason: str) -> None:
    path = tmp_path / "kernels.json"
    path.write_bytes(content)
    view = tracker(path, proc).update(3.0, usage(3.0, []), samples(0))
    assert view == NotebookView("unreadable", f"The kernels file {path} {reason}", 3.0)


def test_a_fifo_in_place_of_the_file_is_unreadable_and_does_not_hang(tmp_path: Path, proc: FakeProc) -> None:
    path = tmp_path / "kernels.json"
    os.mkfifo(path)
    view = tracker(path, proc).update(3.0, usage(3.0, []), samples(0))
    assert view == NotebookView("unreadable", f"The kernels file {path} is not a regular file.", 3.0)


@pytest.mark.parametrize(("hostname", "boot_id", "reason"), [
    ("gpu-08", BOOT, "The Jupyter server runs on gpu-08, not on gpu-07 whose GPUs nvdash reads, so its kernels cannot "
                     "be matched to GPU processes."),
    (HOST, "another-boot", "The Jupyter server runs on another boot of gpu-07 than nvdash (the boot ids differ: "
                           "another machine or container host), so its kernels cannot be matched to GPU processes."),
])
def test_kernels_of_another_machine_are_elsewhere(tmp_path: Path, proc: FakeProc, hostname: str, boot_id: str,
                                                  reason: str) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))], hostname=hostname, boot_id=boot_id)
    view = tracker(path, proc).update(3.0, usage(3.0, [process(100, 500, 1.0)]), samples(500))
    assert (view.state, view.reason, view.base_url) == ("elsewhere", reason, "/user/alice/")
    assert [(use.kernel.id, use.memory_bytes, use.gpus) for use in view.kernels] == [("k1-0b8f", None, ())]


def test_no_boot_id_in_the_file_compares_the_hostname_only(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))], boot_id=None)
    view = tracker(path, proc).update(3.0, usage(3.0, [process(100, 500, 1.0)]), samples(500))
    assert view.state == "ok"
    assert view.kernels[0].memory_bytes == 500 * MIB


def test_no_gpu(tmp_path: Path, proc: FakeProc) -> None:
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))])
    view = tracker(path, proc).update(3.0, Usage(3.0), ())
    assert (view.state, view.reason) == ("no_gpu", "NVML found no GPU on this machine.")


def test_no_processes_when_readings_are_off_or_nvml_hides_them(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))])
    notebooks = tracker(path, proc)
    assert (notebooks.update(1.0, None, samples(0)).state, notebooks.view.reason) == ("no_processes", PROCESSES_OFF)
    hidden = notebooks.update(2.0, usage(2.0, [], readable=False), samples(0))
    assert (hidden.state, hidden.reason) == ("no_processes", "NVML does not list the GPU processes to nvdash (not "
                                             "supported, or not permitted here), so which kernel holds memory cannot "
                                             "be known.")
    unexplained = notebooks.update(3.0, usage(3.0, []), samples(0, 2048))
    assert (unexplained.state, unexplained.reason) == ("no_processes", "NVML lists no GPU processes although GPU 1 "
                                                       "holds 2048 MiB (nvdash may not be permitted to see them), so "
                                                       "which kernel holds memory cannot be known.")
    assert unexplained.kernels[0].memory_bytes is None
    # Without the reserve, the used memory includes it: 900 MiB is an empty GPU's, 1100 MiB is not.
    assert notebooks.update(4.0, usage(4.0, []), samples(900, reserved=False)).state == "ok"
    assert notebooks.update(5.0, usage(5.0, []), samples(1100, reserved=False)).state == "no_processes"


def test_no_process_and_no_memory_is_ok_with_every_kernel_at_zero(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000)), kernel(2, None, None, local=False)])
    view = tracker(path, proc).update(3.0, usage(3.0, []), samples(200, 0))
    assert view.state == "ok"
    assert [(use.memory_bytes, use.gpus, use.sm_pct, use.idle_since_s) for use in view.kernels] == [
        (0, (), None, None), (None, (), None, None)]


def test_processes_none_of_which_is_visible_mean_another_pid_namespace(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))])
    view = tracker(path, proc).update(3.0, usage(3.0, [process(100, 500, 1.0, visible=False)]), samples(500))
    assert (view.state, view.reason) == ("pid_namespace", "NVML lists GPU processes but none of their PIDs is visible "
                                         "to nvdash (it runs in another PID namespace than the driver's), so kernels "
                                         "cannot be matched.")


# -- real processes ----------------------------------------------------------------------------------------------------

GRANDCHILD = ("import subprocess, time; g = subprocess.Popen(['sleep', '600']); print(g.pid, flush=True); "
              "time.sleep(600)")
PARENT = (
    "import subprocess, sys, time\n"
    f"child = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}], stdout=subprocess.PIPE, text=True)\n"
    "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def family() -> Iterator[tuple[int, int, int]]:
    """A real python process (the kernel), its python child and that child's ``sleep``: their PIDs."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert parent.stdout is not None
        child, grandchild = (int(pid) for pid in parent.stdout.readline().split())
        yield parent.pid, child, grandchild
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)


def real_kernel(number: int, pid: int) -> JupyterKernel:
    return kernel(number, pid, psutil.Process(pid).create_time())


def test_real_children_and_grandchildren_count_for_their_kernel(tmp_path: Path,
                                                                family: tuple[int, int, int]) -> None:
    parent, child, grandchild = family
    path = tmp_path / "kernels.json"
    write(path, [real_kernel(1, parent)], hostname=os.uname().nodename, boot_id=read_boot_id())
    view = NotebookTracker(path).update(1.0, usage(1.0, [
        process(child, 300, 10.0), process(grandchild, 200, 15.0, gpu=1), process(os.getpid(), 999, 50.0)]),
        samples(300, 200))
    assert view.state == "ok", view.reason
    (use,) = view.kernels
    assert [(u.gpu_index, u.memory_bytes, u.sm_pct, u.pids) for u in use.gpus] == [
        (0, 300 * MIB, 10.0, (child,)), (1, 200 * MIB, 15.0, (grandchild,))]
    assert use.memory_bytes == 500 * MIB
    assert use.sm_pct == 12.5


def test_a_real_kernel_started_by_another_kernel_owns_its_own_processes(tmp_path: Path,
                                                                        family: tuple[int, int, int]) -> None:
    parent, child, grandchild = family
    path = tmp_path / "kernels.json"
    write(path, [real_kernel(1, parent), real_kernel(2, child)], hostname=os.uname().nodename,
          boot_id=read_boot_id())
    view = NotebookTracker(path).update(1.0, usage(1.0, [
        process(parent, 100, 5.0), process(grandchild, 400, 0.0)]), samples(500))
    assert view.state == "ok", view.reason
    first, second = view.kernels
    assert [(u.memory_bytes, u.pids) for u in first.gpus] == [(100 * MIB, (parent,))]
    assert [(u.memory_bytes, u.pids) for u in second.gpus] == [(400 * MIB, (grandchild,))]
    assert second.idle_since_s == 1.0
    assert first.idle_since_s is None


# -- in the sampler ----------------------------------------------------------------------------------------------------


class Readings:
    """A usage reader that hands out one reading per call."""

    def __init__(self, processes: Sequence[GpuProcess]) -> None:
        self.processes = processes
        self.calls = 0

    def collect(self, time_s: float, timeout_s: float) -> Usage:
        self.calls += 1
        return usage(time_s, self.processes)


class Host:
    def read(self) -> HostSample:
        return HostSample()


class Gpus:
    def read(self, timeout_s: float) -> tuple[GpuSample, ...]:
        return samples(500)


def test_the_sampler_joins_each_new_reading_and_carries_the_view(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))])
    notebooks = tracker(path, proc)
    clock = iter([10.0, 11.0])
    store = Store(Inventory(host=HostInfo("h", 1, 1)), capacity=10)
    reader = Readings([process(100, 500, 40.0)])
    sampler = Sampler(store, Host(), Gpus(), interval_s=0.5, wall_clock=lambda: next(clock), usage=reader,
                      usage_interval_s=3600.0, notebooks=notebooks)
    first, second = sampler.sample_once(), sampler.sample_once()
    assert reader.calls == 1
    assert first.notebooks is second.notebooks is notebooks.view
    assert first.notebooks is not None
    assert first.notebooks.time_s == 10.0
    assert first.notebooks.kernels[0].memory_bytes == 500 * MIB


def test_a_failing_join_costs_the_view_not_the_sweep(tmp_path: Path, proc: FakeProc,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "kernels.json"
    write(path, [])

    def broken(_path: str) -> JupyterKernels:
        raise RuntimeError("boom")

    store = Store(Inventory(host=HostInfo("h", 1, 1)), capacity=10)
    sampler = Sampler(store, Host(), Gpus(), interval_s=0.5, usage=Readings([]), usage_interval_s=0.5,
                      notebooks=NotebookTracker(path, proc_root=proc.root, hostname=HOST, boot_id=BOOT,
                                                reader=broken))
    snapshot = sampler.sample_once()
    assert store.latest() is snapshot
    assert snapshot.usage is not None
    assert snapshot.notebooks is None
    assert sampler.stats().errors == 0
    assert [r.getMessage() for r in caplog.records] == ["joining the Jupyter kernels to the GPU processes failed"]


# -- the option --------------------------------------------------------------------------------------------------------


def test_jupyter_kernels_option_gives_an_absolute_path_that_need_not_exist_yet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_settings([], {}).jupyter_kernels is None
    assert parse_settings(["--jupyter-kernels", "runtime/k.json"], {}).jupyter_kernels == str(
        tmp_path / "runtime" / "k.json")
    with pytest.raises(UsageError, match=r"^--jupyter-kernels needs a file name$"):
        parse_settings(["--jupyter-kernels", " "], {})


# -- MIG: no per-process utilization; a kernel alone in a GPU instance gets the instance's activity -------------------


def mig_instance(uuid: str, gpu_instance_id: int, active_pct: float | None) -> MigInstance:
    return MigInstance(gpu_index=0, uuid=uuid, gpu_instance_id=gpu_instance_id, compute_instance_id=0,
                       profile="1g.10gb", sm_active_pct=active_pct)


def test_a_kernel_alone_in_a_mig_instance_has_the_instances_activity(tmp_path: Path, proc: FakeProc) -> None:
    # Kernel 1 (100) and its worker 101 in instance A (GPU instance 1, GPM activity 37.5 %); kernel 2 (200) shares
    # instance B (GPU instance 2, 60 %) with a process of no kernel (300), so B's activity is not kernel 2's; kernel 3
    # (400) alone in instance C, on a GPU without GPM (no activity): unknown, never idle.
    for pid, ppid, ticks in ((100, 1, 1000), (101, 100, 1010), (200, 1, 2000), (300, 1, 3000), (400, 1, 4000)):
        proc.add(pid, ppid, ticks)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000)), kernel(2, 200, started(2000)), kernel(3, 400, started(4000))])
    a, b, c = "MIG-aaaa", "MIG-bbbb", "MIG-cccc"
    gpus = (GpuUsage(0, GPU0, processes_readable=True, process_utilization=False, mig_enabled=True,
                     instances=(mig_instance(a, 1, 37.5), mig_instance(b, 2, 60.0), mig_instance(c, 3, None))),
            GpuUsage(1, GPU1, processes_readable=True, process_utilization=True))
    listed = (process(100, 1000, None, mig_uuid=a), process(101, 500, None, mig_uuid=a),
              process(200, 700, None, mig_uuid=b), process(300, 800, None, mig_uuid=b),
              process(400, 900, None, mig_uuid=c))
    uses = by_id(tracker(path, proc).update(10.0, Usage(time_s=10.0, gpus=gpus, processes=listed), samples(4000, 0)))
    first = uses["k1-0b8f"]
    assert [(unit.mig_uuid, unit.memory_bytes, unit.sm_pct, unit.pids) for unit in first.gpus] == [
        (a, 1500 * MIB, 37.5, (100, 101))]
    assert (first.sm_pct, first.sm_pct_1min, first.idle_since_s) == (37.5, 37.5, None)
    assert [(unit.mig_uuid, unit.sm_pct) for unit in uses["k2-0b8f"].gpus] == [(b, None)]
    assert uses["k2-0b8f"].sm_pct is None
    assert [(unit.mig_uuid, unit.sm_pct) for unit in uses["k3-0b8f"].gpus] == [(c, None)]
    assert uses["k3-0b8f"].idle_since_s is None


def test_a_kernel_alone_in_an_idle_mig_instance_is_idle(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(100, 1, 1000)
    path = tmp_path / "kernels.json"
    write(path, [kernel(1, 100, started(1000))])
    gpus = (GpuUsage(0, GPU0, processes_readable=True, process_utilization=False, mig_enabled=True,
                     instances=(mig_instance("MIG-aaaa", 1, 0.0),)),)
    notebooks = tracker(path, proc)
    for time_s in (10.0, 12.0):
        use = notebooks.update(time_s, Usage(time_s=time_s, gpus=gpus, processes=(
            process(100, 1000, None, mig_uuid="MIG-aaaa"),)), samples(1200)).kernels[0]
    assert (use.sm_pct, use.idle_since_s, use.holding_since_s) == (0.0, 10.0, 10.0)
