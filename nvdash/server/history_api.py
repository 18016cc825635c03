"""``/api/history.json`` and ``/export.csv``: the history over HTTP, queried off the event loop.

``/api/history.json?metric=NAME&range=6h`` (or ``from``/``to`` as ISO 8601 or Unix seconds; optional ``gpu=0,1``
and ``step=60`` or ``step=1m``) answers one series per GPU (or one for a host metric) with each bucket's min,
mean and max; ``null`` where nothing was recorded. A bad request is a 400 with a one-line ``error``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from tornado.ioloop import IOLoop
from tornado.web import RequestHandler

from nvdash.history.catalog import METRICS
from nvdash.history.database import HistoryError
from nvdash.history.query import HistoryResult
from nvdash.history.ranges import RangeError, TimeRange, parse_duration, resolve
from nvdash.server.auth import GuardedHandler
from nvdash.server.history_setup import HistoryRuntime

DEFAULT_RANGE = "1h"


class BadRequest(ValueError):
    """A request the API refuses with 400; the message is one line."""


def _number_list(values: list[float]) -> list[float | None]:
    return [None if math.isnan(value) else value for value in values]


def result_json(result: HistoryResult, metric: str) -> dict[str, Any]:
    """One metric of a result as JSON: range, step, resolution and a series per GPU."""
    series = []
    for gpu, data in sorted(result.series[metric].items(), key=lambda item: -1 if item[0] is None else item[0]):
        series.append({
            "gpu": gpu,
            "time_s": data.time_s.tolist(),
            "min": _number_list(data.minimum.tolist()),
            "mean": _number_list(data.mean.tolist()),
            "max": _number_list(data.maximum.tolist()),
        })
    return {
        "metric": metric,
        "unit": METRICS[metric].unit,
        "from": result.start_s,
        "to": result.end_s,
        "step_s": result.step_s,
        "resolution": result.resolution,
        "series": series,
    }


def request_range(handler: RequestHandler, now_s: float, default: str = DEFAULT_RANGE) -> TimeRange:
    """The range a request names (``range=`` or ``from=``/``to=``); ``BadRequest`` when unreadable."""
    arguments = {name: handler.get_query_argument(name, "") for name in ("range", "from", "to")}
    try:
        chosen = resolve({key: value for key, value in arguments.items() if value}, now_s, default=default)
    except RangeError as error:
        raise BadRequest(str(error)) from None
    if chosen is None:
        raise BadRequest("range=live has no history to return; choose a range such as 1h")
    return chosen


def _gpus(text: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadRequest(f"gpu must be GPU indices separated by commas, not {text!r}") from None


def _step(text: str) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text)
    except RangeError as error:
        raise BadRequest(f"step: {error}") from None


class HistoryJsonHandler(GuardedHandler):
    """``GET /api/history.json``."""

    def initialize(self, history: HistoryRuntime) -> None:
        self._history = history

    def _send(self, status: int, body: dict[str, Any]) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    async def get(self) -> None:
        backend = self._history.backend
        if backend is None:
            self._send(404, {"error": f"history is {self._history.status}"})
            return
        try:
            metric = self.get_query_argument("metric", "")
            if not metric:
                raise BadRequest(f"name a metric with metric=; known metrics: {', '.join(METRICS)}")
            if metric not in METRICS:
                raise BadRequest(f"unknown metric {metric!r}; known metrics: {', '.join(METRICS)}")
            chosen = request_range(self, self._history.clock())
            gpus = _gpus(self.get_query_argument("gpu", ""))
            step = _step(self.get_query_argument("step", ""))

            def run() -> HistoryResult:
                return backend.query([metric], chosen.start_s, chosen.end_s, gpus=gpus, step_s=step)

            result = await IOLoop.current().run_in_executor(self._history.executor, run)
        except (BadRequest, ValueError) as error:
            self._send(400, {"error": str(error)})
            return
        except HistoryError as error:
            self._send(503, {"error": str(error)})
            return
        self._send(200, result_json(result, metric))


class ExportCsvHandler(GuardedHandler):
    """``GET /export.csv``: the history as an nvidia-smi CSV log (same options as ``nvdash export``)."""

    def initialize(self, history: HistoryRuntime, export: Callable[[HistoryRuntime, TimeRange, str, str,
                                                                    list[int] | None], str]) -> None:
        self._history = history
        self._export = export

    async def get(self) -> None:
        history = self._history
        if history.backend is None or history.path is None:
            self.set_status(404)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"history is {history.status}\n")
            return
        try:
            chosen = request_range(self, history.clock())
            fields = self.get_query_argument("query-gpu", "") or self.get_query_argument("fields", "")
            layout = self.get_query_argument("format", "csv")
            gpus = _gpus(self.get_query_argument("gpu", ""))
            text = await IOLoop.current().run_in_executor(
                history.executor, lambda: self._export(history, chosen, fields, layout, gpus))
        except (BadRequest, ValueError) as error:
            self.set_status(400)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"{error}\n")
            return
        except HistoryError as error:
            self.set_status(503)
            self.set_header("Content-Type", "text/plain; charset=utf-8")  # names the file: never HTML
            self.finish(f"{error}\n")
            return
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="nvdash-export.csv"')
        self.finish(text)


def history_health(history: HistoryRuntime) -> dict[str, Any]:
    """The history's part of ``/health``: what it does, and the writer's counts when writing."""
    result: dict[str, Any] = {"status": history.status, "replay": history.replay,
                              "path": None if history.path is None else str(history.path)}
    writer = history.writer
    if writer is not None:
        stats = writer.stats
        result.update(snapshots=stats.snapshots, events=stats.events, batches=stats.batches, dropped=stats.dropped,
                      errors=stats.errors, last_error=stats.last_error,
                      last_batch_ms=round(stats.last_batch_ms, 3), max_batch_ms=round(stats.max_batch_ms, 3),
                      pruned_rows=stats.pruned_rows)
    return result
