"""Which metric families ``/metrics`` exports: a counters file in dcgm-exporter's own CSV format.

Each line is ``NAME, type, help`` (``gauge`` or ``counter``); ``#`` starts a comment; blank lines are skipped.
A file made for dcgm-exporter works unchanged: fields nvdash cannot read are reported once and left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

TYPES = ("gauge", "counter")
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
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split(",", 2)]
        if len(parts) < 3 or not parts[0]:
            raise CountersError(f"{source}:{number}: expected 'NAME, gauge|counter, help text', got {line!r}")
        name, kind, text_help = parts
        if kind.lower() not in TYPES:
            raise CountersError(f"{source}:{number}: type {kind!r} of {name} is not gauge or counter")
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
