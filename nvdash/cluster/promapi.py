"""A small, blocking client of the Prometheus HTTP API (``/api/v1/query`` and ``/api/v1/query_range``).

Any endpoint speaking that API works: Prometheus, Thanos Query, Mimir. Every call has a timeout and a bound on the
series it returns; every failure is a :class:`PrometheusError` with a one-line message. Run it off the event loop.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
DEFAULT_TIMEOUT_S = 5.0
MAX_SERIES = 20_000
"""The most series one answer may hold; more are cut off (and the answer says so)."""
MAX_POINTS = 11_000
"""Prometheus's own limit on the points of one range query's series."""


class PrometheusError(Exception):
    """Prometheus could not be asked or refused the query; the message is one line."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant query: its labels (``__name__`` included where Prometheus keeps it) and value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: evaluation times (epoch seconds) and values."""

    labels: Mapping[str, str]
    time_s: FloatArray
    values: FloatArray


@dataclass(frozen=True)
class Answer:
    """An instant query's series, and whether some were cut off by the series bound."""

    samples: list[Sample] = field(default_factory=list)
    truncated: bool = False


@dataclass(frozen=True)
class RangeAnswer:
    """A range query's series, and whether some were cut off by the series bound."""

    series: list[RangeSeries] = field(default_factory=list)
    truncated: bool = False


def _number(text: Any) -> float:
    """Prometheus writes sample values as strings (``"NaN"``, ``"+Inf"`` included)."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


class PrometheusClient:
    """Asks one Prometheus-API endpoint; ``url`` is its base (``http://prometheus:9090``, or Thanos/Mimir's)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_series: int = MAX_SERIES,
                 headers: Mapping[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_series = max_series
        self.headers = dict(headers or {})

    def instant(self, query: str, time_s: float | None = None) -> Answer:
        """The value of ``query`` now (or at ``time_s``)."""
        params = {"query": query}
        if time_s is not None:
            params["time"] = f"{time_s:.3f}"
        data = self._get("/api/v1/query", params)
        if data.get("resultType") not in ("vector", "scalar"):
            raise PrometheusError(f"Prometheus answered a {data.get('resultType')} to an instant query")
        if data["resultType"] == "scalar":
            return Answer([Sample({}, _number(data["result"][1]))])
        result = data.get("result") or []
        samples = [Sample(item.get("metric", {}), _number(item.get("value", [0, "NaN"])[1]))
                   for item in result[: self.max_series]]
        return Answer(samples, truncated=len(result) > self.max_series)

    def range(self, query: str, start_s: float, end_s: float, step_s: float) -> RangeAnswer:
        """``query`` evaluated every ``step_s`` over ``[start_s, end_s]``; raises for more points than allowed."""
        if not step_s > 0 or not end_s > start_s:
            raise PrometheusError("a range query needs a positive step and a start before its end")
        if (end_s - start_s) / step_s > MAX_POINTS:
            raise PrometheusError(f"step {step_s:g} s gives more than {MAX_POINTS} points; choose a larger one")
        data = self._get("/api/v1/query_range", {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                                                 "step": f"{step_s:g}"})
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus answered a {data.get('resultType')} to a range query")
        result = data.get("result") or []
        series = []
        for item in result[: self.max_series]:
            values = item.get("values") or []
            times = np.array([float(point[0]) for point in values], dtype=np.float64)
            numbers = np.array([_number(point[1]) for point in values], dtype=np.float64)
            series.append(RangeSeries(item.get("metric", {}), times, numbers))
        return RangeAnswer(series, truncated=len(result) > self.max_series)

    def _get(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        request = urllib.request.Request(url, headers={"Accept": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            body = error.read()
            refused = _error_message(body) or f"HTTP {error.code} {error.reason}"
            raise PrometheusError(f"Prometheus at {self.url} refused the query: {refused}") from None
        except TimeoutError:
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s") from None
        except urllib.error.URLError as error:
            reason = error.reason
            if isinstance(reason, TimeoutError):
                raise PrometheusError(
                    f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s") from None
            text = str(getattr(reason, "strerror", None) or reason)
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {text}") from None
        except OSError as error:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {error.strerror or error}") from None
        try:
            answer = json.loads(body)
        except ValueError:
            raise PrometheusError(f"{self.url} did not answer with Prometheus API JSON") from None
        if not isinstance(answer, dict) or answer.get("status") != "success" or not isinstance(answer.get("data"),
                                                                                                 dict):
            message = _error_message(body) if isinstance(answer, dict) else None
            raise PrometheusError(f"Prometheus at {self.url} refused the query: {message or 'no data'}")
        data: dict[str, Any] = answer["data"]
        return data


def _error_message(body: bytes) -> str | None:
    """The API's ``errorType: error`` of an error answer, on one line."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if not isinstance(answer, dict) or "error" not in answer:
        return None
    kind = answer.get("errorType")
    text = " ".join(str(answer["error"]).split())
    return f"{kind}: {text}" if kind else text
