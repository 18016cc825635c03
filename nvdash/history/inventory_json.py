"""The inventory as JSON, so a recording knows the GPUs it was made on (names, limits, links) when replayed."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any

from nvdash.sampling.nvml_probe import NVLINK_LINK_BYTES_PER_S
from nvdash.sampling.records import GpuInfo, HostInfo, Inventory


def dumps(inventory: Inventory) -> str:
    """The inventory as one JSON object."""
    return json.dumps(dataclasses.asdict(inventory), separators=(",", ":"))


def _value_fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value can stand for a field of type ``hint`` (``int``, ``float | None``, ``tuple[int, ...]``)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_value_fits(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is tuple:
        (item, *_) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_value_fits(entry, item) for entry in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    return True


def _known(cls: type[Any], fields: Any) -> dict[str, Any]:
    """Only the fields ``cls`` has (a file from another version may have more or fewer), each of its type.

    Raises ``TypeError`` for a value of another type (a damaged or crafted file): pages would fail on it later.
    """
    if not isinstance(fields, dict):
        raise TypeError(f"{cls.__name__} is not an object")
    hints = typing.get_type_hints(cls)
    known: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in fields:
            continue
        value = fields[field.name]
        if field.name not in ("host", "gpus") and not _value_fits(value, hints[field.name]):
            raise TypeError(f"{cls.__name__}.{field.name} is {json.dumps(value)[:40]}, not {hints[field.name]}")
        known[field.name] = value
    return known


def _nvlink_rates_apart(known: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """An inventory written before the NVLink data and signalling rates were apart carried the driver's speed field
    (the signalling rate) as the link rate where the driver answered it: move it, and put the generation's data
    rate in its place, so an older recording's percentages are of the data rate too."""
    if "nvlink_signalling_max_bytes_per_s" in fields or not known.get("nvlink_speed_from_driver"):
        return known
    known["nvlink_link_signalling_bytes_per_s"] = known.get("nvlink_link_bytes_per_s")
    known["nvlink_signalling_max_bytes_per_s"] = known.get("nvlink_max_bytes_per_s")
    data_rate = NVLINK_LINK_BYTES_PER_S.get(str(known.get("nvlink_version")))
    known["nvlink_link_bytes_per_s"] = data_rate
    links = known.get("nvlink_links")
    known["nvlink_max_bytes_per_s"] = data_rate * links if data_rate is not None and isinstance(links, int) else None
    return known


def loads(text: str) -> Inventory:
    """The inventory written by :func:`dumps`; raises ``ValueError`` when the text is not one."""
    try:
        data = json.loads(text)
        host = HostInfo(**_known(HostInfo, data["host"]))
        gpus = []
        for fields in data.get("gpus", []):
            known = _nvlink_rates_apart(_known(GpuInfo, fields), fields)
            known["nvlink_active_links"] = tuple(known.get("nvlink_active_links", ()))
            gpus.append(GpuInfo(**known))
        rest = _known(Inventory, data)
        rest.pop("host", None)
        rest.pop("gpus", None)
        rest["topology"] = tuple(tuple(row) for row in rest.get("topology", ()))
        return Inventory(host=host, gpus=tuple(gpus), **rest)
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"not an nvdash inventory: {error}") from None
