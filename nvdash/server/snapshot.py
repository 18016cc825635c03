"""``/api/snapshot.json``: the latest reading of every GPU and the host, health with reasons, recent events.

Every value comes from the store (never from NVML) with its unit in its name; ``null`` means unsupported or not
read yet. Names say which figure a value is: ``pcie_generation_max`` beside ``pcie_generation_current``,
``power_enforced_limit_w`` beside ``power_management_limit_w`` (the requested limit), ``nvlink_data_max_bytes_per_s``
(the usable data rate: percentages of the NVLink maximum are of it) beside ``nvlink_signalling_max_bytes_per_s`` (the
driver's link speed, above it by the encoding overhead). ``memory_used_bytes`` excludes the driver-reserved memory
(``memory_reserved_bytes``), as nvidia-smi's ``memory.used`` does. The older names in ``deprecated_aliases`` are
served beside the new ones until the next release (see :mod:`nvdash.server.field_names`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from nvdash.accounting.idle import IdleAllocation
from nvdash.health.clock_events import decode_reasons
from nvdash.health.status import GpuHealth, evaluate
from nvdash.health.xid import xid_info
from nvdash.sampling.records import GpuEvent, GpuInfo, GpuSample, Snapshot
from nvdash.server.field_names import add_clear_names, deprecated_aliases
from nvdash.server.usage_json import mig_json
from nvdash.store import Store

RECENT_EVENTS = 50


def _info_fields(info: GpuInfo) -> dict[str, Any]:
    fields = dataclasses.asdict(info)
    fields.pop("index")
    return fields


def _sample_fields(sample: GpuSample | None) -> dict[str, Any]:
    """Every reading field (all ``null`` before the first sweep), plus decoded clock event reasons."""
    fields = dataclasses.asdict(sample if sample is not None else GpuSample(-1))
    fields.pop("index")
    mask = fields["clock_event_reasons"]
    fields["clock_event_reason_names"] = None if mask is None else [r.name for r in decode_reasons(mask)]
    fields["reading"] = sample is not None
    return fields


def _health_fields(health: GpuHealth | None) -> dict[str, Any]:
    if health is None:
        return {"status": "unknown", "reasons": []}
    return {
        "status": health.status.value,
        "reasons": [
            {"status": finding.status.value, "kind": finding.kind, "text": finding.text}
            for finding in health.findings
        ],
    }


def event_json(event: GpuEvent) -> dict[str, Any]:
    """One event, with the XID catalog's meaning and advice for an XID."""
    result: dict[str, Any] = {
        "time_s": event.time_s,
        "gpu": event.gpu_index,
        "kind": event.kind,
        "severity": event.severity,
        "code": event.code,
        "message": event.message,
    }
    if event.kind == "xid" and event.code is not None:
        xid = xid_info(event.code)
        result["meaning"] = xid.meaning
        result["action"] = xid.action
        result["severity"] = xid.severity
    return result


def snapshot_json(store: Store, now: Callable[[], float], idle: Sequence[IdleAllocation] = ()) -> dict[str, Any]:
    """The document ``/api/snapshot.json`` serves; health is judged at ``now()`` (the server's one clock: a replay's
    is the recording's end); ``idle``: the allocations idle long enough (health warnings)."""
    inventory = store.inventory
    latest: Snapshot | None = store.latest()
    events = store.events()
    health = {item.index: item for item in evaluate(inventory, latest, events, now(), idle=idle)}
    samples = {sample.index: sample for sample in latest.gpus} if latest is not None else {}
    usage = latest.usage if latest is not None else None
    usages = {gpu.index: gpu for gpu in usage.gpus} if usage is not None else {}
    gpus = []
    for info in inventory.gpus:
        entry: dict[str, Any] = {"index": info.index}
        entry.update(add_clear_names(_info_fields(info)))
        entry.update(add_clear_names(_sample_fields(samples.get(info.index))))
        entry["health"] = _health_fields(health.get(info.index))
        entry["mig"] = mig_json(usages.get(info.index))
        gpus.append(entry)
    host = dataclasses.asdict(latest.host) if latest is not None else None
    if host is not None:
        host.update(
            hostname=inventory.host.hostname,
            cpu_count=inventory.host.cpu_count,
        )
    return {
        "time_s": latest.time_s if latest is not None else None,
        "hostname": inventory.host.hostname,
        "driver_version": inventory.driver_version,
        "simulated": inventory.simulated,
        "nvml_error": inventory.nvml_error,
        "gpus": gpus,
        "host": host,
        "topology": [list(row) for row in inventory.topology],
        "events": [event_json(event) for event in reversed(events[-RECENT_EVENTS:])],
        "deprecated_aliases": deprecated_aliases(),
    }
