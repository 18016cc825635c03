"""The accounting report: a range, a grouping, the rows, and the allocations idle now, as JSON, CSV or a table.

One report serves ``/api/accounting.json``, the CSV download, the ``/GPU-Accounting`` page and ``nvdash report``.
"""

from __future__ import annotations

import csv
import io
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nvdash.accounting import stored
from nvdash.accounting.accountant import Accountant
from nvdash.accounting.attribution import Owner
from nvdash.accounting.idle import IdleAllocation
from nvdash.accounting.ledger import Tally
from nvdash.accounting.summary import GROUPINGS, S_PER_H, Row, summarize
from nvdash.accounting.throttle import POLICIES
from nvdash.history.database import HistoryError
from nvdash.history.ranges import RangeError, TimeRange, resolve
from nvdash.units import format_bytes

RANGES = ("today", "7d", "30d")
"""The page's choices besides a custom from/to."""
DEFAULT_RANGE = "7d"
TODAY = "today"

Totals = list[tuple[Owner, int, Tally]]


def local_midnight(now_s: float) -> float:
    """The start of the local day holding ``now_s``."""
    moment = datetime.fromtimestamp(now_s).astimezone()
    return moment.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def accounting_range(arguments: Mapping[str, str], now_s: float) -> TimeRange:
    """The range ``range=`` (``today``, or a duration such as ``7d``) or ``from=``/``to=`` names; raises
    :class:`RangeError` with a one-line message. The default is the last 7 days."""
    given = {key: value for key, value in arguments.items() if value}
    if given.get("range", "").lower() == TODAY and not given.get("from"):
        if given.get("to"):
            raise RangeError("to= needs from=")
        return TimeRange(local_midnight(now_s), now_s, TODAY)
    chosen = resolve(given, now_s, default=DEFAULT_RANGE)
    if chosen is None:
        raise RangeError("the accounting has no live range; choose today, a duration such as 7d, or from=/to=")
    return chosen


def grouping(by: str) -> str:
    """``by`` checked against the groupings; raises :class:`RangeError` (a bad request) otherwise."""
    if by not in GROUPINGS:
        raise RangeError(f"by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    return by


@dataclass
class AccountingBook:
    """Where totals are read: the history's accounting table when there is a history, else the accountant's
    memory (since this server started); and the live idle allocations, from the accountant."""

    accountant: Accountant | None = None
    connection: Callable[[], sqlite3.Connection] | None = None
    clock: Callable[[], float] = time.time
    source: str = field(init=False)

    def __post_init__(self) -> None:
        self.source = "history" if self.connection is not None else "memory" if self.accountant else "none"

    def totals(self, start_s: float, end_s: float) -> Totals:
        """Per (owner, GPU), the tallies of the hours overlapping the range, added up."""
        if self.connection is not None:
            try:
                return stored.totals(self.connection(), start_s, end_s)
            except sqlite3.DatabaseError as error:
                raise HistoryError(f"reading the accounting failed: {error}") from None
        if self.accountant is not None:
            return self.accountant.tallies(start_s, end_s)
        return []

    def status(self) -> dict[str, object]:
        """Where the accounting is read, and the accountant's own status when there is one."""
        result: dict[str, object] = {"source": self.source}
        if self.accountant is not None:
            result.update(self.accountant.status())
        return result

    def idle(self) -> tuple[float, list[IdleAllocation]]:
        """The latest reading's time and the allocations idle for long enough at it (none without a sampler)."""
        if self.accountant is None:
            return self.clock(), []
        return self.accountant.idle()


@dataclass
class Report:
    """What the accounting shows for one range and grouping."""

    range: TimeRange
    by: str
    rows: list[Row]
    source: str
    idle: list[IdleAllocation] = field(default_factory=list)
    idle_now_s: float = 0.0
    idle_after_s: float | None = None


def make_report(book: AccountingBook, chosen: TimeRange, by: str) -> Report:
    """The report of ``book`` over ``chosen``, grouped ``by`` (reads the history: call off the event loop)."""
    rows = summarize(book.totals(chosen.start_s, chosen.end_s), grouping(by))
    now, idle = book.idle()
    after = book.accountant.idle_after_s if book.accountant is not None else None
    return Report(chosen, by, rows, book.source, idle, now, after)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def throttle_json(total: Tally) -> dict[str, Any]:
    """Per policy (``power_cap``, ``thermal``): the GPU-seconds lost to it (``_s``), the GPU-seconds over which its
    counter was read (``_known_s``) and the share lost, in percent (``_pct``: the first over the second; see
    :mod:`nvdash.accounting.throttle`); the seconds and the share are ``None`` (unknown) when never read."""
    result: dict[str, Any] = {}
    for policy in POLICIES:
        known = getattr(total, f"{policy}_known_s")
        result[f"{policy}_s"] = round(getattr(total, f"{policy}_s"), 3) if known > 0 else None
        result[f"{policy}_known_s"] = round(known, 3)
        result[f"{policy}_pct"] = _rounded(getattr(total, f"{policy}_pct"), 2)
    return result


def row_json(row: Row) -> dict[str, Any]:
    """One row: the owner, its GPUs, GPU-hours (allocated, busy, wasted), energy, efficiency, memory, the time lost
    to throttling, times."""
    total = row.total
    return {
        "key": row.key,
        "kinds": sorted(row.kinds),
        "gpus": sorted(row.gpus),
        "gpu_seconds": round(total.allocated_s, 3),
        "gpu_hours": round(row.gpu_hours, 6),
        "busy_hours": round(row.busy_hours, 6),
        "wasted_hours": round(row.wasted_hours, 6),
        "efficiency_pct": _rounded(None if total.efficiency is None else 100.0 * total.efficiency, 2),
        "energy_j": round(total.energy_j, 3),
        "energy_kwh": round(row.energy_kwh, 6),
        "energy_complete": total.energy_complete,
        "mean_utilization_pct": _rounded(total.mean_utilization_pct, 2),
        "mean_sm_active_pct": _rounded(total.mean_sm_active_pct, 2),
        "peak_memory_bytes": total.peak_memory_bytes,
        "mean_memory_bytes": _rounded(total.mean_memory_bytes, 0),
        **throttle_json(total),
        "start_s": total.start_s,
        "end_s": total.end_s,
        "start": _iso(total.start_s),
        "end": _iso(total.end_s),
    }


def idle_json(allocation: IdleAllocation, now_s: float) -> dict[str, Any]:
    """One idle allocation: the unit, its owner, since when and why."""
    owner = allocation.owner
    return {"gpu": allocation.gpu_index, "unit": allocation.unit, "kind": owner.kind, "job": owner.job,
            "user": owner.user, "project": owner.project, "reason": allocation.reason,
            "since_s": allocation.since_s, "idle_s": round(allocation.idle_s(now_s), 3),
            "memory_bytes": allocation.memory_bytes}


def range_total(report: Report) -> Tally:
    """All the report's rows added up into one tally (the range's totals)."""
    total = Tally(start_s=report.range.start_s, end_s=report.range.end_s)
    for row in report.rows:
        total.merge(row.total)
    return total


def hour_totals(report: Report) -> dict[str, float]:
    """GPU-hours (allocated, busy, wasted) and kWh of all the report's rows."""
    return {name: round(sum(getattr(row, name) for row in report.rows), 6)
            for name in ("gpu_hours", "busy_hours", "wasted_hours", "energy_kwh")}


def totals(report: Report) -> dict[str, float | None]:
    """:func:`hour_totals`, and the time the rows lost to throttling as :func:`throttle_json` gives it for a row:
    per policy the seconds summed over the rows, over the known seconds summed over the rows (``None`` when no
    row's counter was ever read)."""
    return {**hour_totals(report), **throttle_json(range_total(report))}


def report_json(report: Report) -> dict[str, Any]:
    """The whole report as ``/api/accounting.json`` answers it."""
    rows = [row_json(row) for row in report.rows]
    return {
        "range": {"label": report.range.label, "start_s": report.range.start_s, "end_s": report.range.end_s},
        "by": report.by,
        "source": report.source,
        "resolution_s": 3600,
        "rows": rows,
        "totals": totals(report),
        "idle_after_s": report.idle_after_s,
        "idle_allocations": [idle_json(allocation, report.idle_now_s) for allocation in report.idle],
    }


CSV_COLUMNS = ("key", "kinds", "gpus", "gpu_hours", "busy_hours", "wasted_hours", "efficiency_pct", "energy_kwh",
               "energy_complete", "mean_utilization_pct", "mean_sm_active_pct", "peak_memory_bytes", "power_cap_s",
               "power_cap_pct", "thermal_s", "thermal_pct", "start", "end")


def report_csv(report: Report) -> str:
    """The rows as CSV, a header line first; the first column is named after the grouping."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((report.by, *CSV_COLUMNS[1:]))
    for row in report.rows:
        values = row_json(row)
        values["kinds"] = " ".join(values["kinds"])
        values["gpus"] = " ".join(str(gpu) for gpu in values["gpus"])
        writer.writerow(["" if values[name] is None else values[name] for name in CSV_COLUMNS])
    return out.getvalue()


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


THROTTLE_NOTE_PCT = 5.0
"""``nvdash report`` says in a sentence which rows lost at least this share of their GPU time to a policy."""
SECONDS_UNDER_S = 3600.0
"""GPU time under one GPU-hour is written in GPU-seconds: hours to two decimals would be too coarse to check the
share against (``0.01 of 0.08 GPU-hours`` for 6.7 %)."""
POLICY_WORDS = {"power_cap": "the power cap", "thermal": "thermal slowdown"}
_GROUP_WORDS = {"job": "", "pod": "pod ", "user": "user ", "namespace": "project "}


def _owner_words(report: Report, row: Row) -> str:
    if report.by == "job":
        kind = next(iter(row.kinds)) if len(row.kinds) == 1 else ""
        return {"slurm": "job ", "pod": "pod ", "container": "container ", "user": "user "}.get(kind, "") + row.key
    return _GROUP_WORDS.get(report.by, "") + row.key


def _gpu_time(lost_s: float, known_s: float) -> str:
    """``0.14 of 1.00 GPU-hours``, or ``19.5 of 291.6 GPU-seconds`` when ``known_s`` is under
    :data:`SECONDS_UNDER_S`."""
    if known_s < SECONDS_UNDER_S:
        return f"{lost_s:.1f} of {known_s:.1f} GPU-seconds"
    return f"{lost_s / S_PER_H:.2f} of {known_s / S_PER_H:.2f} GPU-hours"


def throttle_totals_text(total: Tally, separator: str = ", ") -> str:
    """The time ``total`` (the range's, see :func:`range_total`) lost to throttling: ``power cap 14.0 % (1.4 of
    10.0 GPU-seconds), thermal -`` (``-``: the counter was never read)."""
    parts = []
    for policy, label in (("power_cap", "power cap"), ("thermal", "thermal")):
        share = getattr(total, f"{policy}_pct")
        lost, known = getattr(total, f"{policy}_s"), getattr(total, f"{policy}_known_s")
        parts.append(f"{label} -" if share is None else f"{label} {share:.1f} % ({_gpu_time(lost, known)})")
    return separator.join(parts)


def throttle_notes(report: Report, threshold_pct: float = THROTTLE_NOTE_PCT) -> list[str]:
    """One sentence per row and policy whose share of GPU time lost is at least ``threshold_pct``:
    ``job 4242 lost 14.0 % of its GPU time to the power cap (0.14 of 1.00 GPU-hours)``."""
    notes = []
    for row in report.rows:
        for policy in POLICIES:
            share = getattr(row.total, f"{policy}_pct")
            if share is None or share < threshold_pct:
                continue
            lost, known = getattr(row.total, f"{policy}_s"), getattr(row.total, f"{policy}_known_s")
            notes.append(f"{_owner_words(report, row)} lost {share:.1f} % of its GPU time to {POLICY_WORDS[policy]} "
                         f"({_gpu_time(lost, known)})")
    return notes


def report_table(report: Report) -> str:
    """The rows as an aligned text table, with the range and the totals, like ``sacct`` prints, then a sentence
    for each row that lost at least :data:`THROTTLE_NOTE_PCT` of its GPU time to the power cap or to heat."""
    header = (report.by.upper(), "KIND", "GPUS", "GPU-H", "BUSY-H", "WASTED-H", "EFF%", "KWH", "PEAK-MEM",
              "POWER-CAP%", "THERMAL%", "START", "END")
    lines: list[tuple[str, ...]] = [header]
    for row in report.rows:
        total = row.total
        efficiency = None if total.efficiency is None else 100.0 * total.efficiency
        peak = total.peak_memory_bytes
        lines.append((
            row.key, ",".join(sorted(row.kinds)), ",".join(str(gpu) for gpu in sorted(row.gpus)),
            _cell(row.gpu_hours), _cell(row.busy_hours), _cell(row.wasted_hours), _cell(efficiency, 1),
            _cell(row.energy_kwh, 3) + ("" if total.energy_complete else "*"),
            "-" if peak is None else format_bytes(peak), _cell(total.power_cap_pct, 1), _cell(total.thermal_pct, 1),
            _iso(total.start_s)[:16].replace("T", " "), _iso(total.end_s)[:16].replace("T", " "),
        ))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    text = [f"nvdash accounting, {_iso(report.range.start_s)} to {_iso(report.range.end_s)}, by {report.by}"]
    text += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
             for line in lines]
    if not report.rows:
        text.append("(no GPU was allocated or used in this range)")
    summed = hour_totals(report)
    text.append(f"total: {summed['gpu_hours']:.2f} GPU-hours, {summed['busy_hours']:.2f} busy, "
                f"{summed['wasted_hours']:.2f} wasted, {summed['energy_kwh']:.3f} kWh; lost to throttling: "
                f"{throttle_totals_text(range_total(report))}")
    if any(not row.total.energy_complete for row in report.rows):
        text.append("* the energy counter was not read over all of the allocated time")
    text += throttle_notes(report)
    return "\n".join(text) + "\n"


__all__ = ["RANGES", "AccountingBook", "RangeError", "Report", "accounting_range", "make_report", "report_csv",
           "report_json", "report_table"]
