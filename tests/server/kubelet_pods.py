"""Real pods for end-to-end tests: cgroup v1 directories named as the kubelet names them, with real processes in
them, and the kubelet's pod log directories that name their pods."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import uuid
from collections.abc import Iterator, Sequence
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
def sleeping(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` real ``sleep`` processes, killed afterwards."""
    started = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    try:
        yield started
    finally:
        for child in started:
            child.kill()
            child.wait(10)
