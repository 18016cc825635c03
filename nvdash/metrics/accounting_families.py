"""The accounting counters of ``/metrics`` (``--metrics-accounting``): per owner, what the accountant has charged it
since nvdash started, so that Prometheus can add the owners up across nodes.

One series per owner at the job level (a Slurm job, a pod ``namespace/pod``, a container, or a user's plain
processes), labelled ``Hostname``, ``kind``, ``hpc_job`` (:data:`JOB_LABEL`), ``user`` and ``project``; the values
are the accountant's running totals (:meth:`~nvdash.accounting.accountant.Accountant.running_totals`), not re-derived.

Bounded by :class:`OwnerBound`: at most ``limit`` owners have a series of their own, the rest are summed into one
series whose ``kind``, ``hpc_job``, ``user`` and ``project`` are :data:`OTHER`. Every series is a true counter (it never
goes down), so ``increase()`` summed over a node's series counts each GPU-second once:

- an owner taking a slot (it has more GPU time than the exported owner with the least) starts its series at what
  it gained since the last scrape; what ``_other`` had already shown of it stays in ``_other``;
- an owner losing its slot keeps what its series showed at the last scrape: its series ends there and what it
  gained since, and gains afterwards, goes to ``_other``. Should it take a slot again, its series starts again
  from what it gained since the last scrape (``increase()`` reads the drop as a counter reset).

So at any scrape the series add up to the node's total less what the series of owners that lost their slot had
shown (nothing, as long as no owner lost one).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from nvdash.accounting.attribution import Owner
    from nvdash.accounting.ledger import Tally

OTHER = "_other"
"""The ``kind``, ``job``, ``user`` and ``project`` of the series summing the owners beyond the bound."""
DEFAULT_OWNERS = 200
"""``--metrics-accounting-owners``: owners with a series of their own."""
JOB_LABEL = "hpc_job"
"""The owner's label at the job level. Not ``job``: Prometheus gives every scraped series its scrape job's name as
``job`` and renames a scraped ``job`` to ``exported_job``. The name is dcgm-exporter's HPC job label, as on the GPU
series of ``--metrics-job-label``."""
OWNER_LABELS = ("kind", JOB_LABEL, "user", "project")


@dataclass(frozen=True)
class Family:
    """One counter: its name, the :class:`~nvdash.accounting.ledger.Tally` attribute it exports, its help."""

    name: str
    attribute: str
    help: str


ACCOUNTING_COUNTERS = (
    Family("nvdash_accounting_gpu_allocated_seconds_total", "allocated_s",
           "GPU-seconds charged to the owner since nvdash started (a share of a GPU counts its fraction)."),
    Family("nvdash_accounting_gpu_busy_seconds_total", "busy_s",
           "Charged GPU-seconds in which the GPU (or MIG instance) was busy (utilization over 0)."),
    Family("nvdash_accounting_activity_known_seconds_total", "activity_known_s",
           "Charged GPU-seconds with a utilization reading (efficiency is busy over this; wasted is this minus busy)."),
    Family("nvdash_accounting_energy_joules_total", "energy_j",
           "Energy charged to the owner (in J): the GPU's energy-counter increase times the owner's fraction."),
    Family("nvdash_accounting_power_capped_seconds_total", "power_cap_s",
           "GPU-seconds the power cap held the owner's GPU clocks down."),
    Family("nvdash_accounting_thermal_slowdown_seconds_total", "thermal_s",
           "GPU-seconds thermal slowdown held the owner's GPU clocks down."),
)
"""The exported counters, in order."""
ACCOUNTING_COUNTER_NAMES = tuple(family.name for family in ACCOUNTING_COUNTERS)

Values = tuple[float, ...]
"""One value per :data:`ACCOUNTING_COUNTERS` entry."""
_ZERO: Values = tuple(0.0 for _ in ACCOUNTING_COUNTERS)


def values_of(tally: Tally) -> Values:
    """``tally``'s values in :data:`ACCOUNTING_COUNTERS`' order."""
    return tuple(float(getattr(tally, family.attribute)) for family in ACCOUNTING_COUNTERS)


def _plus(a: Values, b: Values) -> Values:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def _minus(a: Values, b: Values) -> Values:
    return tuple(max(0.0, x - y) for x, y in zip(a, b, strict=True))


def _rank(owner: Owner, values: Values) -> tuple[float, str, str, str, str]:
    return (-values[0], owner.kind, owner.job, owner.user, owner.project)


class OwnerBound:
    """Which owners have a series of their own, kept from scrape to scrape (one per server, shared by all its
    scrapers) so that every series only grows; see the module's docstring."""

    def __init__(self, limit: int = DEFAULT_OWNERS) -> None:
        if limit < 0:
            raise ValueError("the owner bound must be 0 or more")
        self.limit = limit
        self._lock = threading.Lock()
        self._base: dict[Owner, Values] = {}
        """Exported owners -> the part of their totals that ``_other`` shows (their series show the rest)."""
        self._shown: dict[Owner, Values] = {}
        """Owners that lost their slot -> what their series had shown (never shown again)."""
        self._last: dict[Owner, Values] = {}
        """Owners -> their totals at the last scrape (of an owner without a slot: what ``_other`` has shown)."""

    def split(self, totals: Mapping[Owner, Values]) -> tuple[dict[Owner, Values], Values]:
        """The series of this scrape: per exported owner its value, and ``_other``'s."""
        with self._lock:
            exported = self._choose(totals)
            owners = {owner: _minus(totals[owner], base) for owner, base in self._base.items() if owner in totals}
            # _other: the totals of the owners without a slot and the bases of those with one, less what the series
            # of owners that lost a slot showed (column sums: one pass in C over the many owners).
            parts = [values for owner, values in totals.items() if owner not in exported]
            parts += [self._base[owner] for owner in owners]
            columns = [sum(column) for column in zip(*parts, strict=True)] if parts else list(_ZERO)
            shown = [sum(column) for column in zip(*self._shown.values(), strict=True)] if self._shown else _ZERO
            other = tuple(max(0.0, total - gone) for total, gone in zip(columns, shown, strict=True))
            self._last = dict(totals)
            return owners, other

    def _choose(self, totals: Mapping[Owner, Values]) -> set[Owner]:
        """Hand slots to the owners with the most GPU time: free slots first, then one by one, an owner without a
        slot that has more GPU time than the slotted owner with the least takes that owner's slot."""
        slotted = sorted((owner for owner in self._base if owner in totals), key=lambda o: _rank(o, totals[o]))
        free = self.limit - len(self._base)
        least = totals[slotted[-1]][0] if slotted else 0.0
        # Only the owners that could take a slot are sorted: as many as are free, and those above the least.
        candidates = [owner for owner in totals if owner not in self._base and totals[owner][0] > least]
        if free > 0:
            candidates = list({*candidates, *heapq.nsmallest(
                free, (owner for owner in totals if owner not in self._base), key=lambda o: _rank(o, totals[o]))})
        for owner in sorted(candidates, key=lambda o: _rank(o, totals[o])):
            if len(self._base) >= self.limit:
                if not slotted or totals[owner][0] <= totals[slotted[-1]][0]:
                    break
                loser = slotted.pop()
                base = self._base.pop(loser)
                # What its series showed at the last scrape stays its own; what it gained since goes to _other.
                self._shown[loser] = _plus(self._shown.get(loser, _ZERO), _minus(self._last.get(loser, base), base))
            self._base[owner] = self._last.get(owner, _ZERO)
        return set(self._base)


def accounting_families(totals: Mapping[Owner, Tally], bound: OwnerBound, node: Mapping[str, str], *,
                        openmetrics: bool = False) -> list[Metric]:
    """The counters for the accountant's running ``totals``, bounded by ``bound``; ``node``: the node's labels
    (``Hostname``). The families are named with ``_total`` in the text format (its ``# TYPE`` line names the
    family as written), without in OpenMetrics (whose samples add it)."""
    owners, other = bound.split({owner: values_of(tally) for owner, tally in totals.items()})
    families = [Metric(family.name.removesuffix("_total") if openmetrics else family.name, family.help, "counter")
                for family in ACCOUNTING_COUNTERS]
    series = [({**node, "kind": owner.kind, JOB_LABEL: owner.job, "user": owner.user, "project": owner.project}, values)
              for owner, values in sorted(owners.items(), key=lambda item: _rank(item[0], item[1]))]
    if totals:
        series.append(({**node, **dict.fromkeys(OWNER_LABELS, OTHER)}, other))
    for labels, values in series:
        for index, family in enumerate(ACCOUNTING_COUNTERS):
            families[index].add_sample(family.name, labels, values[index])
    return families
