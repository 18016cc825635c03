"""The ledger's tallies added up per job, pod, user or project: the rows of the accounting table and report."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import Tally

J_PER_KWH = 3_600_000.0
S_PER_H = 3600.0


def _job(owner: Owner) -> str | None:
    return owner.job


def _pod(owner: Owner) -> str | None:
    return owner.job if owner.kind == "pod" else None


def _user(owner: Owner) -> str | None:
    return owner.user


def _project(owner: Owner) -> str | None:
    return owner.project


GROUPINGS: dict[str, Callable[[Owner], str | None]] = {
    "job": _job,
    "pod": _pod,
    "user": _user,
    "namespace": _project,
}
"""How rows are grouped: ``job`` is the job-or-pod level (a Slurm job, a pod, a container, or a user's plain
processes), ``pod`` only pods, ``user`` the user, ``namespace`` the project (the pod's namespace, else the user's
primary group)."""


@dataclass
class Row:
    """One owner's use over a range, all its GPUs together."""

    key: str
    kinds: set[str]
    gpus: set[int]
    total: Tally

    @property
    def gpu_hours(self) -> float:
        return self.total.allocated_s / S_PER_H

    @property
    def busy_hours(self) -> float:
        return self.total.busy_s / S_PER_H

    @property
    def wasted_hours(self) -> float:
        """Allocated GPU-hours known to be idle (utilization 0)."""
        return self.total.wasted_s / S_PER_H

    @property
    def energy_kwh(self) -> float:
        return self.total.energy_j / J_PER_KWH

    def add(self, owner: Owner, gpu_index: int, tally: Tally) -> None:
        """Add one (owner, GPU) tally."""
        self.kinds.add(owner.kind)
        self.gpus.add(gpu_index)
        self.total.merge(tally)


def summarize(tallies: Iterable[tuple[Owner, int, Tally]], by: str) -> list[Row]:
    """Rows grouped ``by`` one of :data:`GROUPINGS`, most GPU-hours first (then by key)."""
    key_of = GROUPINGS[by]
    rows: dict[str, Row] = {}
    for owner, gpu_index, tally in tallies:
        key = key_of(owner)
        if key is None:
            continue
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(key, set(), set(), Tally(start_s=tally.start_s, end_s=tally.end_s))
        row.add(owner, gpu_index, tally)
    return sorted(rows.values(), key=lambda row: (-row.total.allocated_s, row.key))
