"""Real pods for end-to-end tests: cgroup v1 directories named as the kubelet names them, with real processes in
them, and the kubelet's pod log directories that name their pods."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

PIDS_ROOT = Path("/sys/fs/cgroup/pids")
POD_PARENT = PIDS_ROOT / "kubepods" / "besteffort"


@contextlib.contextmanager
def kubelet_cgroups(count: int) -> Iterator[list[tuple[str, Path]]]:
    """``count`` (pod UID, container cgroup directory) pairs under the pids hierarchy; removed afterwards (their
    processes moved back to the root first). Skips the test where the hierarchy is not writable."""
    created: list[Path] = []
    try:
        POD_PARENT.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        pytest.skip(f"the cgroup v1 pids hierarchy is not writable here ({error}): cannot place processes in pods")
    pairs = []
    try:
        for _ in range(count):
            pod_uid = str(uuid.uuid4())
            leaf = POD_PARENT / f"pod{pod_uid}" / secrets.token_hex(32)
            leaf.mkdir(parents=True)
            created += [leaf.parent, leaf]
            pairs.append((pod_uid, leaf))
        yield pairs
    finally:
        for directory in reversed(created):
            for pid in (directory / "cgroup.procs").read_text().split() if directory.exists() else ():
                with contextlib.suppress(OSError):
                    (PIDS_ROOT / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                directory.rmdir()


def place(pid: int, leaf: Path) -> None:
    """Move process ``pid`` into the container cgroup ``leaf`` and check that the kernel says it is there."""
    (leaf / "cgroup.procs").write_text(str(pid))
    relative = "/" + str(leaf.relative_to(PIDS_ROOT))
    assert relative in Path(f"/proc/{pid}/cgroup").read_text(), f"{pid} is not in {relative}"


def pod_log_dirs(root: Path, pods: Sequence[tuple[str, str, str, str]]) -> None:
    """The kubelet's ``<namespace>_<pod>_<uid>/<container>`` log directories under ``root`` for each
    (namespace, pod, uid, container)."""
    for namespace, pod, pod_uid, container in pods:
        (root / f"{namespace}_{pod}_{pod_uid}" / container).mkdir(parents=True)


@contextlib.contextmanager
def sleeping(count: int, envs: Sequence[Mapping[str, str]] | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` real ``sleep`` processes, killed afterwards. With ``envs``, each runs with only ``PATH`` and its own
    variables, and is returned once it has exec'd ``sleep`` (its ``/proc/<pid>/environ`` is then its own)."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(count):
            env = None if envs is None else {"PATH": os.environ.get("PATH", "/usr/bin"), **envs[n]}
            started.append(subprocess.Popen(["sleep", "600"], env=env))
        for child in started:
            deadline = time.monotonic() + 30.0
            while Path(f"/proc/{child.pid}/comm").read_text().strip() != "sleep":
                assert time.monotonic() < deadline, f"{child.pid} never ran sleep"
                time.sleep(0.01)
        yield started
    finally:
        for child in started:
            child.kill()
            child.wait(10)
