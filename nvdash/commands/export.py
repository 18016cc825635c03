"""``nvdash export``: the history as an nvidia-smi CSV log, on standard output or in a file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import IO

from nvdash.commands.common import history_file
from nvdash.history.csv_io import export_lines
from nvdash.history.database import HistoryError
from nvdash.history.query import SqliteHistory
from nvdash.history.ranges import RangeError, TimeRange, resolve
from nvdash.server.options import UsageError


def run_export(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``nvdash export``: write the CSV to ``--output`` (standard output by default)."""
    history = SqliteHistory(history_file(args.history, environ))
    extent = history.extent()
    if extent is None:
        raise HistoryError(f"{history.path} holds no readings to export")
    arguments = {key: value for key, value in (("range", args.range), ("from", args.start), ("to", args.end))
                 if value}
    try:
        chosen = resolve(arguments, extent[1]) or TimeRange(extent[0], extent[1], "all")
    except RangeError as error:
        raise UsageError(str(error)) from None
    gpus = None
    if args.gpus:
        try:
            gpus = [int(part) for part in args.gpus.split(",") if part.strip()]
        except ValueError:
            raise UsageError(f"--id must be GPU indices separated by commas, not {args.gpus!r}") from None
    try:
        lines = export_lines(history, chosen, fields_text=args.query_gpu or "", layout=args.format, gpus=gpus)
    except ValueError as error:
        raise UsageError(str(error)) from None
    output: IO[str] = sys.stdout if args.output == "-" else _open_output(args.output)
    try:
        for line in lines:
            output.write(line + "\n")
    finally:
        if output is not sys.stdout:
            output.close()
    return 0


def _open_output(path: str) -> IO[str]:
    try:
        return open(path, "w", encoding="utf-8", newline="")
    except OSError as error:
        raise HistoryError(f"cannot write {path}: {error.strerror}") from None
