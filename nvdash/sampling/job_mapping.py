"""Which Slurm job holds which GPU, from a directory of per-GPU files that the scheduler's prolog and epilog write.

The layout dcgm-exporter reads with ``--hpc-job-mapping-dir`` and Princeton's jobstats with its GPU helper: one
file per GPU, named by the GPU's index (``0``, ``1``, ...) or by its UUID (``GPU-...``, or ``MIG-...`` for a MIG
instance); each line holds a job ID, optionally followed by the job owner's numeric UID (``45916256 262563``).
A GPU shared by several jobs has a line per job. The prolog creates or appends, the epilog removes.

Files are small and rewritten while nvdash reads them: a file is read until two reads in a row agree (a writer
that truncated it and has not yet written reads as a change), and a line that is not a job ID is skipped.

Other programs write this directory, so it is read with bounds (see :mod:`nvdash.sampling.bounded_read`): a
symbolic link, a FIFO, a device or a file over :data:`MAX_FILE_BYTES` is refused (skipped, and named with the
reason in :attr:`JobMapping.refused`), and at most :data:`MAX_ENTRIES` names are looked at.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nvdash.sampling.bounded_read import Refused, read_bounded

_JOB_ID = re.compile(r"\d+(?:[_+]\d+)?")
"""A Slurm job ID: ``1234``, an array task ``1234_7`` or a heterogeneous component ``1234+0``."""
_UID = re.compile(r"\d+")
_UUID_NAME = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z-]+")
READ_ATTEMPTS = 3
"""Reads of one file before giving up on it for this sweep (a writer busy with it all that time)."""
MAX_FILE_BYTES = 64 * 1024
"""A mapping file lists a few jobs; anything longer is not one."""
MAX_ENTRIES = 4096
"""Names looked at in the directory (one file per GPU or MIG instance, plus editors' leftovers)."""


@dataclass(frozen=True)
class MappedJob:
    """One line of a mapping file: a job and, when the file says, the numeric UID of its owner."""

    job_id: str
    uid: int | None = None


@dataclass(frozen=True)
class JobMapping:
    """What a mapping directory said at one moment; ``available`` is false when it could not be listed."""

    by_index: dict[int, tuple[MappedJob, ...]] = field(default_factory=dict)
    by_uuid: dict[str, tuple[MappedJob, ...]] = field(default_factory=dict)
    available: bool = True
    refused: dict[str, str] = field(default_factory=dict)
    """File name -> why it was not read (a link, a FIFO, too large...)."""

    def jobs_of(self, index: int, uuid: str | None = None) -> tuple[MappedJob, ...]:
        """The jobs on the GPU (or MIG instance) with this index or UUID; a UUID's file wins over an index's."""
        if uuid is not None and uuid in self.by_uuid:
            return self.by_uuid[uuid]
        return self.by_index.get(index, ())


def parse_job_file(text: str) -> tuple[MappedJob, ...]:
    """The jobs one file lists, in its order, each once; lines that are not ``<job id> [<uid>]`` are skipped."""
    jobs: list[MappedJob] = []
    seen: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields or len(fields) > 2 or not _JOB_ID.fullmatch(fields[0]):
            continue
        if len(fields) == 2 and not _UID.fullmatch(fields[1]):
            continue
        if fields[0] in seen:
            continue
        seen.add(fields[0])
        jobs.append(MappedJob(fields[0], int(fields[1]) if len(fields) == 2 else None))
    return tuple(jobs)


def _read_text(path: Path) -> str | None:
    """The file's text; ``None`` when it is gone or unreadable; raises :class:`Refused` for a file not to read."""
    try:
        return read_bounded(path, MAX_FILE_BYTES).decode("utf-8", errors="replace")
    except Refused:
        raise
    except (OSError, ValueError):
        return None


def stable_text(path: Path, read: Callable[[Path], str | None] = _read_text) -> str | None:
    """The file's text once two reads in a row agree; ``None`` when it is gone, unreadable or never settles."""
    last = read(path)
    for _ in range(READ_ATTEMPTS):
        current = read(path)
        if current == last:
            return current
        last = current
    return None


def _jobs_in(path: Path, read: Callable[[Path], str | None], refused: dict[str, str]) -> tuple[MappedJob, ...]:
    try:
        text = stable_text(path, read)
    except Refused as error:
        refused[path.name] = error.reason
        return ()
    return parse_job_file(text) if text is not None else ()


def _names(directory: Path, refused: dict[str, str]) -> list[str]:
    """Up to :data:`MAX_ENTRIES` names in the directory, sorted; raises OSError when it cannot be listed."""
    names: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if len(names) == MAX_ENTRIES:
                refused["."] = f"more than {MAX_ENTRIES} entries: the rest are not read"
                break
            names.append(entry.name)
    return sorted(names)


def read_job_mapping(directory: Path, read: Callable[[Path], str | None] = _read_text) -> JobMapping:
    """Every GPU's jobs as the directory's files say now; files named otherwise (editors' and temporary files)
    are ignored, files refused are named in ``refused``. A directory that cannot be listed gives an empty,
    unavailable mapping."""
    refused: dict[str, str] = {}
    try:
        names = _names(directory, refused)
    except OSError:
        return JobMapping(available=False)
    by_index: dict[int, tuple[MappedJob, ...]] = {}
    by_uuid: dict[str, tuple[MappedJob, ...]] = {}
    for name in names:
        if name.isdecimal() and name.isascii():
            jobs = _jobs_in(directory / name, read, refused)
            if jobs:
                by_index[int(name)] = jobs
        elif _UUID_NAME.fullmatch(name):
            jobs = _jobs_in(directory / name, read, refused)
            if jobs:
                by_uuid[name] = jobs
    return JobMapping(by_index, by_uuid, refused=refused)
