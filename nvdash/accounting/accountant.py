"""Following the sampler's snapshots into the ledger: who owns each GPU at each reading, and what they used.

The job-mapping directory is read again whenever a new usage reading arrives (the processes' cadence), not at
every GPU reading: a prolog's file appears seconds before the job's processes do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from nvdash.accounting.attribution import Names, Owner, Share, attribute
from nvdash.accounting.ledger import DEFAULT_MAX_GAP_S, Ledger, Tally
from nvdash.sampling.job_mapping import JobMapping, read_job_mapping
from nvdash.sampling.records import Snapshot
from nvdash.sampling.usage_records import Usage


class Accountant:
    """Feeds each snapshot's shares into a :class:`Ledger`; safe to read from other threads."""

    def __init__(self, uuids: dict[int, str], *, job_mapping_dir: Path | None = None,
                 names: Names | None = None, max_gap_s: float = DEFAULT_MAX_GAP_S,
                 read_mapping: Callable[[Path], JobMapping] = read_job_mapping) -> None:
        self._uuids = dict(uuids)
        self._mapping_dir = job_mapping_dir
        self._read_mapping = read_mapping
        self._names = names
        self._ledger = Ledger(max_gap_s=max_gap_s)
        self._lock = threading.Lock()
        self._usage: Usage | None = None
        self._mapping: JobMapping | None = None
        self.shares: list[Share] = []
        """The owners of the latest reading."""

    def _refresh_mapping(self, usage: Usage | None) -> None:
        if self._mapping_dir is None or (usage is self._usage and self._mapping is not None):
            return
        self._mapping = self._read_mapping(self._mapping_dir)

    def step(self, snapshot: Snapshot) -> list[Share]:
        """Count the interval ``snapshot`` closes; returns its shares."""
        self._refresh_mapping(snapshot.usage)
        self._usage = snapshot.usage
        shares = attribute(snapshot.gpus, self._uuids, snapshot.usage, self._mapping, self._names)
        with self._lock:
            self._ledger.step(snapshot.time_s, snapshot.gpus, shares)
            self.shares = shares
        return shares

    @property
    def mapping(self) -> JobMapping | None:
        """The job mapping last read; ``None`` without a directory."""
        return self._mapping

    def tallies(self) -> list[tuple[Owner, int, Tally]]:
        """A copy of every (owner, GPU) tally so far."""
        with self._lock:
            return [(owner, index, Tally(**vars(tally)))
                    for (owner, index), tally in self._ledger.tallies.items()]
