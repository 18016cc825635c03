"""Where a process runs, from its ``/proc/PID/cgroup``: container runtime and id, Kubernetes pod, Slurm job.

Pure string work over the layouts the runtimes write (no psutil, no runtime API): Docker (``/docker/<id>``,
``docker-<id>.scope``), containerd (``cri-containerd-<id>.scope``, or ``<pod>.slice:cri-containerd:<id>``
under ``containerd.service``), CRI-O (``crio-<id>.scope``), Podman (``libpod-<id>.scope``), the kubelet's
pod cgroups on both drivers (``kubepods/<qos>/pod<uid>/`` and ``kubepods-<qos>-pod<uid>.slice``), and
Slurm (``slurm/uid_<uid>/job_<id>/`` on v1, ``slurmstepd.scope/job_<id>/`` on v2).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from nvdash.sampling.bounded_read import read_bounded_or_none
from nvdash.sampling.usage_records import CgroupIdentity

_RUNTIMES = {
    "docker": "docker",
    "cri-containerd": "containerd",
    "nerdctl": "containerd",
    "crio": "cri-o",
    "libpod": "podman",
}
_PREFIXES = "|".join(re.escape(prefix) for prefix in _RUNTIMES)
_SCOPE = re.compile(rf"({_PREFIXES})-([0-9a-f]{{64}})(?:\.scope)?")
"""``docker-<id>.scope`` and the like (systemd driver); ``crio-<id>`` / ``libpod-<id>`` with cgroupfs.
``crio-conmon-<id>`` and ``libpod-conmon-<id>`` (the container monitors) do not match."""
_BARE_ID = re.compile(r"[0-9a-f]{64}")
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
"""A pod UID: a UUID (dashes, or underscores in systemd unit names), or a static pod's 32-hex config hash."""
_POD_SLICE = re.compile(rf"(?:.+-)?kubepods(?:-(burstable|besteffort))?-pod({_UID})\.slice")
_POD_DIR = re.compile(rf"pod({_UID})")
_QOS_DIRS = {"kubepods": "guaranteed", "burstable": "burstable", "besteffort": "besteffort"}
_SLURM_JOB = re.compile(r"job_(\d+)")
_SLURM_V1_USER = re.compile(r"uid_\d+")
_SLURM_V1_ROOT = re.compile(r"slurm(?:_.+)?")
_PREFERRED_CONTROLLERS = ("memory", "cpu", "cpuacct", "name=systemd", "", "pids")
"""v1 lines tried first when several identify the process equally well; ``""`` is the v2 line."""
CGROUP_MAX_BYTES = 64 * 1024
"""``/proc/PID/cgroup`` has a line per hierarchy (a dozen on v1); more than this is not read."""
MAX_POD_LOG_ENTRIES = 16_384
"""Pod log directories looked at (a node runs a few hundred pods at most)."""


def parse_cgroup(text: str) -> CgroupIdentity:
    """What the contents of ``/proc/PID/cgroup`` (v1, v2 or hybrid) say; ``CgroupIdentity()`` when nothing.

    Each line is ``hierarchy-ID:controllers:path``. A v1 file puts the process in one cgroup per hierarchy and
    not every hierarchy is managed by the runtime, so the line that identifies the most wins (ties go to
    the memory, cpu and ``name=systemd`` hierarchies).
    """
    best = CgroupIdentity()
    best_rank = (0, 0)
    for controllers, path in _lines(text):
        identity = parse_cgroup_path(path)
        rank = (_known_fields(identity), -_preference(controllers))
        if rank[0] and rank > best_rank:
            best, best_rank = identity, rank
    return best


def parse_cgroup_path(path: str) -> CgroupIdentity:
    """What one cgroup path (``/kubepods.slice/...``) says about the process in it."""
    parts = _components(path)
    runtime, container_id = _container(parts)
    pod_uid, qos = _pod(parts)
    return CgroupIdentity(
        runtime=runtime, container_id=container_id, pod_uid=pod_uid, qos=qos, slurm_job=_slurm_job(parts)
    )


def read_cgroup(proc_root: Path, pid: int, *, follow_links: bool = False) -> CgroupIdentity:
    """Parse ``proc_root/PID/cgroup``; ``CgroupIdentity()`` when the process is gone or the file unreadable
    (or not a regular file: it is read with bounds, see :mod:`nvdash.sampling.bounded_read`)."""
    data = read_bounded_or_none(proc_root / str(pid) / "cgroup", CGROUP_MAX_BYTES, follow_links=follow_links)
    if data is None:
        return CgroupIdentity()
    return parse_cgroup(data.decode("utf-8", errors="replace"))


def pod_names_from_logs(log_root: Path = Path("/var/log/pods")) -> dict[str, tuple[str, str]]:
    """Pod UID -> (namespace, pod name), from the kubelet's pod log directories; ``{}`` without them.

    The kubelet names each pod's log directory ``<namespace>_<pod-name>_<pod-uid>`` (``BuildPodLogsDirectory``
    in ``pkg/kubelet/kuberuntime/helpers.go``, joined with ``logPathDelimiter = "_"``; Kubernetes 1.14 and
    later, before that the directory was the bare UID). Namespaces and pod names are DNS names, which never
    contain ``_``, so the split is unambiguous. This names pods found in cgroup paths without asking the API
    server. Only directories count (links are not followed), and at most :data:`MAX_POD_LOG_ENTRIES` are looked at.
    """
    names: dict[str, tuple[str, str]] = {}
    try:
        with os.scandir(log_root) as entries:
            for count, entry in enumerate(entries):
                if count == MAX_POD_LOG_ENTRIES:
                    break
                fields = entry.name.split("_")
                if len(fields) == 3 and all(fields) and _is_dir(entry):
                    namespace, pod, uid = fields
                    names[uid] = (namespace, pod)
    except OSError:
        return names
    return names


def _lines(text: str) -> list[tuple[str, str]]:
    """(controllers, path) of each well-formed line; the path may itself contain ``:``."""
    lines = []
    for line in text.splitlines():
        fields = line.strip().split(":", 2)
        if len(fields) == 3 and fields[0].isdigit() and fields[2].startswith("/"):
            lines.append((fields[1], fields[2]))
    return lines


def _components(path: str) -> list[str]:
    """The path's names, with containerd's ``<parent>.slice:<prefix>:<id>`` split into slice and scope.

    That form appears when containerd is told to use systemd but the cgroup is created under its own
    service (``/system.slice/containerd.service/kubepods-...-pod<uid>.slice:cri-containerd:<id>``).
    """
    path = path.removesuffix(" (deleted)")
    parts: list[str] = []
    for name in path.split("/"):
        pieces = name.split(":")
        if len(pieces) == 3:
            parts.extend((pieces[0], f"{pieces[1]}-{pieces[2]}.scope"))
        elif name:
            parts.append(name)
    return parts


def _container(parts: list[str]) -> tuple[str | None, str | None]:
    """(runtime, container id) of the innermost container in the path.

    A bare 64-hex name is a container whose runtime the path does not tell (containerd or dockershim on
    the cgroupfs driver write ``kubepods/<qos>/pod<uid>/<id>``), except under ``/docker/``.
    """
    for index in range(len(parts) - 1, -1, -1):
        name = parts[index]
        scope = _SCOPE.fullmatch(name)
        if scope is not None:
            return _RUNTIMES[scope[1]], scope[2]
        if _BARE_ID.fullmatch(name):
            parent = parts[index - 1] if index else ""
            return ("docker" if parent == "docker" else None), name
    return None, None


def _pod(parts: list[str]) -> tuple[str | None, str | None]:
    """(pod UID in dashed form, QoS class) when the path is inside a kubelet pod cgroup."""
    for index, name in enumerate(parts):
        pod_slice = _POD_SLICE.fullmatch(name)
        if pod_slice is not None:
            return pod_slice[2].replace("_", "-"), pod_slice[1] or "guaranteed"
        pod_dir = _POD_DIR.fullmatch(name)
        if pod_dir is not None and index and "kubepods" in parts[:index]:
            return pod_dir[1].replace("_", "-"), _QOS_DIRS.get(parts[index - 1])
    return None, None


def _slurm_job(parts: list[str]) -> str | None:
    """The job id of a ``job_<id>`` under Slurm's v1 ``slurm/uid_<uid>/`` or its v2 ``slurmstepd.scope``."""
    for index, name in enumerate(parts):
        job = _SLURM_JOB.fullmatch(name)
        if job is None or not index:
            continue
        parent = parts[index - 1]
        if parent.endswith("slurmstepd.scope"):
            return job[1]
        if _SLURM_V1_USER.fullmatch(parent) and index > 1 and _SLURM_V1_ROOT.fullmatch(parts[index - 2]):
            return job[1]
    return None


def _known_fields(identity: CgroupIdentity) -> int:
    fields = (identity.runtime, identity.container_id, identity.pod_uid, identity.qos, identity.slurm_job)
    return sum(field is not None for field in fields)


def _preference(controllers: str) -> int:
    """Lower is better: the position of the line's best controller in :data:`_PREFERRED_CONTROLLERS`."""
    names = controllers.split(",")
    ranks = [_PREFERRED_CONTROLLERS.index(name) for name in names if name in _PREFERRED_CONTROLLERS]
    return min(ranks, default=len(_PREFERRED_CONTROLLERS))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False
