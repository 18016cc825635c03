"""``/api/history.json`` and ``/export.csv``: the history over HTTP, queried off the event loop.

``/api/history.json?metric=NAME&range=6h`` (or ``from``/``to`` as ISO 8601 or Unix seconds; optional ``gpu=0,1``
and ``step=60`` or ``step=1m``) answers one series per GPU (or one for a host metric) with each bucket's min,
mean and max; ``null`` where nothing was recorded. A bad request is a 400 with a one-line ``error``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError
from tornado.web import RequestHandler

from nvdash.history.catalog import METRICS
from nvdash.history.database import HistoryError
from nvdash.history.query import HistoryResult
from nvdash.history.ranges import RangeError, TimeRange, parse_duration, resolve
from nvdash.server.auth import GuardedHandler
from nvdash.server.export_gate import RETRY_AFTER_S, ExportBusy, ExportGate
from nvdash.server.history_setup import HistoryRuntime

DEFAULT_RANGE = "1h"

log = logging.getLogger(__name__)


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


MAX_GPUS = 1024
"""The most GPU indices a request may name (SQLite binds each as a parameter)."""


def _gpus(text: str) -> list[int] | None:
    if not text:
        return None
    parts = [part for part in text.split(",") if part.strip()]
    if len(parts) > MAX_GPUS:
        raise BadRequest(f"gpu names {len(parts)} GPUs; at most {MAX_GPUS}")
    try:
        gpus = [int(part) for part in parts]
    except ValueError:
        raise BadRequest(f"gpu must be GPU indices separated by commas, not {_short(text)}") from None
    if any(not 0 <= gpu < MAX_GPUS for gpu in gpus):
        raise BadRequest(f"gpu indices run from 0 to {MAX_GPUS - 1}, not {_short(text)}")
    return gpus


def _short(text: str, limit: int = 60) -> str:
    """``text`` quoted for a one-line message, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


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
    """``GET /export.csv``: the history as an nvidia-smi CSV log (same options as ``nvdash export``), sent in
    chunks as it is read, on the exports' own thread and in turn (see :mod:`nvdash.server.export_gate`)."""

    def initialize(self, history: HistoryRuntime, gate: ExportGate,
                   export: Callable[[Path, TimeRange, str, str, list[int] | None], Iterator[str]]) -> None:
        self._history = history
        self._gate = gate
        self._export = export

    def _refuse(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(f"{message}\n")

    async def get(self) -> None:
        history = self._history
        path = history.path
        if history.backend is None or path is None:
            self._refuse(404, f"history is {history.status}")
            return
        try:
            chosen = request_range(self, history.clock())
            fields = self.get_query_argument("query-gpu", "") or self.get_query_argument("fields", "")
            layout = self.get_query_argument("format", "csv")
            gpus = _gpus(self.get_query_argument("gpu", ""))
        except BadRequest as error:
            self._refuse(400, str(error))
            return
        try:
            async with self._gate.turn():
                await self._send(path, chosen, fields, layout, gpus)
        except ExportBusy as error:
            self.set_header("Retry-After", str(RETRY_AFTER_S))
            self._refuse(503, str(error))

    async def _send(self, path: Path, chosen: TimeRange, fields: str, layout: str, gpus: list[int] | None) -> None:
        """Check the options and read the first chunk (a 400 or 503 is still possible), then stream the rest."""
        chunks: Iterator[str] | None = None
        try:
            try:
                chunks = await self._gate.run(lambda: self._export(path, chosen, fields, layout, gpus))
                chunk = await self._gate.run(lambda: next(chunks, None))
            except (BadRequest, ValueError) as error:
                self._refuse(400, str(error))
                return
            except HistoryError as error:
                self._refuse(503, str(error))
                return
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="nvdash-export.csv"')
            while chunk is not None:
                self.write(chunk)
                await self.flush()
                chunk = await self._gate.run(lambda: next(chunks, None))
            self.finish()
        except StreamClosedError:
            return  # the client went away: stop reading
        except HistoryError as error:
            # Part of the CSV is sent: end the connection without the last chunk, so that the client sees an
            # incomplete answer rather than a short export that looks whole.
            log.warning("export stopped: %s", error)
            self.request.connection.close()  # type: ignore[union-attr]
            self._finished = True
        finally:
            if chunks is not None:
                close = getattr(chunks, "close", None)
                if close is not None:
                    await self._gate.run(close)


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
