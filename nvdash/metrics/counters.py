"""Which metric families ``/metrics`` exports: a counters file in dcgm-exporter's own CSV format.

As dcgm-exporter reads it: each line is a CSV record of exactly three fields, ``NAME, type, help`` (spaces
around a field are trimmed; a help text with a comma is quoted); a line starting with ``#`` is a comment; blank
lines are skipped. Types are ``gauge``, ``counter``, ``untyped``, and ``label`` (the field becomes a label of
every series instead of a family, e.g. ``DCGM_FI_DRIVER_VERSION``). A file made for dcgm-exporter works
unchanged: fields nvdash cannot read are reported once and left out.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

TYPES = ("gauge", "counter", "untyped", "label")
DEFAULT_FILE = "default-counters.csv"


class CountersError(ValueError):
    """A counters file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Counter:
    """One exported family as the file names it."""

    name: str
    kind: str
    help: str


def parse_counters(text: str, source: str = "counters file") -> list[Counter]:
    """The families of a counters file, in file order; raises :class:`CountersError` naming the bad line."""
    counters: list[Counter] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.startswith("#"):
            continue
        try:
            (record,) = list(csv.reader([raw], skipinitialspace=True))
        except (csv.Error, ValueError):
            raise CountersError(f"{source}:{number}: not a CSV record: {raw.strip()!r}") from None
        fields = [field.strip(" ") for field in record]
        if len(fields) != 3 or not fields[0]:
            raise CountersError(f"{source}:{number}: expected 3 fields 'NAME, type, help', got {len(fields)}: "
                                f"{raw.strip()!r}")
        name, kind, text_help = fields
        if kind.lower() not in TYPES:
            raise CountersError(f"{source}:{number}: type {kind!r} of {name} is not one of {', '.join(TYPES)}")
        if name in seen:
            continue
        seen.add(name)
        counters.append(Counter(name, kind.lower(), text_help))
    return counters


def default_counters() -> list[Counter]:
    """The shipped default file's families."""
    text = resources.files("nvdash.metrics").joinpath(DEFAULT_FILE).read_text(encoding="utf-8")
    return parse_counters(text, DEFAULT_FILE)


def load_counters(path: str | None) -> list[Counter]:
    """The families of ``path``, or the default file's; raises :class:`CountersError` with one line."""
    if path is None:
        return default_counters()
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as error:
        raise CountersError(f"cannot read counters file {path}: {error.strerror}") from None
    return parse_counters(text, path)
