"""The ``shares`` list of ``/api/processes.json``: how each GPU (or MIG instance) divides among its owners.

One entry per unit of the snapshot's shares, in the sampler's words and units (percent 0-100 of the unit's time,
bytes, watts, joules counted since the server started); ``null`` means unknown. The owners' ``sm_pct`` never add up
to more than ``utilization_pct``; ``unattributed`` is what no owner's samples explain.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nvdash.sampling.share_records import OwnerShare, UnitShares


def owner_json(share: OwnerShare) -> dict[str, Any]:
    """One owner's part of a unit."""
    owner = share.owner
    return {
        "kind": owner.kind,
        "namespace": owner.namespace,
        "pod": owner.pod,
        "container": owner.container,
        "pid": owner.pid,
        "label": owner.label,
        "sm_pct": share.sm_pct,
        "fraction": share.fraction,
        "memory_bytes": share.memory_bytes,
        "power_w": share.power_w,
        "energy_j": share.energy_j,
        "gpm_sm_active_pct": share.gpm_sm_active_pct,
        "processes": share.processes,
    }


def unit_json(unit: UnitShares) -> dict[str, Any]:
    """One GPU or MIG instance: its owners' parts and the unattributed rest."""
    return {
        "gpu": unit.gpu_index,
        "uuid": unit.gpu_uuid,
        "unit": unit.unit,
        "sharing": unit.sharing,
        "window_s": unit.window_s,
        "utilization_pct": unit.utilization_pct,
        "measured": unit.measured,
        "owners": [owner_json(share) for share in unit.owners],
        "unattributed": {
            "sm_pct": unit.unattributed_sm_pct,
            "memory_bytes": unit.unattributed_memory_bytes,
            "power_w": unit.unattributed_power_w,
            "energy_j": unit.unattributed_energy_j,
        },
    }


def shares_json(units: Iterable[UnitShares]) -> list[dict[str, Any]]:
    """The ``shares`` list."""
    return [unit_json(unit) for unit in units]
