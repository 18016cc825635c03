"""The GPU Accounting page's data: the report's rows, the wasted hours per owner and the allocations idle now as
table and bar columns, the totals line and the CSV download's URL. Pure functions of a report (easy to test)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

from nvdash.accounting.attribution import Owner
from nvdash.accounting.idle import IdleAllocation
from nvdash.accounting.report import Report, hour_totals, range_total, throttle_totals_text
from nvdash.accounting.summary import Row
from nvdash.apps.time_range import describe_seconds
from nvdash.units import format_bytes

CSV_PATH = "api/accounting.csv"
"""Relative to the page (``<prefix>/GPU-Accounting``), so it resolves to ``<prefix>/api/accounting.csv`` behind any
proxy (JupyterLab's too)."""
TOP_WASTERS = 10
INCOMPLETE = "*"
"""Marks energy counted over part of the allocated time only."""
NO_WASTE = "(none)"
"""The bar chart's one category when nobody wasted any GPU time."""

ROW_FIELDS = ("key", "kinds", "gpus", "gpu_hours", "busy_hours", "wasted_hours", "efficiency_pct", "energy_kwh",
              "energy_text", "utilization_pct", "peak_memory_bytes", "peak_memory_text", "power_cap_pct",
              "thermal_pct", "start", "end")
IDLE_FIELDS = ("gpu", "unit", "owner", "reason", "idle_min", "memory")


def local_time(seconds: float) -> str:
    """``2026-11-21 08:00``, in the server's local time (sorts as text)."""
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def _number(value: float | None) -> float:
    """A table cell's number; NaN (shown as a dash) when unknown."""
    return math.nan if value is None else float(value)


def gpu_list(indices: Sequence[int]) -> str:
    """``0-3, 6``: the GPU indices, runs of neighbours joined."""
    runs: list[list[int]] = []
    for index in sorted(set(indices)):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def row_columns(rows: Sequence[Row]) -> dict[str, list[Any]]:
    """The accounting table: one row per owner, numbers kept as numbers so the columns sort by value (the shares
    of GPU time lost to the power cap and to heat NaN, a dash, when their counters were never read)."""
    data: dict[str, list[Any]] = {name: [] for name in ROW_FIELDS}
    for row in rows:
        total = row.total
        efficiency = None if total.efficiency is None else 100.0 * total.efficiency
        values = {
            "key": row.key, "kinds": ", ".join(sorted(row.kinds)),
            "gpus": gpu_list(list(row.gpus)),
            "gpu_hours": row.gpu_hours, "busy_hours": row.busy_hours, "wasted_hours": row.wasted_hours,
            "efficiency_pct": _number(efficiency), "energy_kwh": row.energy_kwh,
            "energy_text": f"{row.energy_kwh:.3f}{'' if total.energy_complete else INCOMPLETE}",
            "utilization_pct": _number(total.mean_utilization_pct),
            "peak_memory_bytes": _number(total.peak_memory_bytes),
            "peak_memory_text": "-" if total.peak_memory_bytes is None else format_bytes(total.peak_memory_bytes),
            "power_cap_pct": _number(total.power_cap_pct), "thermal_pct": _number(total.thermal_pct),
            "start": local_time(total.start_s), "end": local_time(total.end_s),
        }
        for name in ROW_FIELDS:
            data[name].append(values[name])
    return data


def waste_columns(rows: Sequence[Row], top: int = TOP_WASTERS) -> dict[str, list[Any]]:
    """The bars of the owners who wasted the most GPU-hours (allocated at 0 % utilization), most first."""
    wasters = sorted((row for row in rows if row.wasted_hours > 0), key=lambda row: (-row.wasted_hours, row.key))
    wasters = wasters[:top]
    if not wasters:
        return {"owner": [NO_WASTE], "wasted": [0.0], "text": ["no GPU time was wasted"]}
    return {"owner": [row.key for row in wasters], "wasted": [row.wasted_hours for row in wasters],
            "text": [f"{row.wasted_hours:.3f} GPU-h of {row.gpu_hours:.3f}" for row in wasters]}


def owner_text(owner: Owner) -> str:
    """``555 (slurm, alice)``: the job or pod, its kind and its user."""
    detail = owner.kind if owner.user in (owner.job, "") else f"{owner.kind}, {owner.user}"
    return f"{owner.job} ({detail})"


def idle_columns(idle: Sequence[IdleAllocation], now_s: float) -> dict[str, list[Any]]:
    """The allocations idle now: GPU, unit, owner, why, and for how many minutes."""
    data: dict[str, list[Any]] = {name: [] for name in IDLE_FIELDS}
    for allocation in idle:
        values = {"gpu": allocation.gpu_index, "unit": allocation.unit, "owner": owner_text(allocation.owner),
                  "reason": allocation.reason, "idle_min": round(allocation.idle_s(now_s) / 60.0, 1),
                  "memory": "-" if allocation.memory_bytes is None else format_bytes(allocation.memory_bytes)}
        for name in IDLE_FIELDS:
            data[name].append(values[name])
    return data


def idle_note(report: Report) -> str:
    """What the idle table shows, or why it is empty."""
    if report.idle_after_s is None:
        return "Allocations idle now are known only on a server that samples GPUs (not in a replay)."
    after = describe_seconds(report.idle_after_s)
    count = len(report.idle)
    if not count:
        return f"No allocation has been idle for {after} or more."
    return f"{count} allocation{'' if count == 1 else 's'} idle for {after} or more, longest first."


def totals_html(report: Report) -> str:
    """The range's totals in two lines (each fits a narrow pane): hours and energy, then the GPU time lost to the
    power cap and to heat (``-`` where no counter was read)."""
    summed = hour_totals(report)
    partial = any(not row.total.energy_complete for row in report.rows)
    note = f" ({INCOMPLETE} energy counted over part of the time only)" if partial else ""
    throttle = throttle_totals_text(range_total(report), " · ")
    return (f"<b>Range totals:</b> {summed['gpu_hours']:.3f} GPU-hours · {summed['busy_hours']:.3f} busy · "
            f"{summed['wasted_hours']:.3f} wasted · {summed['energy_kwh']:.3f} kWh{escape(note)}<br>"
            f"Lost to throttling: {escape(throttle)}")


def csv_href_at(path: str, range_name: str, by: str, start: str = "", end: str = "") -> str:
    """The CSV download's URL (``path`` relative to the page) for the choices (``from``/``to`` for a custom range)."""
    query = [("from", start), ("to", end)] if start else [("range", range_name)]
    return f"{path}?{urlencode([*((name, value) for name, value in query if value), ('by', by)])}"


def csv_href(range_name: str, by: str, start: str = "", end: str = "") -> str:
    """The GPU Accounting page's CSV download for its choices."""
    return csv_href_at(CSV_PATH, range_name, by, start, end)


LINK_COLORS = {False: "#1565c0", True: "#8ab4f8"}
"""The link's colour on the light and the dark theme."""


def csv_link_html(href: str, dark: bool = False) -> str:
    """The download link."""
    return f'<a href="{escape(href)}" style="color:{LINK_COLORS[dark]}" download>Download CSV</a>'
