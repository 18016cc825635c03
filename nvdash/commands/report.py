"""``nvdash report``: the accounting of the history file, or with ``--prometheus`` of every node exporting its
accounting counters, printed as a table, CSV or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping

from nvdash.accounting.report import (
    AccountingBook,
    Report,
    accounting_range,
    make_report,
    report_csv,
    report_json,
    report_table,
)
from nvdash.commands.common import history_file
from nvdash.history.query import SqliteHistory
from nvdash.history.ranges import RangeError, TimeRange
from nvdash.server.options import UsageError
from nvdash.server.prometheus_options import PrometheusOptionError, prometheus_access

PROJECT = "project"


def run_report(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Print the report; a bad range is a usage error, an unusable file a ``HistoryError``, an unanswering
    Prometheus one line and exit status 1."""
    arguments = {"range": args.range or "", "from": args.start or "", "to": args.end or ""}
    try:
        chosen = accounting_range(arguments, time.time())
    except RangeError as error:
        raise UsageError(str(error)) from None
    if args.prometheus is not None:
        if args.history is not None:
            raise UsageError("give --history or --prometheus, not both")
        report = _prometheus_report(args, environ, chosen)
        if report is None:
            return 1
    else:
        try:
            prometheus_access(args, environ)  # a --prometheus-* option without --prometheus is a usage error
        except PrometheusOptionError as error:
            raise UsageError(str(error)) from None
        history = SqliteHistory(history_file(args.history, environ))
        by = "namespace" if args.by == PROJECT else args.by
        with history.reading():  # each of the report's queries within the budget; a failed read is one line
            report = make_report(AccountingBook(connection=history.connection), chosen, by)
    if args.format == "json":
        sys.stdout.write(json.dumps(report_json(report), indent=1) + "\n")
    elif args.format == "csv":
        sys.stdout.write(report_csv(report))
    else:
        sys.stdout.write(report_table(report))
    return 0


def _prometheus_report(args: argparse.Namespace, environ: Mapping[str, str], chosen: TimeRange) -> Report | None:
    """The cluster's report over ``chosen`` from the Prometheus of ``args`` (``None``: it could not be asked; the
    reason is printed on one line)."""
    from nvdash.cluster.access import Credentials, CredentialsError, tls_context  # noqa: PLC0415 - not for a history
    from nvdash.cluster.accounting import ClusterAccounting  # noqa: PLC0415
    from nvdash.cluster.promapi import PrometheusClient, PrometheusError  # noqa: PLC0415
    from nvdash.server.options import prometheus_url  # noqa: PLC0415

    try:
        access = prometheus_access(args, environ)
    except PrometheusOptionError as error:
        raise UsageError(str(error)) from None
    url = prometheus_url(args.prometheus)
    assert url is not None
    try:
        client = PrometheusClient(url, timeout_s=access.timeout_s, headers=dict(access.headers),
                                  credentials=Credentials(access), tls=tls_context(access))
        rows, truncated = ClusterAccounting(client, access.scope).rows(chosen.start_s, chosen.end_s, args.by)
    except CredentialsError as error:
        raise UsageError(str(error)) from None
    except PrometheusError as error:
        print(f"nvdash: error: {error}", file=sys.stderr)
        return None
    if truncated:
        print("nvdash: warning: Prometheus answered more series than nvdash reads; some rows are missing",
              file=sys.stderr)
    return Report(chosen, args.by, rows, "prometheus")
