"""The shares table of the GPU Processes page: who owns each GPU's (or MIG instance's) work, power and energy.

One row per owner of each unit (a GPU, or a MIG instance of it) from the snapshot's ``shares``, then one
``unattributed`` row per unit with what no owner's samples explain. A unit is listed when it has owners or SM work
that nobody explains; an idle, unowned GPU is left out (its power and energy are all unattributed, and nobody to
tell apart). The shares themselves are computed by the sampler; this module only lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from bokeh.models.widgets import HTMLTemplateFormatter, TableColumn

from nvdash.apps.process_notes import SHARING_NAMES
from nvdash.apps.process_usage import device_text, find_instance
from nvdash.sampling.share_records import OwnerShare, UnitShares
from nvdash.sampling.usage_records import Usage
from nvdash.units import format_bytes, format_energy, format_pct, format_power

UNATTRIBUTED = "unattributed"
SHARE_COLUMNS = {
    "unit": ("GPU / MIG instance", 210),
    "sharing": ("sharing", 85),
    "owner": ("owner", 260),
    "sm": ("SM share", 80),
    "memory": ("GPU memory", 90),
    "power": ("power", 75),
    "energy": ("energy", 80),
    "processes": ("processes", 70),
}
"""The shown columns: title and width. Each text column but ``unit``, ``sharing`` and ``owner`` has a numeric
twin (``sm_pct``, ``memory_bytes``, ``power_w``, ``energy_j``) to sort by; ``processes`` is blank on an
unattributed row."""
_NUMBERS = ("sm_pct", "memory_bytes", "power_w", "energy_j")
_SORTED_BY = {"sm": "sm_pct", "memory": "memory_bytes", "power": "power_w", "energy": "energy_j"}
_RIGHT = '<div style="text-align:right"><%- {} %></div>'


def share_table_columns() -> list[TableColumn]:
    """The table's columns; numbers are right-aligned text that sorts by its numeric twin."""
    made = []
    for name, (title, width) in SHARE_COLUMNS.items():
        numeric = _SORTED_BY.get(name)
        if numeric is None:
            made.append(TableColumn(field=name, title=title, width=width))
        else:
            made.append(TableColumn(field=numeric, title=title, width=width,
                                    formatter=HTMLTemplateFormatter(template=_RIGHT.format(name))))
    return made


def unit_text(unit: UnitShares, usage: Usage | None) -> str:
    """``GPU 0``, or ``GPU 1 / MIG 3g.20gb (GI 1)`` for a MIG instance (its UUID when the reading lacks it)."""
    if unit.unit == unit.gpu_uuid:
        return f"GPU {unit.gpu_index}"
    named = "" if usage is None else device_text(usage, unit.unit)
    return named or f"GPU {unit.gpu_index} / {unit.unit}"


def _unit_order(unit: UnitShares, usage: Usage | None) -> tuple[int, int, int, int, str]:
    """GPU order, the whole GPU before its MIG instances, which follow in (GI, CI) order."""
    if unit.unit == unit.gpu_uuid:
        return (unit.gpu_index, 0, 0, 0, "")
    instance = None if usage is None else find_instance(usage, unit.unit)
    if instance is None:
        return (unit.gpu_index, 2, 0, 0, unit.unit)
    return (unit.gpu_index, 1, instance.gpu_instance_id, instance.compute_instance_id, "")


def has_rows(unit: UnitShares) -> bool:
    """True when the unit has owners, or SM work no owner explains."""
    return bool(unit.owners) or (unit.unattributed_sm_pct or 0.0) > 0.0


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _owner_order(share: OwnerShare) -> tuple[float, str]:
    """Largest SM share first (memory-only owners last), then by name."""
    return (-(share.sm_pct if share.sm_pct is not None else -1.0), share.owner.label)


class _Row(NamedTuple):
    owner: str
    sm_pct: float | None
    memory_bytes: int | None
    power_w: float | None
    energy_j: float
    processes: int | None


def _rows(unit: UnitShares) -> list[_Row]:
    owners = [_Row(share.owner.label, share.sm_pct, share.memory_bytes, share.power_w, share.energy_j,
                   share.processes) for share in sorted(unit.owners, key=_owner_order)]
    rest = _Row(UNATTRIBUTED, unit.unattributed_sm_pct, unit.unattributed_memory_bytes, unit.unattributed_power_w,
                unit.unattributed_energy_j, None)
    return [*owners, rest]


def share_columns(shares: Sequence[UnitShares], usage: Usage | None) -> dict[str, list[Any]]:
    """The table's source: units in GPU order (MIG instances by GI), each unit's owners (largest SM share first),
    then its unattributed row. Unknown numbers are NaN in the numeric columns and ``n/a`` in the text ones."""
    data: dict[str, list[Any]] = {name: [] for name in (*SHARE_COLUMNS, *_NUMBERS)}
    for unit in sorted((u for u in shares if has_rows(u)), key=lambda u: _unit_order(u, usage)):
        where, sharing = unit_text(unit, usage), SHARING_NAMES.get(unit.sharing, unit.sharing)
        for row in _rows(unit):
            for name, value in (
                ("unit", where),
                ("sharing", sharing),
                ("owner", row.owner),
                ("sm", format_pct(row.sm_pct)),
                ("memory", format_bytes(row.memory_bytes)),
                ("power", format_power(row.power_w)),
                ("energy", format_energy(row.energy_j)),
                ("processes", "" if row.processes is None else str(row.processes)),
                ("sm_pct", _number(row.sm_pct)),
                ("memory_bytes", _number(row.memory_bytes)),
                ("power_w", _number(row.power_w)),
                ("energy_j", _number(row.energy_j)),
            ):
                data[name].append(value)
    return data
