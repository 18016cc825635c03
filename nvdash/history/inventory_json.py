"""The inventory as JSON, so a recording knows the GPUs it was made on (names, limits, links) when replayed."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from nvdash.sampling.records import GpuInfo, HostInfo, Inventory


def dumps(inventory: Inventory) -> str:
    """The inventory as one JSON object."""
    return json.dumps(dataclasses.asdict(inventory), separators=(",", ":"))


def _known(cls: type[Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Only the fields ``cls`` has (a file from another version may have more or fewer)."""
    names = {field.name for field in dataclasses.fields(cls)}
    return {key: value for key, value in fields.items() if key in names}


def loads(text: str) -> Inventory:
    """The inventory written by :func:`dumps`; raises ``ValueError`` when the text is not one."""
    try:
        data = json.loads(text)
        host = HostInfo(**_known(HostInfo, data["host"]))
        gpus = []
        for fields in data.get("gpus", []):
            known = _known(GpuInfo, fields)
            known["nvlink_active_links"] = tuple(known.get("nvlink_active_links", ()))
            gpus.append(GpuInfo(**known))
        rest = _known(Inventory, data)
        rest.pop("host", None)
        rest.pop("gpus", None)
        rest["topology"] = tuple(tuple(row) for row in rest.get("topology", ()))
        return Inventory(host=host, gpus=tuple(gpus), **rest)
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"not an nvdash inventory: {error}") from None
