"""A small, blocking client of the Prometheus HTTP API (``/api/v1/query`` and ``/api/v1/query_range``).

Any endpoint speaking that API works: Prometheus, Thanos Query, Mimir. Every call has a deadline for the whole
request (a server dripping bytes cannot hold it), a bound on the answer's size and on the series it returns, and
checks the answer's shape; every failure is a :class:`PrometheusError` with a one-line message. Run it off the
event loop.

Credentials (a bearer token or basic auth, from files re-read when they change) and extra headers (a tenant's
``X-Scope-OrgID``) go with every request; a query whose URL would be longer than :data:`MAX_GET_URL` bytes goes as a
form POST, as the API allows, since proxies and servers cut long URLs. A 401 or 403 is a
:class:`PrometheusAuthError`: after a 401 the credential files are re-read and, if they changed, the query asked once
more.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from nvdash.cluster.access import DEFAULT_TIMEOUT_S, Credentials

FloatArray = npt.NDArray[np.float64]
MAX_SERIES = 200_000
"""The most series one answer may hold; more are cut off (and the answer says so). The cluster overview's answer
at 1,000 nodes x 8 GPUs holds 160,000 (20 families a GPU): 20,000 cut 7,000 GPUs to "no data"."""
MAX_POINTS = 11_000
"""Prometheus's own limit on the points of one range query's series."""
MIB = 1024 * 1024
MAX_BODY_BYTES = 64 * MIB
"""The largest answer read; a larger one is abandoned (the overview's 160,000 series at 8,000 GPUs, with only the
labels it reads, are about 30 MiB)."""
READ_CHUNK = 256 * 1024
MAX_GET_URL = 4000
"""The longest URL asked by GET; a longer query goes as a POST (many proxies refuse URLs over 4 or 8 KiB)."""


class PrometheusError(Exception):
    """Prometheus could not be asked or refused the query; the message is one line."""


class PrometheusAuthError(PrometheusError):
    """Prometheus (or the proxy before it) refused nvdash's credentials: HTTP 401 or 403."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


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


def _short(value: Any) -> str:
    """A value of a bad answer, quoted on one short line for an error message."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _malformed(url: str, what: str) -> PrometheusError:
    return PrometheusError(f"Prometheus at {url} answered a malformed result: {what}")


def _number(url: str, where: str, text: Any) -> float:
    """A sample value: Prometheus writes them as strings (``"NaN"``, ``"+Inf"`` included)."""
    if not isinstance(text, str):
        raise _malformed(url, f"{where} value {_short(text)} is not a string")
    try:
        return float(text)
    except ValueError:
        raise _malformed(url, f"{where} value {_short(text)} is not a number") from None


def _labels(url: str, where: str, item: Any) -> Mapping[str, str]:
    """A series' labels: an object of strings (absent: none)."""
    metric = item.get("metric", {})
    if not isinstance(metric, dict):
        raise _malformed(url, f"{where}.metric is {_short(metric)}, not an object")
    for name, value in metric.items():
        if not isinstance(value, str):
            raise _malformed(url, f"{where}.metric label {_short(name)} is {_short(value)}, not a string")
    return metric


def _point(url: str, where: str, point: Any) -> tuple[float, float]:
    """A ``[time, "value"]`` pair."""
    if not isinstance(point, list) or len(point) != 2 or isinstance(point[0], bool) or not isinstance(
            point[0], (int, float)):
        raise _malformed(url, f"{where} is {_short(point)}, not a [time, \"value\"] pair")
    return float(point[0]), _number(url, where, point[1])


def _series(url: str, result: Any, max_series: int) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """The first ``max_series`` series objects of a result list (with where each is), and whether more were cut."""
    if not isinstance(result, list):
        raise _malformed(url, f"result is {_short(result)}, not a list")
    found = []
    for index, item in enumerate(result[:max_series]):
        if not isinstance(item, dict):
            raise _malformed(url, f"result[{index}] is {_short(item)}, not a series object")
        found.append((f"result[{index}]", item))
    return found, len(result) > max_series


class PrometheusClient:
    """Asks one Prometheus-API endpoint; ``url`` is its base (``http://prometheus:9090``, or Thanos/Mimir's)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_series: int = MAX_SERIES,
                 headers: Mapping[str, str] | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 *, credentials: Credentials | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        """The most one request may take, from connecting to the answer's last byte."""
        self.max_series = max_series
        self.max_body_bytes = max_body_bytes
        self.headers = dict(headers or {})
        self.credentials = credentials
        self.tls = tls
        """The TLS context for an https endpoint (``None``: the system's CAs)."""

    def instant(self, query: str, time_s: float | None = None, *, deadline_mono: float | None = None) -> Answer:
        """The value of ``query`` now (or at ``time_s``), asked before ``deadline_mono`` (default: the timeout)."""
        params = {"query": query}
        if time_s is not None:
            params["time"] = f"{time_s:.3f}"
        data = self._get("/api/v1/query", params, deadline_mono)
        kind = data.get("resultType")
        if kind == "scalar":
            return Answer([Sample({}, _point(self.url, "result", data.get("result"))[1])])
        if kind != "vector":
            raise PrometheusError(f"Prometheus at {self.url} answered a {_short(kind)} to an instant query")
        series, truncated = _series(self.url, data.get("result"), self.max_series)
        samples = [Sample(_labels(self.url, where, item), _point(self.url, f"{where}.value", item.get("value"))[1])
                   for where, item in series]
        return Answer(samples, truncated=truncated)

    def range(self, query: str, start_s: float, end_s: float, step_s: float, *,
              deadline_mono: float | None = None) -> RangeAnswer:
        """``query`` evaluated every ``step_s`` over ``[start_s, end_s]``; raises for more points than allowed."""
        if not step_s > 0 or not end_s > start_s:
            raise PrometheusError("a range query needs a positive step and a start before its end")
        if (end_s - start_s) / step_s > MAX_POINTS:
            raise PrometheusError(f"step {step_s:g} s gives more than {MAX_POINTS} points; choose a larger one")
        data = self._get("/api/v1/query_range", {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                                                 "step": f"{step_s:g}"}, deadline_mono)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus at {self.url} answered a {_short(data.get('resultType'))} "
                                  "to a range query")
        found, truncated = _series(self.url, data.get("result"), self.max_series)
        series = []
        for where, item in found:
            values = item.get("values", [])
            if not isinstance(values, list):
                raise _malformed(self.url, f"{where}.values is {_short(values)}, not a list")
            points = [_point(self.url, f"{where}.values[{index}]", point) for index, point in enumerate(values)]
            times = np.array([point[0] for point in points], dtype=np.float64)
            numbers = np.array([point[1] for point in points], dtype=np.float64)
            series.append(RangeSeries(_labels(self.url, where, item), times, numbers))
        return RangeAnswer(series, truncated=truncated)

    def _late(self) -> PrometheusError:
        return PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s")

    def _get(self, path: str, params: Mapping[str, str], deadline_mono: float | None = None) -> dict[str, Any]:
        """The ``data`` of a successful answer, read whole before the deadline and within ``max_body_bytes``."""
        deadline = time.monotonic() + self.timeout_s
        if deadline_mono is not None:
            deadline = min(deadline, deadline_mono)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._late()
        try:
            body = self._ask(path, params, remaining)
        except PrometheusAuthError as error:
            if not (error.status == 401 and self.credentials is not None and self.credentials.renew()):
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._late() from None
            body = self._ask(path, params, remaining)
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            raise PrometheusError(f"{self.url} did not answer with Prometheus API JSON") from None
        if not isinstance(answer, dict) or answer.get("status") != "success" or not isinstance(answer.get("data"),
                                                                                                 dict):
            message = _error_message(body) if isinstance(answer, dict) else None
            raise PrometheusError(f"Prometheus at {self.url} refused the query: {message or 'no data'}")
        data: dict[str, Any] = answer["data"]
        return data

    def request(self, path: str, params: Mapping[str, str]) -> urllib.request.Request:
        """The request for ``path``: a GET, or a form POST when the URL would be longer than :data:`MAX_GET_URL`;
        with the extra headers and the credentials' current ``Authorization``."""
        form = urllib.parse.urlencode(params)
        headers = {"Accept": "application/json", **self.headers}
        if self.credentials is not None:
            headers.update(self.credentials.headers())
        url = f"{self.url}{path}?{form}"
        if len(url) <= MAX_GET_URL:
            return urllib.request.Request(url, headers=headers)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        return urllib.request.Request(f"{self.url}{path}", data=form.encode("ascii"), headers=headers, method="POST")

    def _ask(self, path: str, params: Mapping[str, str], remaining: float) -> bytes:
        """The answer's body, read within ``remaining`` seconds."""
        request = self.request(path, params)
        with _Watchdog(remaining) as watchdog:
            try:
                body = self._fetch(request, remaining, watchdog)
            except PrometheusError:
                raise
            except Exception as error:
                if watchdog.expired:
                    raise self._late() from None
                raise self._unreachable(error) from None
            if watchdog.expired:
                raise self._late()
        return body

    def _fetch(self, request: urllib.request.Request, timeout_s: float, watchdog: _Watchdog) -> bytes:
        """The body of the answer (an error status's too, raised as a refusal)."""
        opener = urllib.request.build_opener(_WatchedHTTPHandler(watchdog), _WatchedHTTPSHandler(watchdog, self.tls))
        try:
            with opener.open(request, timeout=timeout_s) as response:
                return self._read(response)
        except urllib.error.HTTPError as error:
            body = b"" if watchdog.expired else self._read(error)
            if error.code in (401, 403):
                given = "" if self.credentials is not None and self.credentials.given else " (none were given)"
                raise PrometheusAuthError(
                    f"Prometheus at {self.url} refused nvdash's credentials (HTTP {error.code}){given}",
                    status=error.code) from None
            refused = _error_message(body) or f"HTTP {error.code} {error.reason}"
            raise PrometheusError(f"Prometheus at {self.url} refused the query: {refused}") from None

    def _read(self, response: Any) -> bytes:
        """The body, read in pieces; raises once it exceeds ``max_body_bytes``."""
        too_big = PrometheusError(f"Prometheus at {self.url} answered more than {self.max_body_bytes / MIB:g} MiB; "
                                  "ask for fewer series")
        length = response.headers.get("Content-Length") if response.headers is not None else None
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            raise too_big
        chunks = []
        size = 0
        while chunk := response.read(READ_CHUNK):
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def _unreachable(self, error: BaseException) -> PrometheusError:
        """One line for a failure to connect or a broken answer."""
        if isinstance(error, urllib.error.URLError):
            reason: Any = error.reason
            if isinstance(reason, TimeoutError):
                return self._late()
            text = str(getattr(reason, "strerror", None) or reason)
            return PrometheusError(f"cannot reach Prometheus at {self.url}: {text}")
        if isinstance(error, TimeoutError):
            return self._late()
        if isinstance(error, http.client.HTTPException):
            detail = " ".join(str(error).split())[:120]
            return PrometheusError(f"{self.url} did not answer with HTTP: {type(error).__name__} {detail}".rstrip())
        if isinstance(error, OSError):
            return PrometheusError(f"cannot reach Prometheus at {self.url}: {error.strerror or error}")
        return PrometheusError(f"cannot ask Prometheus at {self.url}: {type(error).__name__}: {_short(str(error))}")


class _Watchdog:
    """Shuts the request's sockets down when its time is up, so that a server dripping bytes cannot hold it:
    a socket's own timeout bounds only each read."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> socket.socket:
        """Watch a connection's socket (shut down at once when the time is already up)."""
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _watched(kind: type[http.client.HTTPConnection], watchdog: _Watchdog) -> Callable[..., http.client.HTTPConnection]:
    """A connection class for urllib whose sockets ``watchdog`` watches."""
    def connect(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        connection = kind(host, **kwargs)
        create = connection._create_connection  # type: ignore[attr-defined]
        connection._create_connection = (  # type: ignore[attr-defined]
            lambda *args, **more: watchdog.watch(create(*args, **more)))
        return connection
    return connect


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self._watchdog), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog, context: ssl.SSLContext | None = None) -> None:
        super().__init__(context=context)
        self._watchdog = watchdog

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self._watchdog), req,
                            context=self._context)  # type: ignore[attr-defined]


def _error_message(body: bytes) -> str | None:
    """The API's ``errorType: error`` of an error answer, on one short line."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(answer, dict) or "error" not in answer:
        return None
    kind = answer.get("errorType")
    text = " ".join(f"{kind}: {answer['error']}".split() if kind else str(answer["error"]).split())
    return text if len(text) <= 300 else text[:297] + "..."
