"""CSV in the layout of ``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``, written and read.

An export written here reads unchanged in scripts made for nvidia-smi's logs, and a log nvidia-smi wrote (a single
query or a ``-l``/``-lms`` loop) imports into the history's raw columns. Pure: no database, no files, no clock.

What nvidia-smi writes (its ``--help-query-gpu`` text and logs from drivers 515 to 595):

- One header line: the queried fields joined by ``", "``. A field with a unit carries it in brackets
  (``utilization.gpu [%]``, ``memory.used [MiB]``, ``power.draw [W]``, ``clocks.current.sm [MHz]``); the others
  have none (``temperature.gpu``, ``pstate``, ``clocks_event_reasons.active``, the ECC counts). An aliased field
  is named by its long form: a query for ``gpu_name,clocks.gr,clocks.mem`` prints ``name,
  clocks.current.graphics [MHz], clocks.current.memory [MHz]``.
- ``nounits`` drops the units from the values only; the header keeps them. ``noheader`` drops the header.
- Then one line per GPU per query, the values joined by ``", "`` and never quoted (names hold spaces):
  ``2024/06/01 11:27:05.177, NVIDIA A100-SXM4-40GB, 00000000:3B:00.0, 545.23.08, P0, 4, 44, 0 %, 40960 MiB, ...``.
- ``timestamp`` is ``YYYY/MM/DD HH:MM:SS.mmm`` in local time, with no zone. Percentages, MiB, MHz and degrees C
  are integers (``45 %``, ``1234 MiB``, ``1980 MHz``, ``36``), watts have two decimals (``70.50 W``), the
  performance state is ``P0``, the event-reason bitmask is 16 upper-case hex digits (``0x0000000000000004``,
  ``0x00000000000001FF``), PCIe generation and width and the ECC counts are plain integers.
- A value the GPU cannot give is bracketed: ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``,
  ``[Insufficient Permissions]``, ``[GPU requires reset]``; hand-made logs also write a bare ``N/A``.
- ``-l``/``-lms`` loops print the header once, then every round's lines. Runs appended to one file repeat it,
  and on Linux the XID and ECC event messages nvidia-smi prints between rounds land in the log too.
- ``memory.used`` excludes ``memory.reserved`` where the driver reports it, and ``memory.free`` is what is left
  (``nvidia-smi -q``: Total 40960, Reserved 620, Used 4, Free 40334 MiB, each floored from bytes; nvdash
  subtracts the floored figures, so that a re-export is identical: see ``_free_mib``).
- Names are written as they are, unquoted like nvidia-smi's, so a comma in one would shift the columns.
- ``enforced.power.limit`` is the enforced limit (``power_limit_w``), ``power.limit`` the requested management limit
  (``power_management_limit_w``): two figures, kept apart both ways.

Readings nvidia-smi has no query field for are written and read under ``nvdash.`` names
(``nvdash.violation_time.power [ns]``, ``nvdash.gpm.fp64_active [%]``, ``nvdash.nvlink.errors.crc_flit``), only when
asked for; a log without them imports with those readings unknown.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from enum import Enum
from typing import Any

from nvdash.sampling.records import GpuInfo

MIB = 1 << 20
SEPARATOR = ", "
UNKNOWN = "[N/A]"
"""How a value nobody knows is written."""


class Kind(Enum):
    """How a field's value is written and read."""

    TIMESTAMP = "timestamp"
    INDEX = "index"
    TEXT = "text"
    PERCENT = "percent"
    MIB = "mib"
    FREE_MIB = "free mib"
    """``memory.free``: derived on export, not imported."""
    CELSIUS = "celsius"
    WATTS = "watts"
    MHZ = "mhz"
    COUNT = "count"
    NANOSECONDS = "ns"
    """A time counter in whole nanoseconds (``1234 ns``)."""
    PSTATE = "pstate"
    BITMASK = "bitmask"


@dataclass(frozen=True, slots=True)
class Field:
    """One nvidia-smi query field: its names, unit, value kind and the raw column it maps to."""

    name: str
    """The canonical name: the one nvidia-smi prints in the header."""
    kind: Kind
    column: str | None
    """The raw history column (or the identity key: ``time``, ``index``, ``name``, ``uuid``, ``pci_bus_id``,
    ``driver_version``); ``None`` for ``memory.free``."""
    unit: str | None = None
    """The unit in the header's brackets and after each value."""
    aliases: tuple[str, ...] = ()
    fallback: bool = False
    """Imported only when the header has no other field for the same column (``power.draw.instant`` gives way to
    ``power.draw``)."""

    def header(self, units: bool = True) -> str:
        """The header cell: ``memory.used [MiB]``, or the bare name."""
        return f"{self.name} [{self.unit}]" if units and self.unit else self.name


_VALUE_UNITS: dict[Kind, tuple[str, ...]] = {
    Kind.PERCENT: ("%",),
    Kind.MIB: ("MiB", "MB"),
    Kind.CELSIUS: ("C",),
    Kind.WATTS: ("W",),
    Kind.MHZ: ("MHz",),
    Kind.COUNT: ("x",),
    Kind.NANOSECONDS: ("ns",),
}
"""The unit suffixes accepted after a number on import (``x``: a link width as ``nvidia-smi -q`` writes it)."""

_IDENTITY = ("time", "index", "name", "uuid", "pci_bus_id", "driver_version")
NVDASH_PREFIX = "nvdash."
"""Fields nvidia-smi's ``--query-gpu`` has no name for (NVML's violation times, GPM's FP pipes, NVLink error
totals) are named under this prefix, so that no nvidia-smi field is ever mistaken for one."""

FIELDS: tuple[Field, ...] = (
    Field("timestamp", Kind.TIMESTAMP, "time"),
    Field("index", Kind.INDEX, "index"),
    Field("name", Kind.TEXT, "name", aliases=("gpu_name",)),
    Field("uuid", Kind.TEXT, "uuid", aliases=("gpu_uuid",)),
    Field("pci.bus_id", Kind.TEXT, "pci_bus_id", aliases=("gpu_bus_id",)),
    Field("driver_version", Kind.TEXT, "driver_version"),
    Field("utilization.gpu", Kind.PERCENT, "utilization_pct", "%"),
    Field("utilization.memory", Kind.PERCENT, "memory_utilization_pct", "%"),
    Field("memory.total", Kind.MIB, "memory_total_bytes", "MiB"),
    Field("memory.reserved", Kind.MIB, "memory_reserved_bytes", "MiB"),
    Field("memory.used", Kind.MIB, "memory_used_bytes", "MiB"),
    Field("memory.free", Kind.FREE_MIB, None, "MiB"),
    Field("temperature.gpu", Kind.CELSIUS, "temperature_c"),
    Field("temperature.memory", Kind.CELSIUS, "memory_temperature_c"),
    Field("fan.speed", Kind.PERCENT, "fan_speed_pct", "%"),
    Field("power.draw", Kind.WATTS, "power_w", "W"),
    Field("power.draw.average", Kind.WATTS, "power_w", "W", fallback=True),
    Field("power.draw.instant", Kind.WATTS, "power_w", "W", fallback=True),
    Field("enforced.power.limit", Kind.WATTS, "power_limit_w", "W"),
    Field("power.limit", Kind.WATTS, "power_management_limit_w", "W"),
    Field("pstate", Kind.PSTATE, "pstate"),
    Field("clocks.current.graphics", Kind.MHZ, "clock_graphics_mhz", "MHz", ("clocks.gr",)),
    Field("clocks.current.sm", Kind.MHZ, "clock_sm_mhz", "MHz", ("clocks.sm",)),
    Field("clocks.current.memory", Kind.MHZ, "clock_memory_mhz", "MHz", ("clocks.mem",)),
    Field("clocks.current.video", Kind.MHZ, "clock_video_mhz", "MHz", ("clocks.video",)),
    Field("clocks_event_reasons.active", Kind.BITMASK, "clock_event_reasons",
          aliases=("clocks_throttle_reasons.active",)),
    Field("pcie.link.gen.current", Kind.COUNT, "pcie_generation_current"),
    Field("pcie.link.gen.gpucurrent", Kind.COUNT, "pcie_generation_current", fallback=True),
    Field("pcie.link.width.current", Kind.COUNT, "pcie_width_current"),
    Field("ecc.errors.corrected.volatile.total", Kind.COUNT, "ecc_corrected_volatile"),
    Field("ecc.errors.uncorrected.volatile.total", Kind.COUNT, "ecc_uncorrected_volatile"),
    Field("ecc.errors.corrected.aggregate.total", Kind.COUNT, "ecc_corrected_aggregate"),
    Field("ecc.errors.uncorrected.aggregate.total", Kind.COUNT, "ecc_uncorrected_aggregate"),
    Field("retired_pages.single_bit_ecc.count", Kind.COUNT, "retired_pages_sbe", aliases=("retired_pages.sbe",)),
    Field("retired_pages.double_bit.count", Kind.COUNT, "retired_pages_dbe", aliases=("retired_pages.dbe",)),
    Field("utilization.encoder", Kind.PERCENT, "encoder_utilization_pct", "%"),
    Field("utilization.decoder", Kind.PERCENT, "decoder_utilization_pct", "%"),
    *(Field(f"{NVDASH_PREFIX}violation_time.{policy}", Kind.NANOSECONDS, f"violation_{policy}_ns", "ns")
      for policy in ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")),
    *(Field(f"{NVDASH_PREFIX}gpm.{pipe}_active", Kind.PERCENT, f"gpm_{pipe}_active_pct", "%")
      for pipe in ("fp64", "fp32", "fp16")),
    *(Field(f"{NVDASH_PREFIX}nvlink.errors.{counter}", Kind.COUNT, f"nvlink_{counter}_errors")
      for counter in ("crc_flit", "crc_data", "replay", "recovery")),
)
"""Every field nvdash writes and reads, in a sensible export order."""

SUPPORTED_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS)
_BY_NAME: dict[str, Field] = {name: f for f in FIELDS for name in (f.name, *f.aliases)}


def resolve_field(name: str) -> Field:
    """The field a canonical name or an nvidia-smi alias names; ``ValueError`` for any other name."""
    spec = _BY_NAME.get(name.strip())
    if spec is None:
        raise ValueError(f"unknown nvidia-smi field {name!r}; supported: {', '.join(SUPPORTED_FIELDS)}")
    return spec


def _resolve_all(fields: Sequence[str]) -> list[Field]:
    if isinstance(fields, str):
        raise TypeError("fields must be a sequence of field names, not one string")
    return [resolve_field(name) for name in fields]


# ---------------------------------------------------------------------------------------------------- writing


def format_header(fields: Sequence[str], units: bool = True) -> str:
    """The header nvidia-smi prints for a ``--query-gpu`` of ``fields`` (aliases print their long name).

    nvidia-smi keeps the units in the header even under ``nounits``; ``units=False`` writes bare names.
    """
    return SEPARATOR.join(spec.header(units) for spec in _resolve_all(fields))


def format_row(fields: Sequence[str], time_s: float, info: GpuInfo, values: Mapping[str, Any],
               driver_version: str | None, *, units: bool = True, tz: tzinfo | None = None) -> str:
    """One GPU's line for ``fields``; ``values`` maps raw columns to values (missing or ``None``: ``[N/A]``).

    The time is written to the millisecond (``round(time_s * 1000)``) in local time, or in ``tz``.
    ``memory.total`` falls back to ``info.memory_total_bytes``; ``memory.free`` is derived from the row.
    """
    cells = []
    for spec in _resolve_all(fields):
        text = _write(spec, time_s, info, values, driver_version, tz=tz)
        if text is None:
            cells.append(UNKNOWN)
        elif units and spec.unit:
            cells.append(f"{text} {spec.unit}")
        else:
            cells.append(text)
    return SEPARATOR.join(cells)


def format_timestamp(time_s: float, tz: tzinfo | None = None) -> str:
    """``YYYY/MM/DD HH:MM:SS.mmm`` for epoch seconds, rounded to the nearest millisecond, local or in ``tz``."""
    seconds, millis = divmod(round(time_s * 1000), 1000)
    return f"{datetime.fromtimestamp(seconds, tz):%Y/%m/%d %H:%M:%S}.{millis:03d}"


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _write(spec: Field, time_s: float, info: GpuInfo, values: Mapping[str, Any], driver_version: str | None,
           *, tz: tzinfo | None) -> str | None:
    kind = spec.kind
    if kind is Kind.TIMESTAMP:
        return format_timestamp(time_s, tz)
    if kind is Kind.INDEX:
        return str(info.index)
    if kind is Kind.TEXT:
        text = {"name": info.name, "uuid": info.uuid, "pci_bus_id": info.pci_bus_id,
                "driver_version": driver_version}[str(spec.column)]
        return text or None
    if kind is Kind.FREE_MIB:
        return _free_mib(info, values)
    value: Any = values.get(str(spec.column))
    if value is None and spec.column == "memory_total_bytes":
        value = info.memory_total_bytes
    if not _known(value):
        return None
    if kind is Kind.MIB:
        return str(int(value) // MIB)
    if kind is Kind.WATTS:
        return f"{float(value):.2f}"
    if kind is Kind.PSTATE:
        return f"P{int(value)}"
    if kind is Kind.BITMASK:
        return f"0x{int(value):016X}"
    if kind in (Kind.COUNT, Kind.NANOSECONDS):
        return str(int(value))
    return str(round(float(value)))  # percent, degrees C, MHz: integers


def _free_mib(info: GpuInfo, values: Mapping[str, Any]) -> str | None:
    """Total - used - reserved in whole MiB, each floored first: the written figures add up, and a re-export of an
    import writes the same number (nvidia-smi floors the byte difference, which can be up to 2 MiB lower)."""
    total: Any = values.get("memory_total_bytes")
    if total is None:
        total = info.memory_total_bytes
    used: Any = values.get("memory_used_bytes")
    if not (_known(total) and _known(used)):
        return None
    reserved: Any = values.get("memory_reserved_bytes")
    free = int(total) // MIB - int(used) // MIB - (int(reserved) // MIB if _known(reserved) else 0)
    return str(max(free, 0))


# ---------------------------------------------------------------------------------------------------- reading


@dataclass(slots=True)
class LogRow:
    """One GPU's reading from a log line: its identity and the raw columns its header named."""

    line: int
    time_s: float
    index: int | None
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    driver_version: str | None
    values: dict[str, Any]
    """Raw column to value in the history's units; ``None`` where the log says the value is unknown. A column
    whose field the header lacks is absent."""


@dataclass(slots=True)
class ParsedLog:
    """What ``parse_csv`` read: the fields, the good rows, the bad lines and the fields it could not keep."""

    fields: list[str] = field(default_factory=list)
    """Every header's fields in order of first appearance: canonical names, unknown ones as written."""
    rows: list[LogRow] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    """(1-based line number, one-line reason) for each line skipped."""
    ignored_fields: list[str] = field(default_factory=list)
    """Fields nvidia-smi has that nvdash does not keep (``pcie.link.gen.max``), in order of first appearance."""


_HEADER_CELL = re.compile(r"^([a-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)(?:\s*\[[^\]]*\])?$")
_NUMBER = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)$")
_INTEGER = re.compile(r"^(\d+)\s*([A-Za-z%]*)$")
_PSTATE = re.compile(r"^P(\d{1,2})$")
_TIMESTAMP = re.compile(r"^(\d{4})/(\d{1,2})/(\d{1,2}) (\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?$")


class _BadValue(ValueError):
    """A cell that does not parse; the message is the reason."""


@dataclass(slots=True)
class _Section:
    """The rows under one header: which field each column holds, or why the header cannot be used."""

    line: int
    columns: list[Field | None]
    """Per column: the field, or ``None`` for a column that is not imported (unknown, ``memory.free``, or a
    fallback field whose column another field of the header gives)."""
    problem: str | None = None
    skipped: int = 0


MAX_LINE_CHARS = 64 * 1024
"""A line longer than this is skipped as bad (nvidia-smi's longest, every field queried, is under 2 KiB)."""


class LogReader:
    """Reads an nvidia-smi log line by line, yielding its rows as it goes: memory stays that of one line, whatever
    the log's length. The fields, the first ``max_errors`` bad lines and their count are kept on the reader.
    """

    def __init__(self, tz: tzinfo | None = None, max_errors: int | None = None) -> None:
        self.tz = tz
        self.max_errors = max_errors
        self.fields: list[str] = []
        self.ignored_fields: list[str] = []
        self.errors: list[tuple[int, str]] = []
        """The first ``max_errors`` bad lines, by line number: (1-based line number, one-line reason)."""
        self.error_count = 0
        self.header_seen = False

    def _error(self, number: int, reason: str) -> None:
        self.error_count += 1
        bisect.insort(self.errors, (number, reason), key=lambda error: error[0])
        if self.max_errors is not None and len(self.errors) > self.max_errors:
            self.errors.pop()

    def rows(self, lines: Iterable[str]) -> Iterator[LogRow]:
        """The good rows of ``lines``, in order. Every header line starts a section with its own fields; bad lines
        are recorded and skipped. Raises ``ValueError`` at the end when there was no header at all (a log written
        with ``noheader``)."""
        log = ParsedLog(fields=self.fields, ignored_fields=self.ignored_fields)
        section: _Section | None = None
        for number, raw in enumerate(lines, start=1):
            if len(raw) >= MAX_LINE_CHARS:
                self._error(number, f"line longer than {MAX_LINE_CHARS // 1024} KiB")
                continue
            text = raw.rstrip("\r\n")
            if number == 1:
                text = text.lstrip("\ufeff")
            if not text.strip():
                continue
            cells = [cell.strip() for cell in text.split(",")]
            header = _header_fields(cells)
            if header is not None:
                self._close(section)
                section = _open(number, cells, header, log)
                self.header_seen = True
                continue
            if section is None:
                self._error(number, "line before the first header")
                continue
            if section.problem is not None:
                section.skipped += 1
                continue
            try:
                row = _row(number, cells, section, self.tz)
            except _BadValue as error:
                self._error(number, str(error))
                continue
            yield row
        self._close(section)
        if section is None:
            raise ValueError("no nvidia-smi header: the log must start with the header line of "
                             "--query-gpu=... --format=csv (it was written with noheader, or is not such a log)")

    def _close(self, section: _Section | None) -> None:
        if section is not None and section.problem is not None:
            self._error(section.line, f"{section.problem}; its {section.skipped} line(s) skipped")


def parse_csv(lines: Iterable[str], tz: tzinfo | None = None) -> ParsedLog:
    """Read a whole nvidia-smi ``--query-gpu`` CSV log (with or without units); timestamps are local, or in ``tz``.

    Bad lines are recorded in ``errors`` and skipped. Raises ``ValueError`` when the input has no header at all.
    :class:`LogReader` reads a log of any length without holding it.
    """
    reader = LogReader(tz)
    rows = list(reader.rows(lines))
    return ParsedLog(fields=reader.fields, rows=rows, errors=reader.errors, ignored_fields=reader.ignored_fields)


def _header_fields(cells: list[str]) -> list[str] | None:
    """The field names of a header line, or ``None`` when the line is not one."""
    names = []
    for cell in cells:
        match = _HEADER_CELL.match(cell)
        if match is None:
            return None
        names.append(match.group(1))
    return names if any(name in _BY_NAME for name in names) else None


def _open(number: int, cells: list[str], names: list[str], log: ParsedLog) -> _Section:
    specs = [_BY_NAME.get(name) for name in names]
    for name, spec in zip(names, specs, strict=True):
        shown = spec.name if spec is not None else name
        if shown not in log.fields:
            log.fields.append(shown)
        if spec is None and name not in log.ignored_fields:
            log.ignored_fields.append(name)
    given = {spec.column for spec in specs if spec is not None and not spec.fallback}
    columns: list[Field | None] = [
        None if spec is None or spec.column is None or (spec.fallback and spec.column in given) else spec
        for spec in specs
    ]
    present = {spec.column for spec in columns if spec is not None}
    problem = None
    if "time" not in present:
        problem = "header has no timestamp field"
    elif not present & {"index", "uuid", "pci_bus_id"}:
        problem = "header has none of index, uuid, pci.bus_id"
    return _Section(number, columns, problem)


def _row(number: int, cells: list[str], section: _Section, tz: tzinfo | None) -> LogRow:
    if len(cells) != len(section.columns):
        raise _BadValue(f"expected {len(section.columns)} values as in the header at line {section.line}, "
                        f"found {len(cells)}")
    identity: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for spec, cell in zip(section.columns, cells, strict=True):
        if spec is None:
            continue
        value = _read(spec, cell, tz)
        column = str(spec.column)
        (identity if column in _IDENTITY else values)[column] = value
    time_s = identity.get("time")
    if time_s is None:
        raise _BadValue("no timestamp")
    if all(identity.get(key) is None for key in ("index", "uuid", "pci_bus_id")):
        raise _BadValue("no GPU identity: index, uuid and pci.bus_id all unknown")
    return LogRow(number, time_s, identity.get("index"), identity.get("uuid"), identity.get("name"),
                  identity.get("pci_bus_id"), identity.get("driver_version"), values)


def is_unknown(cell: str) -> bool:
    """Whether a cell says the value is unknown: ``[N/A]``, ``[Not Supported]``, any bracketed text, ``N/A``."""
    text = cell.strip()
    return not text or (text.startswith("[") and text.endswith("]")) or text.upper() == "N/A"


def _read(spec: Field, cell: str, tz: tzinfo | None) -> Any:
    if is_unknown(cell):
        return None
    kind = spec.kind
    if kind is Kind.TEXT:
        return cell
    if kind is Kind.TIMESTAMP:
        return parse_timestamp(cell, tz)
    if kind is Kind.PSTATE:
        match = _PSTATE.match(cell)
        if match is None or int(match.group(1)) > 15:
            raise _BadValue(f"bad {spec.name} {cell!r}")
        return int(match.group(1))
    if kind is Kind.BITMASK:
        try:
            return int(cell, 16) if cell[:2].lower() == "0x" else int(cell)
        except ValueError:
            raise _BadValue(f"bad {spec.name} {cell!r}") from None
    integral = kind in (Kind.INDEX, Kind.COUNT, Kind.NANOSECONDS)
    match = (_INTEGER if integral else _NUMBER).match(cell)
    if match is None or (match.group(2) and match.group(2) not in _VALUE_UNITS.get(kind, ())):
        raise _BadValue(f"bad {spec.name} {cell!r}")
    if integral:
        return int(match.group(1))
    number = float(match.group(1))
    if kind is Kind.MIB:
        return round(number * MIB)
    return number


def parse_timestamp(text: str, tz: tzinfo | None = None) -> float:
    """Epoch seconds of nvidia-smi's ``YYYY/MM/DD HH:MM:SS.mmm`` (local time, or in ``tz``)."""
    match = _TIMESTAMP.match(text.strip())
    if match is None:
        raise _BadValue(f"bad timestamp {text!r}")
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    try:
        moment = datetime(year, month, day, hour, minute, second)
    except ValueError:
        raise _BadValue(f"bad timestamp {text!r}") from None
    whole = (moment if tz is None else moment.replace(tzinfo=tz)).timestamp()
    return whole + float("0." + (match.group(7) or "0"))
