"""Seeded generators of bad input for a real server: HTTP requests and websocket messages.

Every case is plain data with a one-line description, so a failing case is printed as it was sent.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from nvdash.history.catalog import METRICS
from tests.server.raw_client import OP_BINARY, OP_CLOSE, OP_CONTINUATION, OP_PING, OP_TEXT

SERVER_PATHS = ("/", "/index.json", "/info.json", "/api/history.json", "/api/snapshot.json", "/api/processes.json",
                "/api/accounting.json", "/api/accounting.csv",
                "/export.csv", "/metrics", "/health", "/login", "/static/js/bokeh.min.js", "/static/js/",
                "/static/", "/static/../pyproject.toml", "/favicon.ico", "/robots.txt", "/api/", "/api/nothing.json")
APP_SUFFIXES = ("", "/", "/ws", "/autoload.js", "/metadata")
KEYS_BY_PATH = {
    "/api/history.json": ("metric", "range", "from", "to", "gpu", "step"),
    "/api/accounting.json": ("range", "from", "to", "by"),
    "/api/accounting.csv": ("range", "from", "to", "by"),
    "/export.csv": ("range", "from", "to", "gpu", "query-gpu", "fields", "format"),
    "/health": ("since", "reset"),
    "/login": ("next", "token"),
}
APP_KEYS = ("theme", "gpu", "gpus", "range", "from", "to", "by", "node", "bokeh-session-id", "bokeh-autoload-element",
            "bokeh-token")
NVSMI_FIELDS = ("timestamp", "index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw",
                "temperature.gpu", "clocks.sm", "pstate", "uuid", "bogus.field")
VALUES = (
    "", " ", "0", "1", "-1", "7", "99", "1e309", "-1e309", "nan", "NaN", "inf", "-inf", "1e18", "0x10", "1_0",
    "99999999999999999999999999999", "3.5", "-0", "1h", "6h", "7d", "30d", "0s", "-5m", "5x", "1y", "live",
    "custom", "last", "1h,2h", "2026-01-01T00:00:00Z", "2026-13-45T99:99:99", "1970-01-01", "9999-12-31T23:59:59",
    "0,1", "0,,1", ",", ",,,", "0,1,999", "a,b", " 1 , 2 ", "dark", "light", "csv", "csv,noheader,nounits",
    "json", "csv,bogus", "../../etc/passwd", "/etc/passwd", "//evil.example/x", "http://evil.example/",
    "javascript:alert(1)", "<script>alert(1)</script>", "\"'", "\\", "%", "\x00", "\x7f", "é", "日本",
    "\U0001f600", "\ud800", "a" * 300, "9" * 400, "\u00b2", "\u0661", "1e15", "-1e12", "0001-01-01",
    "9999-12-31T23:59:59-14:00", "1\x0bh", "1h\n", "7d\r\n", "\t1h",
)
"""Query values; ``\u00b2`` and ``\u0661`` are digits to ``str.isdigit`` (the second also to ``int``)."""
HEADER_VALUES = ("", " ", "x", "a" * 4000, "\x01\x02", "é", "null", "undefined", "*/*", "0", "-1", "1e999",
                 "bytes=0-10", "bytes=-", "bytes=99999999999999-", "gzip, deflate, br", "chunked",
                 "Thu, 01 Jan 1970 00:00:00 GMT", "not a date", '"etag"', "W/\"x\"")
METHODS = ("GET",) * 16 + ("HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "FOO")


@dataclass(frozen=True)
class HttpCase:
    """One request, sent byte for byte as built here."""

    number: int
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    host: str | None = None
    """The ``Host`` header; ``None``: the server's own address."""

    def request(self, own_host: str) -> bytes:
        host = own_host if self.host is None else self.host
        lines = [f"{self.method} {self.target} HTTP/1.1", f"Host: {host}",
                 *(f"{name}: {value}" for name, value in self.headers), "Connection: close"]
        if self.body or self.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(self.body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", errors="surrogatepass")
        return head + self.body

    def describe(self) -> str:
        headers = [(name, value if len(value) < 80 else f"{value[:40]}...({len(value)} chars)")
                   for name, value in self.headers]
        target = self.target if len(self.target) < 300 else f"{self.target[:150]}...({len(self.target)} chars)"
        return (f"case {self.number}: {self.method} {target!r} host={self.host!r} headers={headers} "
                f"body={self.body[:60]!r}")


def _encode(rng: random.Random, text: str) -> str:
    """Percent-encode ``text``, or mangle the encoding now and then."""
    roll = rng.random()
    if roll < 0.70:
        return quote(text, safe="", errors="surrogatepass")
    if roll < 0.80:
        return text.replace(" ", "+")
    if roll < 0.95:
        bad = rng.choice(("%", "%z", "%zz", "%e9", "%ff%fe", "%c3%28", "%00", "%%", "%2", "%u00e9", "%ed%a0%80"))
        cut = rng.randint(0, len(text))
        return quote(text[:cut], safe="", errors="surrogatepass") + bad + quote(text[cut:], safe="",
                                                                                 errors="surrogatepass")
    return "".join(rng.choice("&=;?#[]@!$'()*+,") for _ in range(rng.randint(1, 8)))


def _value(rng: random.Random, key: str) -> str:
    roll = rng.random()
    if key == "metric" and roll < 0.5:
        return rng.choice(list(METRICS))
    if key in ("query-gpu", "fields") and roll < 0.6:
        return ",".join(rng.sample(NVSMI_FIELDS, rng.randint(1, 4)))
    if roll < 0.85:
        return rng.choice(VALUES)
    return "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(1, 40)))


def _query(rng: random.Random, path: str, routes: Sequence[str]) -> str:
    known = KEYS_BY_PATH.get(path, APP_KEYS if any(path.startswith(route) for route in routes) else ())
    pairs = []
    for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4, 6))):
        key = rng.choice(known) if known and rng.random() < 0.8 else rng.choice(("token", "x", "", "a[]", "%", "é"))
        pairs.append(f"{_encode(rng, key)}={_encode(rng, _value(rng, key))}")
    query = "&".join(pairs)
    roll = rng.random()
    if roll < 0.03:
        query += "&x=" + "y" * rng.choice((10_000, 70_000, 200_000))
    elif roll < 0.06:
        query += rng.choice(("&&&", "=", "==", "&=&=", ";", "#frag", "?", "??x=1"))
    return ("?" + query) if query or rng.random() < 0.1 else ""


def _path(rng: random.Random, routes: Sequence[str]) -> str:
    roll = rng.random()
    if roll < 0.45:
        path = rng.choice(SERVER_PATHS)
    elif roll < 0.80:
        path = rng.choice(routes) + rng.choice(APP_SUFFIXES)
    else:
        path = "/" + "/".join(_encode(rng, rng.choice(VALUES) or "x") for _ in range(rng.randint(1, 3)))
    mutation = rng.random()
    if mutation < 0.05:
        path = path.upper()
    elif mutation < 0.10:
        path = "//" + path.lstrip("/")
    elif mutation < 0.15:
        path = path + rng.choice(("/..", "/.", "/%2e%2e/", "%00", "%zz", "~", ";x", "/" + "z" * 5000))
    elif mutation < 0.17:
        path = "/" + "a/" * rng.choice((100, 3000))
    return path


def _headers(rng: random.Random, port: int) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
        name = rng.choice(("Cookie", "Origin", "Accept", "Authorization", "Range", "If-None-Match",
                           "If-Modified-Since", "Accept-Encoding", "X-Forwarded-For", "Content-Type",
                           "Referer", "User-Agent", "Upgrade", "Sec-WebSocket-Version", "Expect", "X-" + "h" * 50,
                           "Bokeh-Session-Id"))
        value = rng.choice(HEADER_VALUES)
        if name == "Cookie":
            value = rng.choice((f"nvdash-{port}={rng.choice(VALUES)}", "a=b; " * rng.choice((1, 500, 4000)),
                                "=" * 100, "x=" + "c" * rng.choice((100, 8000, 70_000)), value))
        elif name == "Origin":
            value = rng.choice(("null", "http://evil.example", f"http://127.0.0.1:{port}", "file://", "x", value))
        elif name == "Accept":
            value = rng.choice(("application/openmetrics-text; version=1.0.0", "application/openmetrics-text",
                                "application/openmetrics-text; version=9", "text/plain;q=x", "text/html", value))
        elif name == "Authorization":
            value = rng.choice(("Bearer ", "Bearer x", "token ", "token " + "t" * 5000, "Basic !!!", "Bearer\t",
                                value))
        headers.append((name, value))
    return tuple(headers)


def http_cases(seed: int, count: int, routes: Sequence[str], port: int) -> list[HttpCase]:
    """``count`` requests: methods, paths (every route and server page, unknown ones), queries, headers."""
    rng = random.Random(seed)
    cases = []
    for number in range(count):
        method = rng.choice(METHODS)
        path = _path(rng, routes)
        target = path + _query(rng, path.split("?")[0], routes)
        host = None
        if rng.random() < 0.08:
            host = rng.choice(("", "evil.example", "[::1", "[::1]:1", "127.0.0.1:99999", "h" * 3000, "a b", "é",
                               f"localhost:{port}", "127.0.0.1:0"))
        body = b""
        if method in ("POST", "PUT", "PATCH"):
            body = rng.choice((b"", b"token=x&next=%2F", b"next=//evil.example&token=", rng.randbytes(64),
                               b"{" * 1000, b"x" * rng.choice((10, 100_000))))
        cases.append(HttpCase(number, method, target, _headers(rng, port), body, host))
    return cases


# Websocket cases --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocModel:
    """A model of the document a session pulled: its id, class name and attribute names."""

    id: str
    name: str
    attributes: tuple[str, ...]


def document_models(doc_json: Any) -> list[DocModel]:
    """Every model defined anywhere in a serialized Bokeh document."""
    found: dict[str, DocModel] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "id" in node and "name" in node:
                attributes = node.get("attributes") or {}
                found.setdefault(str(node["id"]), DocModel(str(node["id"]), str(node["name"]), tuple(attributes)))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc_json)
    return list(found.values())


@dataclass(frozen=True)
class WsFrame:
    opcode: int
    payload: bytes
    fin: bool = True
    masked: bool = True


@dataclass(frozen=True)
class WsCase:
    """A few frames sent on an open session's websocket."""

    number: int
    kind: str
    frames: tuple[WsFrame, ...]
    raw: bytes = b""
    """Bytes sent after the frames as they are (a truncated frame)."""
    summary: str = ""
    probe: bool = True
    """Whether to ask for an answer after the case; not after a frame cut short, whose rest the server awaits
    (the client then hangs up, and the server must let go of the connection)."""

    def describe(self) -> str:
        return f"ws case {self.number} ({self.kind}): {self.summary[:400]}"


def _text(value: Any) -> WsFrame:
    return WsFrame(OP_TEXT, (value if isinstance(value, str) else json.dumps(value)).encode("utf-8", "surrogatepass"))


def _message(msgtype: Any, content: Any, header: dict[str, Any] | None = None, metadata: Any = None
             ) -> tuple[WsFrame, ...]:
    head = {"msgid": "fz", "msgtype": msgtype, **(header or {})}
    return (_text(head), _text({} if metadata is None else metadata), _text(content))


WIDGETS = ("Toggle", "Dropdown", "Button", "Select", "TextInput", "DatetimePicker", "Spacer", "RadioButtonGroup",
           "CheckboxGroup", "MultiChoice", "Slider", "Tabs", "DataTable", "ColumnDataSource", "Selection",
           "Range1d", "DataRange1d")


def _fuzz_value(rng: random.Random, models: Sequence[DocModel]) -> Any:
    pool: list[Any] = [None, True, False, 0, 1, -1, 2**31, 2**63, -(2**70), 1.5, 1e308, -1e308, "", "x", "0", "99",
                       "-1", "1h", "custom", "live", "Live", "\x00", "a" * 100_000, [], [None], [1, 2], ["a", "b"],
                       [[1, 2]], ["2026-01-01T00:00:00Z", "x"], [1e300, -1e300], [1.7e12, 1.6e12], {}, {"a": 1},
                       {"id": "p999999"}, {"type": "number", "value": "nan"}, {"type": "number", "value": "x"},
                       {"type": "object", "name": "NoSuchModel", "id": "x1"}, {"type": "map", "entries": 5},
                       {"type": "bytes", "data": "!!!"}, {"type": "ndarray", "array": [1], "dtype": "bogus"}]
    value = rng.choice(pool)
    if rng.random() < 0.05:
        value = [value]
        for _ in range(rng.choice((10, 200))):
            value = [value]
    if rng.random() < 0.08 and models:
        value = {"id": rng.choice(models).id}
    return value


def _event(rng: random.Random, models: Sequence[DocModel]) -> dict[str, Any]:
    names = ("menu_item_click", "button_click", "value_submit", "tap", "doubletap", "reset", "rangesupdate",
             "selectiongeometry", "document_ready", "connection_lost", "client_reconnected", "legend_item_click",
             "pan", "wheel", "mousemove", "lodstart", "lodend", "axis_click", "no_such_event", "", "__init__")
    target = rng.choice(models).id if models and rng.random() < 0.9 else "p424242"
    entries: list[list[Any]] = [["model", {"id": target}]]
    for _ in range(rng.randint(0, 3)):
        entries.append([rng.choice(("item", "value", "x", "y", "sx", "x0", "x1", "geometry", "final", "")),
                        _fuzz_value(rng, models)])
    values: Any = {"type": "map", "entries": entries}
    if rng.random() < 0.1:
        values = rng.choice((None, [], "x", {"type": "map"}, {"entries": []}))
    return {"kind": "MessageSent", "msg_type": rng.choice(("bokeh_event",) * 9 + ("other",)),
            "msg_data": {"type": "event", "name": rng.choice(names), "values": values}}


def _model_changed(rng: random.Random, models: Sequence[DocModel]) -> dict[str, Any]:
    widgets = [model for model in models if model.name in WIDGETS]
    model = rng.choice(widgets if widgets and rng.random() < 0.8 else list(models))
    known = [name for name in model.attributes if name != "id"] + ["active", "value", "tags", "disabled", "label",
                                                                   "value_input", "indices", "menu", "start"]
    attr = rng.choice(known) if rng.random() < 0.9 else rng.choice(("bogus", "", "__class__", "_document", "id"))
    return {"kind": "ModelChanged", "model": {"id": model.id if rng.random() < 0.95 else "p31337"}, "attr": attr,
            "new": _fuzz_value(rng, models)}


TARGETED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "Toggle": ("active", (True, False, 0, 1, "x", None)),
    "Select": ("value", ("0", "7", "99", "-1", "", "x", "all", "GPU 0", None, 3)),
    "TextInput": ("value_input", ("", "(", "[", "\\", ".*", "a" * 10_000, "\x00", "gpu", "é")),
    "Spacer": ("disabled", (True, False, None, "x")),
    "CheckboxGroup": ("active", ([], [0], [0, 99], [-1], "x", None)),
    "RadioButtonGroup": ("active", (0, 1, 99, -1, None, "x")),
    "DatetimePicker": ("value", ("2026-01-01 00:00", "x", 0, -1e300, 1.7e12, None)),
    "Button": ("tags", ([], [None, None], [1.7e12, 1.6e12], [1.6e12, 1.7e12], [1.6e12, 1.6e12 + 1], [1e300, 2e300],
                        [-1e300, 1e300], [-1e18, 1e18], [0, 1], [-8.64e15, 8.64e15], ["x", "y"], ["1", "2"],
                        [{"type": "number", "value": "nan"}, 1], [1.6e12], "x", [[1], [2]])),
}
"""The widgets whose changes nvdash's own callbacks act on, with values a browser could send and some it would not."""
MENU_ITEMS = ("live", "Live", "1h", "6h", "24h", "7d", "30d", "custom", "", "x", "1y", "-1h", "0m", "9999999d")


def _targeted(rng: random.Random, models: Sequence[DocModel]) -> list[dict[str, Any]] | None:
    """A change or an event for one of the widgets nvdash's callbacks listen to; ``None`` when there is none."""
    widgets = [model for model in models if model.name in TARGETED or model.name == "Dropdown"]
    if not widgets:
        return None
    model = rng.choice(widgets)
    if model.name == "Dropdown":
        item: Any = rng.choice(MENU_ITEMS) if rng.random() < 0.9 else _fuzz_value(rng, models)
        return [{"kind": "MessageSent", "msg_type": "bokeh_event",
                 "msg_data": {"type": "event", "name": "menu_item_click",
                              "values": {"type": "map", "entries": [["model", {"id": model.id}], ["item", item]]}}}]
    attr, values = TARGETED[model.name]
    return [{"kind": "ModelChanged", "model": {"id": model.id}, "attr": attr, "new": rng.choice(values)}]


def _patch_doc(rng: random.Random, models: Sequence[DocModel]) -> tuple[str, tuple[WsFrame, ...]]:
    roll = rng.random()
    targeted = _targeted(rng, models) if roll < 0.5 else None
    if targeted is not None:
        events: Any = targeted
    elif roll < 0.7:
        events = [_model_changed(rng, models) for _ in range(rng.randint(1, 3))]
    elif roll < 0.9:
        events = [_event(rng, models) for _ in range(rng.randint(1, 2))]
    else:
        events = rng.choice(([{}], [{"kind": "Bogus"}], [{"kind": "RootAdded", "model": {"id": "x"}}],
                             [{"kind": "RootRemoved", "model": {"id": models[0].id if models else "x"}}],
                             [{"kind": "TitleChanged", "title": 5}], [{"kind": "ColumnDataChanged"}],
                             [{"kind": "ColumnsStreamed", "model": {"id": "x"}, "attr": "data", "data": 1}],
                             [{"kind": "ColumnsPatched", "attr": "data", "patches": "x"}], "events", None))
    content: Any = {"events": events}
    if rng.random() < 0.05:
        content = rng.choice(({}, [], "x", None, {"events": {"a": 1}}))
    return json.dumps(content)[:300], _message("PATCH-DOC", content)


def ws_cases(seed: int, count: int, models: Sequence[DocModel], start: int = 0) -> list[WsCase]:
    """``count`` cases against a session whose document holds ``models``."""
    rng = random.Random(seed)
    cases = []
    for number in range(start, start + count):
        kind = rng.choices(("patch", "msgtype", "protocol", "frames", "huge"), weights=(55, 12, 15, 15, 3))[0]
        raw = b""
        probe = True
        if kind == "patch":
            summary, frames = _patch_doc(rng, models)
        elif kind == "msgtype":
            msgtype = rng.choice(("PULL-DOC-REQ", "SERVER-INFO-REQ", "PUSH-DOC", "ACK", "OK", "ERROR",
                                  "PULL-DOC-REPLY", "SERVER-INFO-REPLY", "EXPIRE", "patch-doc", "", "X" * 1000, 5,
                                  None, ["PATCH-DOC"]))
            content = rng.choice(({}, {"doc": {}}, {"doc": {"roots": 5}}, {"doc": {"roots": [], "title": 1}},
                                  {"text": "x"}, [], "x"))
            summary, frames = f"msgtype={msgtype!r} content={content!r}", _message(msgtype, content)
        elif kind == "protocol":
            choice = rng.randint(0, 7)
            options: list[tuple[WsFrame, ...]] = [
                (_text("{not json"), _text("{}"), _text("{}")),
                (_text([1, 2]), _text({}), _text({})),
                (_text({"msgtype": "PATCH-DOC"}), _text({}), _text({"events": []})),
                (_text({"msgid": 5, "msgtype": "PATCH-DOC"}), _text({}), _text({"events": []})),
                _message("PATCH-DOC", {"events": []}, {"num_buffers": rng.choice((1, 2, -1, "x", 10**9))}),
                (WsFrame(OP_BINARY, b"\x00" * 16), _text({}), _text({})),
                (_text({"msgid": "a", "msgtype": "PATCH-DOC"}), _text("[1"), _text({"events": []})),
                (_text({"msgid": "a", "msgtype": "PATCH-DOC"}),),
            ]
            frames = options[choice]
            summary = f"protocol variant {choice}: " + repr([frame.payload[:80] for frame in frames])
        elif kind == "frames":
            choice = rng.randint(0, 9)
            garbage = rng.randbytes(rng.choice((1, 50, 2000)))
            frame_options: list[tuple[tuple[WsFrame, ...], bytes]] = [
                ((WsFrame(OP_TEXT, garbage),), b""),  # most likely not UTF-8
                ((WsFrame(OP_BINARY, garbage),), b""),
                ((WsFrame(OP_TEXT, b'{"msgid":', fin=False),
                  WsFrame(OP_CONTINUATION, b'"f","msgtype":"SERVER-INFO-REQ"}'), _text({}), _text({})),
                 b""),  # a fragmented, valid request
                ((WsFrame(OP_CONTINUATION, b"orphan"),), b""),
                ((WsFrame(0x3, b"reserved opcode"),), b""),
                ((WsFrame(OP_TEXT, b"{}", masked=False),), b""),
                ((WsFrame(OP_PING, b"p" * rng.choice((0, 10, 125, 126))),), b""),
                ((WsFrame(OP_CLOSE, struct.pack("!H", rng.choice((1000, 1005, 999, 4999, 65535))) + garbage[:50]),),
                 b""),
                ((), b"\x81\xfe\xff\xff" + b"\x00" * 4 + b"truncated"),
                ((), bytes([0x80 | 0x70 | OP_TEXT, 0x80 | 2]) + b"\x00\x00\x00\x00{}"),  # RSV bits set
            ]
            frames, raw = frame_options[choice]
            summary = f"frames variant {choice}: " + repr([(f.opcode, f.payload[:40]) for f in frames]) + repr(raw[:20])
            probe = choice != 8
        else:
            size = rng.choice((2 * 2**20, 21 * 2**20))
            frames = (_text({"msgid": "big", "msgtype": "PATCH-DOC"}), _text({}),
                      WsFrame(OP_TEXT, b'{"events": "' + b"x" * size + b'"}'))
            summary = f"a PATCH-DOC of {size} bytes"
        cases.append(WsCase(number, kind, tuple(frames), raw, summary, probe))
    return cases


@dataclass
class Outcomes:
    """How the server took the websocket cases."""

    answered: int = 0
    closed: dict[str, int] = field(default_factory=dict)
    abandoned: int = 0
    """Cases after which the client hung up without asking (a frame cut short)."""

    def close(self, code: int | None) -> None:
        key = str(code)
        self.closed[key] = self.closed.get(key, 0) + 1
