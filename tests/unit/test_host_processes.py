"""HostProcessTable on real child processes, and on a fake /proc for exact values, recycled PIDs and cgroups."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvdash.sampling.cgroups import parse_cgroup
from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.usage_records import CgroupIdentity, HostProcess
from nvdash.sampling.user_names import NameResolver
from tests.conftest import wait_for

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
DEADLINE_S = 30.0
BOOT_S = 1_700_000_000


# Real processes.


@pytest.fixture
def spawn() -> Iterator[Callable[[list[str]], subprocess.Popen[bytes]]]:
    """Start a child and wait until it has exec'd (until then /proc shows the parent's copy, not the new
    program); every child is killed and reaped at the end of the test."""
    children: list[subprocess.Popen[bytes]] = []

    def start(args: list[str]) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        children.append(child)
        expected = b"".join(arg.encode() + b"\0" for arg in args)
        deadline = time.monotonic() + DEADLINE_S
        while Path(f"/proc/{child.pid}/cmdline").read_bytes() != expected:
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()


def _wait_for(table: HostProcessTable, pid: int, ready: Callable[[HostProcess], bool]) -> HostProcess:
    """Look the PID up until ``ready`` holds for it, or fail at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        process = table.lookup([pid]).get(pid)
        if process is not None and ready(process):
            return process
        assert time.monotonic() < deadline, f"gave up waiting; last saw {process}"
        time.sleep(0.05)


def test_real_child_user_command_memory_and_start_time(
    spawn: Callable[[list[str]], subprocess.Popen[bytes]],
) -> None:
    before = time.time()
    child = spawn(["sleep", "3600.25"])
    after = time.time()
    # Right after exec the kernel may report no resident pages yet; wait (with a deadline) until it has some.
    # The user's name is looked up off this thread: "uid N" until it is resolved.
    names = NameResolver()
    me = pwd.getpwuid(os.getuid()).pw_name
    process = wait_for(lambda: HostProcessTable(names=names).lookup([child.pid])[child.pid],
                       lambda found: found.rss_bytes is not None and found.rss_bytes > 0 and found.user == me,
                       timeout_s=10.0)
    assert process.pid == child.pid
    assert process.command == "sleep 3600.25"
    assert process.rss_bytes is not None
    assert process.rss_bytes > 0
    # btime is whole seconds (truncated), so the start time can read up to a second early.
    assert process.started_s is not None
    assert before - 2.0 <= process.started_s <= after + 1.0
    assert process.cpu_pct is None


def test_real_child_cgroup_is_what_its_own_file_says(spawn: Callable[[list[str]], subprocess.Popen[bytes]]) -> None:
    child = spawn(["sleep", "3600"])
    process = HostProcessTable().lookup([child.pid])[child.pid]
    assert process.cgroup == parse_cgroup(Path(f"/proc/{child.pid}/cgroup").read_text())


def test_busy_child_reads_above_half_a_core(spawn: Callable[[list[str]], subprocess.Popen[bytes]]) -> None:
    child = spawn([sys.executable, "-c", "while True: pass", "busy-loop"])
    table = HostProcessTable()
    first = table.lookup([child.pid])[child.pid]
    assert first.command == f"{sys.executable} -c while True: pass busy-loop"
    assert first.cpu_pct is None
    busy = _wait_for(table, child.pid, lambda process: process.cpu_pct is not None and process.cpu_pct > 50)
    assert busy.command == first.command


def test_idle_sleeper_reads_near_zero(spawn: Callable[[list[str]], subprocess.Popen[bytes]]) -> None:
    child = spawn(["sleep", "3600"])
    table = HostProcessTable()
    assert table.lookup([child.pid])[child.pid].cpu_pct is None
    cpu_pct = _wait_for(table, child.pid, lambda process: process.cpu_pct is not None).cpu_pct
    assert cpu_pct is not None
    assert 0.0 <= cpu_pct < 5.0


def test_pids_that_do_not_exist_are_absent() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    me = os.getpid()
    found = HostProcessTable().lookup([pid_max + 1, 0, -5, me, me])
    assert list(found) == [me]
    assert found[me].command == " ".join(sys.orig_argv)


def test_killed_child_disappears_quietly(
    spawn: Callable[[list[str]], subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    child = spawn(["sleep", "3600"])
    table = HostProcessTable()
    assert table.lookup([child.pid])[child.pid].command == "sleep 3600"
    child.kill()
    child.wait()  # reaped: no zombie left under the PID
    assert table.lookup([child.pid, os.getpid()]).keys() == {os.getpid()}
    assert caplog.records == []


# A fake /proc: exact values, recycled PIDs, cgroups.


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fake_process(
    root: Path,
    pid: int,
    *,
    start_ticks: int,
    utime: int = 0,
    stime: int = 0,
    rss_pages: int = 256,
    comm: str = "python3",
    cmdline: bytes = b"python3\0train.py\0--epochs\x0010\0",
    uid: int | None = None,
    cgroup: str = "0::/user.slice/user-1000.slice/session-3.scope\n",
) -> None:
    """Write /proc/PID/{stat,status,cmdline,cgroup} in the kernel's formats (stat has all 52 fields)."""
    uid = os.getuid() if uid is None else uid
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    fields = [str(pid), f"({comm})", "S", "1", str(pid), str(pid), "0", "-1", "4194560", "5142", "0", "3", "0"]
    fields += [str(utime), str(stime), "0", "0", "20", "0", "3", "0", str(start_ticks), "1048576000", str(rss_pages)]
    fields += ["18446744073709551615"] + ["0"] * 27
    assert len(fields) == 52
    (directory / "stat").write_text(" ".join(fields) + "\n")
    (directory / "status").write_text(
        f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    )
    (directory / "cmdline").write_bytes(cmdline)
    (directory / "cgroup").write_text(cgroup)


def _resolved(uid: int) -> NameResolver:
    """A resolver that has already looked ``uid`` up."""
    names = NameResolver()
    names.user(uid)
    wait_for(names.pending, lambda pending: pending == 0)
    return names


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_text(f"cpu  1 2 3 4 5 6 7 0 0 0\nintr 0\nctxt 12\nbtime {BOOT_S}\nprocesses 9\n")
    return tmp_path


def test_fake_process_values(proc: Path) -> None:
    _fake_process(proc, 4242, start_ticks=50 * TICKS_PER_S, utime=40, stime=10, rss_pages=1000)
    clock = FakeClock()
    table = HostProcessTable(proc, clock, _resolved(os.getuid()))
    first = table.lookup([4242])[4242]
    assert first == HostProcess(
        pid=4242,
        user=pwd.getpwuid(os.getuid()).pw_name,
        command="python3 train.py --epochs 10",
        cpu_pct=None,
        rss_bytes=1000 * PAGE_BYTES,
        started_s=BOOT_S + 50.0,
        cgroup=CgroupIdentity(),
    )
    _fake_process(proc, 4242, start_ticks=50 * TICKS_PER_S, utime=40 + TICKS_PER_S, stime=10 + TICKS_PER_S // 2)
    clock.now += 2.0
    second = table.lookup([4242])[4242]
    assert second.cpu_pct == pytest.approx(75.0)  # 1.5 s of CPU in 2 s
    assert second.rss_bytes == 256 * PAGE_BYTES


def test_cpu_percent_needs_time_to_pass(proc: Path) -> None:
    _fake_process(proc, 7, start_ticks=10)
    clock = FakeClock()
    table = HostProcessTable(proc, clock)
    table.lookup([7])
    assert table.lookup([7])[7].cpu_pct is None  # same clock reading: no interval yet
    clock.now += 1.0
    assert table.lookup([7])[7].cpu_pct == 0.0


def test_name_stands_in_for_an_empty_command_line(proc: Path) -> None:
    _fake_process(proc, 2, start_ticks=1, comm="kworker/0:1 (x)", cmdline=b"")
    assert HostProcessTable(proc).lookup([2])[2].command == "kworker/0:1 (x)"


def test_unknown_uid_reads_as_its_number(proc: Path) -> None:
    _fake_process(proc, 3, start_ticks=1, uid=3_999_999_999)
    names = NameResolver()
    table = HostProcessTable(proc, names=names)
    assert table.lookup([3])[3].user == "uid 3999999999"
    wait_for(names.pending, lambda pending: pending == 0)
    assert table.lookup([3])[3].user == "uid 3999999999"


def test_user_names_never_wait_for_the_lookup_and_arrive_once_resolved(proc: Path) -> None:
    _fake_process(proc, 4, start_ticks=1, uid=1234)
    release = threading.Event()

    def slow_directory(uid: int) -> str | None:
        release.wait()  # an LDAP server that does not answer until released
        return f"user{uid}"

    table = HostProcessTable(proc, names=NameResolver(user_of=slow_directory))
    found: list[str | None] = []
    thread = threading.Thread(target=lambda: found.extend(table.lookup([4])[4].user for _ in range(3)), daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert found == ["uid 1234"] * 3, "the lookup waited for the directory"
    release.set()
    wait_for(lambda: table.lookup([4])[4].user, lambda user: user == "user1234")


def test_recycled_pid_is_a_new_process(proc: Path) -> None:
    kubernetes = (FIXTURES / "k8s-systemd-containerd-burstable-v2.txt").read_text()
    _fake_process(proc, 900, start_ticks=1000, utime=500, cmdline=b"old\0job\0")
    clock = FakeClock()
    table = HostProcessTable(proc, clock)
    old = table.lookup([900])[900]
    _fake_process(proc, 900, start_ticks=2000, utime=5, cmdline=b"new\0job\0", cgroup=kubernetes)
    clock.now += 1.0
    new = table.lookup([900])[900]
    assert (old.command, new.command) == ("old job", "new job")
    assert new.cpu_pct is None  # a delta against the old process's CPU time would be meaningless
    assert (old.started_s, new.started_s) == (BOOT_S + 1000 / TICKS_PER_S, BOOT_S + 2000 / TICKS_PER_S)
    assert new.cgroup.pod_uid == "0c7850d9-5226-4895-8d5b-46cabe2f0f2b"


def test_fixed_fields_are_cached_per_process(proc: Path) -> None:
    _fake_process(proc, 11, start_ticks=5, cmdline=b"first\0")
    table = HostProcessTable(proc, FakeClock())
    table.lookup([11])
    (proc / "11" / "cmdline").write_bytes(b"rewritten\0")
    assert table.lookup([11])[11].command == "first"


def test_exec_refreshes_the_fixed_fields_but_not_the_cpu_baseline(proc: Path) -> None:
    _fake_process(proc, 12, start_ticks=5, utime=100, comm="bash", cmdline=b"/bin/bash\0run.sh\0")
    clock = FakeClock()
    table = HostProcessTable(proc, clock)
    assert table.lookup([12])[12].command == "/bin/bash run.sh"
    _fake_process(proc, 12, start_ticks=5, utime=100 + TICKS_PER_S, comm="python3", cmdline=b"python3\0train.py\0")
    clock.now += 4.0
    after_exec = table.lookup([12])[12]
    assert after_exec.command == "python3 train.py"
    assert after_exec.cpu_pct == pytest.approx(25.0)  # the same process: 1 s of CPU in 4 s


def test_cache_keeps_only_the_pids_asked_about(proc: Path) -> None:
    _fake_process(proc, 21, start_ticks=5)
    _fake_process(proc, 22, start_ticks=5)
    clock = FakeClock()
    table = HostProcessTable(proc, clock)
    table.lookup([21, 22])
    clock.now += 1.0
    assert table.lookup([22])[22].cpu_pct == 0.0
    clock.now += 1.0
    assert table.lookup([21])[21].cpu_pct is None  # forgotten when it was not asked about


def test_a_lookup_without_pruning_only_adds_to_the_cache(proc: Path) -> None:
    _fake_process(proc, 21, start_ticks=5)
    _fake_process(proc, 22, start_ticks=5)
    clock = FakeClock()
    table = HostProcessTable(proc, clock)
    table.lookup([21])
    table.lookup([22], prune=False)
    clock.now += 1.0
    both = table.lookup([21, 22])
    assert both[21].cpu_pct == 0.0
    assert both[22].cpu_pct == 0.0


def test_cgroup_identity_through_a_fake_proc(proc: Path) -> None:
    _fake_process(proc, 31, start_ticks=5, cgroup=(FIXTURES / "containerd-service-k8s-v1.txt").read_text())
    _fake_process(proc, 32, start_ticks=5, cgroup=(FIXTURES / "slurm-v2.txt").read_text())
    found = HostProcessTable(proc).lookup([31, 32])
    assert found[31].cgroup == CgroupIdentity(
        runtime="containerd",
        container_id="697ace61dc7aa7b887eb13373813d0fceb1a035559db90c676cf996e5434c9a2",
        pod_uid="07c957d9-b028-49f9-8950-907baa0621ba",
        qos="besteffort",
    )
    assert found[32].cgroup == CgroupIdentity(slurm_job="98765")


def test_damaged_or_partial_proc_entries(proc: Path) -> None:
    _fake_process(proc, 41, start_ticks=5)
    (proc / "41" / "stat").write_text("41 (x) S 1 2")  # truncated stat: unusable, left out
    _fake_process(proc, 42, start_ticks=5)
    (proc / "42" / "status").unlink()  # no status: the user is unknown, the rest still reads
    (proc / "42" / "cgroup").unlink()
    _fake_process(proc, 43, start_ticks=5)
    shutil.rmtree(proc / "43")
    found = HostProcessTable(proc).lookup([41, 42, 43])
    assert list(found) == [42]
    assert found[42].user is None
    assert found[42].command == "python3 train.py --epochs 10"
    assert found[42].cgroup == CgroupIdentity()


def test_no_boot_time_means_no_start_time(tmp_path: Path) -> None:
    _fake_process(tmp_path, 51, start_ticks=5)
    assert HostProcessTable(tmp_path).lookup([51])[51].started_s is None


def test_in_a_child_pid_namespace_no_pid_is_looked_up(tmp_path: Path) -> None:
    """NVML's host PIDs mean other processes in a container's own PID namespace: none is taken as visible."""
    own = tmp_path / "self"
    own.mkdir()
    (own / "status").write_text("Name:\tnvdash\nNSpid:\t81234\t7\n")
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text("7 (python) S 1 7 7 0 -1 0 0 0 0 0 5 3 0 0 20 0 1 0 100 0 10 0\n")
    table = HostProcessTable(tmp_path)
    assert not table.sees_host_pids
    assert table.lookup([7]) == {}


def test_the_initial_pid_namespace_sees_host_pids() -> None:
    assert HostProcessTable().sees_host_pids is (len(_nspid_fields()) <= 1)


def _nspid_fields() -> list[str]:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:]
    return []


def test_hostile_proc_entries_are_skipped_without_blocking(proc: Path) -> None:
    """A FIFO or a link to /dev/zero where /proc has a file (a test root, a bind mount): skipped, never waited on."""
    _fake_process(proc, 42, start_ticks=100, comm="trainer")
    for name in ("cmdline", "cgroup"):
        (proc / "42" / name).unlink()
        os.mkfifo(proc / "42" / name)
    (proc / "42" / "status").unlink()
    (proc / "42" / "status").symlink_to("/dev/zero")
    _fake_process(proc, 43, start_ticks=100)
    (proc / "43" / "stat").unlink()
    os.mkfifo(proc / "43" / "stat")
    found: list[dict[int, HostProcess]] = []
    thread = threading.Thread(target=lambda: found.append(HostProcessTable(proc).lookup([42, 43])), daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert found, "the lookup blocked on a FIFO"
    assert list(found[0]) == [42]
    process = found[0][42]
    assert (process.command, process.user, process.cgroup) == ("trainer", None, CgroupIdentity())
