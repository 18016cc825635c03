"""``/api/cluster-accounting.json`` and ``.csv``: the cluster's accounting (every node's counters summed through
Prometheus) over HTTP, asked off the event loop, behind the same guard as ``/api/accounting.csv``.

``?range=today|7d|30d|<duration>`` or ``from=``/``to=``, ``by=job|pod|user|project``. A bad request is a 400, a
Prometheus that cannot answer a 503, each with a one-line error.
"""

from __future__ import annotations

import time
from typing import Any

from tornado.ioloop import IOLoop
from tornado.web import RequestHandler

from nvdash.accounting.report import Report
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.accounting_report import cluster_range, cluster_report
from nvdash.cluster.promapi import PrometheusError
from nvdash.history.ranges import RangeError
from nvdash.server.accounting_api import CsvReportHandler, JsonReportHandler, ReportHandler


class _ClusterAccountingHandler(ReportHandler):
    csv_prefix = "nvdash-cluster-accounting"

    def initialize(self, cluster: ClusterRuntime) -> None:
        self._cluster = cluster

    async def _report(self) -> Report | None:
        arguments = {name: self.get_query_argument(name, "") for name in ("range", "from", "to")}
        try:
            chosen, by = cluster_range(arguments, self.get_query_argument("by", "") or "job", time.time())
            return await IOLoop.current().run_in_executor(self._cluster.executor, cluster_report, self._cluster,
                                                          chosen, by)
        except RangeError as error:
            self._error(400, str(error))
        except PrometheusError as error:
            self._error(503, str(error))
        return None


class ClusterAccountingJsonHandler(_ClusterAccountingHandler, JsonReportHandler):
    """``GET /api/cluster-accounting.json``."""


class ClusterAccountingCsvHandler(_ClusterAccountingHandler, CsvReportHandler):
    """``GET /api/cluster-accounting.csv``: the rows as a CSV download."""


def cluster_accounting_routes(cluster: ClusterRuntime | None) -> list[tuple[str, type[RequestHandler], dict[str, Any]]]:
    """The two routes, on a server with ``--prometheus`` (none without)."""
    if cluster is None:
        return []
    return [(r"/api/cluster-accounting\.json", ClusterAccountingJsonHandler, {"cluster": cluster}),
            (r"/api/cluster-accounting\.csv", ClusterAccountingCsvHandler, {"cluster": cluster})]
