"""Command-line parsing only: turns arguments and environment into settings and runs the chosen command.

``nvdash [serve] [options]`` serves the dashboards; ``nvdash export``, ``nvdash import FILE``,
``nvdash replay FILE`` and ``nvdash report`` work on the history file. The server's options are parsed by
:mod:`nvdash.server.options`; the commands themselves are in :mod:`nvdash.commands`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from nvdash.server.options import Parser, UsageError, add_history_path, parse_replay, parse_settings
from nvdash.server.prometheus_options import add_prometheus_options

COMMANDS = ("serve", "export", "import", "replay", "report")


def export_parser() -> argparse.ArgumentParser:
    """``nvdash export``: the history as nvidia-smi CSV."""
    parser = Parser(prog="nvdash export",
                     description="Write the history as CSV in the layout of nvidia-smi --query-gpu --format=csv.")
    add_history_path(parser)
    parser.add_argument("--range", default=None, help="how far back from the newest reading, e.g. 1h, 7d")
    parser.add_argument("--from", dest="start", default=None, help="start: ISO 8601 or Unix seconds")
    parser.add_argument("--to", dest="end", default=None, help="end: ISO 8601 or Unix seconds (default: newest)")
    parser.add_argument("--query-gpu", default=None, metavar="FIELDS",
                        help="comma-separated nvidia-smi field names (default: timestamp, index, name, "
                        "utilization.gpu, memory.used, temperature.gpu, power.draw)")
    parser.add_argument("--format", default="csv", help="csv, optionally with ,noheader and ,nounits")
    parser.add_argument("--id", "-i", dest="gpus", default=None, help="comma-separated GPU indices (default all)")
    parser.add_argument("--output", "-o", "-f", default="-", help="file to write (default: standard output)")
    return parser


def import_parser() -> argparse.ArgumentParser:
    """``nvdash import FILE``: an nvidia-smi CSV log into the history."""
    parser = Parser(prog="nvdash import",
                     description="Read a log written by nvidia-smi --query-gpu=... --format=csv into the history.")
    parser.add_argument("file", metavar="FILE", help="the CSV log (- for standard input)")
    add_history_path(parser)
    return parser


def report_parser() -> argparse.ArgumentParser:
    """``nvdash report``: GPU-hours, energy and waste per job, pod, user or namespace."""
    parser = Parser(prog="nvdash report",
                     description="Print GPU-hours, energy, efficiency and idle (wasted) GPU-hours per job, pod, "
                     "user or namespace from the history's accounting, or with --prometheus summed over every node "
                     "that exports its accounting (nvdash --metrics-accounting).")
    add_history_path(parser)
    parser.add_argument("--prometheus", default=None, metavar="URL",
                        help="read the accounting of all nodes from this Prometheus-API endpoint instead of the "
                        "history")
    add_prometheus_options(parser)
    parser.add_argument("--range", default=None,
                        help="today, or how far back from now, e.g. 24h, 7d, 30d (default 7d)")
    parser.add_argument("--from", dest="start", default=None, help="start: ISO 8601 or Unix seconds")
    parser.add_argument("--to", dest="end", default=None, help="end: ISO 8601 or Unix seconds (default: now)")
    parser.add_argument("--by", default="job", choices=("job", "pod", "user", "project", "namespace"),
                        help="group by job (Slurm job, pod, container or user's processes), pod, user or "
                        "project (the pod's namespace, else the user's group; also called namespace; default job)")
    parser.add_argument("--format", default="table", choices=("table", "csv", "json"),
                        help="table (default), csv or json")
    return parser



def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``nvdash`` and ``python -m nvdash``; returns the exit status."""
    from nvdash.history.database import HistoryError  # noqa: PLC0415 - keep --help fast

    arguments = list(sys.argv[1:] if argv is None else argv)
    command = arguments[0] if arguments and arguments[0] in COMMANDS else "serve"
    rest = arguments[1:] if arguments and arguments[0] in COMMANDS else arguments
    try:
        if command == "export":
            from nvdash.commands.export import run_export  # noqa: PLC0415

            return run_export(export_parser().parse_args(rest), os.environ)
        if command == "report":
            from nvdash.commands.report import run_report  # noqa: PLC0415

            return run_report(report_parser().parse_args(rest), os.environ)
        if command == "import":
            from nvdash.commands.import_ import run_import  # noqa: PLC0415

            return run_import(import_parser().parse_args(rest), os.environ)
        if command == "replay":
            from nvdash.commands.replay import run_replay  # noqa: PLC0415

            return run_replay(parse_replay(rest, os.environ))
        from nvdash.commands.serve import run_serve  # noqa: PLC0415

        return run_serve(parse_settings(rest, os.environ))
    except (UsageError, HistoryError) as error:
        print(f"nvdash: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
