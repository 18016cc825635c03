"""The GPU quota variables of a process's environment (``/proc/PID/environ``), and nothing else of it.

An environment holds secrets (tokens, passwords): only the variables named in :data:`QUOTA_VARIABLES` (and
``CUDA_DEVICE_MEMORY_LIMIT_<n>``) are kept, the rest is dropped as it is read. The file is read with a bound
(:data:`ENVIRON_MAX_BYTES`); what lies past it is not seen, and a variable cut by the bound is dropped. A value
that does not parse leaves its field ``None`` (or its pair out), never an exception.

Formats, as the tools that read them define them:

- HAMi-core (``CUDA_DEVICE_MEMORY_LIMIT_<n>``, ``CUDA_DEVICE_MEMORY_LIMIT``): bytes with an optional ``k``/``m``/``g``
  suffix in powers of 1024 (``1g`` = ``1024m`` = ``1048576k`` = ``1073741824``); HAMi's device plugin writes MiB,
  e.g. ``3000m``. ``CUDA_DEVICE_SM_LIMIT``: a percentage of each GPU; 0 (or 100) sets no limit.
- MPS: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` a percentage (may have decimals); ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  ``ordinal=value`` pairs separated by commas, values with an ``M`` or ``G`` suffix (``0=1G,1=512M``).
- ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``: kept only when every entry is a ``GPU-`` or ``MIG-`` UUID.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

from nvdash.sampling.bounded_read import read_bounded_or_none
from nvdash.sampling.usage_records import ProcessLimits

ENVIRON_MAX_BYTES = 1 << 20
"""Read at most 1 MiB of an environment (Linux caps argv plus environment near 2 MiB by default)."""
MAX_ORDINALS = 64
"""Device ordinals above this are not believed (no node has that many GPUs)."""
MEMORY_LIMIT_PREFIX = "CUDA_DEVICE_MEMORY_LIMIT"
QUOTA_VARIABLES = frozenset({
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", MEMORY_LIMIT_PREFIX,
    "CUDA_DEVICE_SM_LIMIT", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
})
_MAX_VALUE_CHARS = 4096
_SIZE = re.compile(r"([0-9]{1,20})([kmg]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]{1,100}")


def _wanted(name: str) -> bool:
    if name in QUOTA_VARIABLES:
        return True
    suffix = name[len(MEMORY_LIMIT_PREFIX) + 1:]
    return name.startswith(MEMORY_LIMIT_PREFIX + "_") and suffix.isdigit() and len(suffix) <= 2


def quota_variables(environ: bytes, *, truncated: bool = False) -> dict[str, str]:
    """The quota variables of a raw ``environ`` (NUL-separated ``NAME=value``); the rest is never kept.

    With ``truncated`` the last entry (cut by the read's bound) is dropped. Undecodable bytes, entries without ``=``
    and overlong values are skipped; a name given twice keeps its first value (as ``getenv`` finds it).
    """
    entries = environ.split(b"\0")
    if truncated and not environ.endswith(b"\0"):
        entries = entries[:-1]
    found: dict[str, str] = {}
    for entry in entries:
        name, sep, value = entry.partition(b"=")
        if not sep or len(value) > _MAX_VALUE_CHARS:
            continue
        try:
            key = name.decode("ascii")
        except UnicodeDecodeError:
            continue
        if _wanted(key) and key not in found:
            try:
                found[key] = value.decode("ascii").strip()
            except UnicodeDecodeError:
                continue
    return found


def parse_size(text: str) -> int | None:
    """``1g``, ``1024m``, ``1048576k``, ``1073741824`` (also ``512M``, ``2GB``, ``2GiB``) -> bytes; ``None`` when it
    is not a size or is zero."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return None
    value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    return value if 0 < value < 1 << 62 else None


def parse_percent(text: str, *, zero_is_none: bool = False) -> float | None:
    """A percentage in (0, 100]; ``None`` for anything else (and for 0 with ``zero_is_none``)."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0 or value > 100 or (value == 0 and zero_is_none):
        return None
    return value


def parse_pinned_limits(text: str) -> tuple[tuple[int, int], ...]:
    """``0=1G,1=512M`` -> ((0, 1 GiB), (1, 512 MiB)); a pair that does not parse is left out."""
    pairs: dict[int, int] = {}
    for item in text.split(",")[:MAX_ORDINALS]:
        ordinal, sep, size = item.partition("=")
        ordinal = ordinal.strip()
        value = parse_size(size) if sep else None
        if value is None or not ordinal.isdigit() or int(ordinal) >= MAX_ORDINALS:
            continue
        pairs.setdefault(int(ordinal), value)
    return tuple(sorted(pairs.items()))


def parse_visible(text: str | None) -> tuple[str, ...]:
    """The UUIDs of a ``*_VISIBLE_DEVICES`` value in order; empty unless every entry is a GPU or MIG UUID."""
    if not text:
        return ()
    entries = [entry.strip() for entry in text.split(",")]
    if len(entries) > MAX_ORDINALS or not all(_UUID.fullmatch(entry) for entry in entries):
        return ()
    return tuple(entries)


def limits_of(variables: Mapping[str, str]) -> ProcessLimits:
    """What the quota variables say (see the module docstring for the formats)."""
    visible = parse_visible(variables.get("CUDA_VISIBLE_DEVICES")) or parse_visible(
        variables.get("NVIDIA_VISIBLE_DEVICES"))
    memory: dict[int, int] = {}
    for name, value in variables.items():
        if name.startswith(MEMORY_LIMIT_PREFIX + "_") and (size := parse_size(value)) is not None:
            memory[int(name[len(MEMORY_LIMIT_PREFIX) + 1:])] = size
    every = parse_size(variables.get(MEMORY_LIMIT_PREFIX, ""))
    if every is not None:
        for ordinal in range(max(1, len(visible))):
            memory.setdefault(ordinal, every)
    sm = parse_percent(variables.get("CUDA_DEVICE_SM_LIMIT", ""), zero_is_none=True)
    return ProcessLimits(
        mps_thread_pct=parse_percent(variables.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", ""), zero_is_none=True),
        mps_pinned_memory_bytes=parse_pinned_limits(variables.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")),
        hami_memory_bytes=tuple(sorted(memory.items())),
        hami_core_pct=None if sm == 100 else sm,
        visible_devices=visible,
    )


def read_limits(proc_root: Path | str, pid: int, *, follow_links: bool = False) -> ProcessLimits | None:
    """The quota variables of ``pid``'s environment; ``None`` when it cannot be read (gone, not permitted)."""
    data = read_bounded_or_none(f"{proc_root}/{pid}/environ", ENVIRON_MAX_BYTES, truncate=True,
                                follow_links=follow_links)
    if data is None:
        return None
    return limits_of(quota_variables(data, truncated=len(data) >= ENVIRON_MAX_BYTES))
