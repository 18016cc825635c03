"""``/api/accounting.json`` and ``/api/accounting.csv``: the accounting report over HTTP, read off the event loop.

``?range=today|7d|30d|<duration>`` or ``from=``/``to=`` (ISO 8601 or Unix seconds), ``by=job|pod|user|namespace``.
A bad request is a 400 with a one-line error.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import Executor

from tornado.ioloop import IOLoop

from nvdash.accounting.report import AccountingBook, Report, accounting_range, make_report, report_csv, report_json
from nvdash.history.database import HistoryError
from nvdash.history.ranges import RangeError
from nvdash.server.auth import GuardedHandler

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def csv_filename(report: Report, prefix: str = "nvdash-accounting") -> str:
    """The download's file name; characters a file name or a header should not hold become ``_``."""
    return _UNSAFE.sub("_", f"{prefix}-{report.by}-{report.range.label}") + ".csv"


class ReportHandler(GuardedHandler):
    """A guarded handler answering an accounting report; the subclass says where the report comes from."""

    csv_prefix = "nvdash-accounting"

    async def _report(self) -> Report | None:
        """The report asked for, or ``None`` after answering an error."""
        raise NotImplementedError

    def _error(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))


class JsonReportHandler(ReportHandler):
    """The report as JSON."""

    async def get(self) -> None:
        report = await self._report()
        if report is None:
            return
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(report_json(report)))


class CsvReportHandler(ReportHandler):
    """The report's rows as a CSV download."""

    async def get(self) -> None:
        report = await self._report()
        if report is None:
            return
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="{csv_filename(report, self.csv_prefix)}"')
        self.finish(report_csv(report))


class _AccountingHandler(ReportHandler):
    def initialize(self, book: AccountingBook, executor: Executor) -> None:
        self._book = book
        self._executor = executor

    async def _report(self) -> Report | None:
        arguments = {name: self.get_query_argument(name, "") for name in ("range", "from", "to")}
        by = self.get_query_argument("by", "") or "job"
        try:
            chosen = accounting_range(arguments, self._book.clock())
            return await IOLoop.current().run_in_executor(self._executor, make_report, self._book, chosen, by)
        except RangeError as error:
            self._error(400, str(error))
        except HistoryError as error:
            self._error(503, str(error))
        return None


class AccountingJsonHandler(_AccountingHandler, JsonReportHandler):
    """``GET /api/accounting.json``."""


class AccountingCsvHandler(_AccountingHandler, CsvReportHandler):
    """``GET /api/accounting.csv``: the rows as a CSV download."""
