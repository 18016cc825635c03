"""``nvdash import FILE``: an nvidia-smi CSV log into the history, saying what was added and what skipped."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO

from nvdash.commands.common import history_file
from nvdash.history import nvsmi_csv
from nvdash.history.csv_io import import_batches
from nvdash.history.database import HistoryError, HistoryLocked
from nvdash.server.options import UsageError

SHOWN_ERRORS = 20
"""Bad lines listed one by one on import; the rest are counted."""


def _read_lines(path: str) -> Iterator[str]:
    """The lines of ``path`` (``-``: standard input), opened now (a missing file fails before the history is
    touched) and read as they are consumed; a line is cut at :data:`nvsmi_csv.MAX_LINE_CHARS` (the reader skips
    it as too long) so one endless line cannot fill memory."""
    try:
        file: IO[str] = sys.stdin if path == "-" else open(path, encoding="utf-8-sig", errors="replace")  # noqa: SIM115
    except OSError as error:
        raise HistoryError(f"cannot read {path}: {error.strerror}") from None
    return _lines_of(file, path)


def _lines_of(file: IO[str], path: str) -> Iterator[str]:
    try:
        while True:
            try:
                line = file.readline(nvsmi_csv.MAX_LINE_CHARS)
                if len(line) == nvsmi_csv.MAX_LINE_CHARS and not line.endswith("\n"):
                    while (rest := file.readline(nvsmi_csv.MAX_LINE_CHARS)) and not rest.endswith("\n"):
                        pass
            except OSError as error:
                raise HistoryError(f"cannot read {path}: {error.strerror}") from None
            if not line:
                return
            yield line
    finally:
        if file is not sys.stdin:
            file.close()



def _when(time_s: float) -> str:
    return datetime.fromtimestamp(time_s).strftime("%Y-%m-%d %H:%M:%S")


def run_import(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``nvdash import FILE``: report what was added and which lines were skipped; 1 when nothing was read."""
    path = history_file(args.history, environ)
    lines = _read_lines(args.file)
    name = "standard input" if args.file == "-" else Path(args.file).name
    try:
        result = import_batches(path, lines, f"import:{name}", max_errors=SHOWN_ERRORS)
    except ValueError as error:
        raise UsageError(f"{args.file}: {error}") from None
    except HistoryLocked as error:
        raise HistoryError(f"{error}: stop it first, or import into another file with --history and replay "
                           "that") from None
    reader, tally = result.reader, result.tally
    for number, reason in reader.errors:
        print(f"nvdash: {args.file}:{number}: skipped: {reason}", file=sys.stderr)
    if reader.error_count > len(reader.errors):
        print(f"nvdash: ... and {reader.error_count - len(reader.errors)} more lines skipped", file=sys.stderr)
    if reader.ignored_fields:
        print(f"nvdash: fields nvdash does not keep were ignored: {', '.join(reader.ignored_fields)}",
              file=sys.stderr)
    if not tally.rows:
        print(f"nvdash: error: {args.file}: no readable reading ({reader.error_count} lines skipped)",
              file=sys.stderr)
        return 1
    gpus = len(tally.identities)
    print(f"nvdash: imported {result.added} readings of {gpus} GPU{'s' if gpus != 1 else ''} "
          f"({_when(tally.first_s)} to {_when(tally.last_s)}) into {path}; {result.present} already there; "
          f"{reader.error_count} lines skipped")
    return 0
