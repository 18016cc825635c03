"""The JSON APIs' field names that say which figure they are, and the older names kept for one release.

The records keep their names (``GpuInfo.pcie_generation`` is the link's maximum generation); the JSON documents
name each figure by what it is (``pcie_generation_max`` beside ``pcie_generation_current``). A client written
against the older names keeps working for one release: both names are served, with the same value, and each
document lists the older ones under ``deprecated_aliases``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

RENAMED: dict[str, str] = {
    "pcie_generation": "pcie_generation_max",
    "pcie_width": "pcie_width_max",
    "power_limit_w": "power_enforced_limit_w",
    "nvlink_max_bytes_per_s": "nvlink_data_max_bytes_per_s",
    "nvlink_link_bytes_per_s": "nvlink_link_data_bytes_per_s",
}
"""Older name -> the name that says what the figure is. The older names are served until the next release."""


def add_clear_names(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with each renamed field also under its new name, placed just before the older one."""
    named: dict[str, Any] = {}
    for name, value in fields.items():
        if name in RENAMED:
            named[RENAMED[name]] = value
        named[name] = value
    return named


def deprecated_aliases(served: Iterable[str] | None = None) -> dict[str, str]:
    """What a document lists under ``deprecated_aliases``: each older name it serves (all when ``served`` is
    ``None``) and the name that replaces it."""
    names = set(RENAMED) if served is None else set(served)
    return {old: new for old, new in RENAMED.items() if old in names}
