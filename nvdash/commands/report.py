"""``nvdash report``: the accounting of the history file printed as a table, CSV or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping

from nvdash.accounting.report import (
    AccountingBook,
    accounting_range,
    make_report,
    report_csv,
    report_json,
    report_table,
)
from nvdash.commands.common import history_file
from nvdash.history.query import SqliteHistory
from nvdash.history.ranges import RangeError
from nvdash.server.options import UsageError


def run_report(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Print the report; a bad range is a usage error, an unusable file a ``HistoryError`` (one line each)."""
    history = SqliteHistory(history_file(args.history, environ))
    arguments = {"range": args.range or "", "from": args.start or "", "to": args.end or ""}
    try:
        chosen = accounting_range(arguments, time.time())
    except RangeError as error:
        raise UsageError(str(error)) from None
    with history.reading():  # each of the report's queries within the budget; a failed read is one line
        report = make_report(AccountingBook(connection=history.connection), chosen, args.by)
    if args.format == "json":
        sys.stdout.write(json.dumps(report_json(report), indent=1) + "\n")
    elif args.format == "csv":
        sys.stdout.write(report_csv(report))
    else:
        sys.stdout.write(report_table(report))
    return 0
