"""Answers that are not pages say so: a browser shown an error or a refusal renders it as text, never as HTML.

Tornado answers ``text/html`` unless told otherwise, so a message naming a file (whose name may hold markup) would
be parsed as a page in the server's origin. The browser test (``tests/browser/test_markup_as_text.py``) shows a
replayed file's name arriving as text in the export's error; these are the other plain-text answers.
"""

from __future__ import annotations

from tests.conftest import http_get, nvdash_server


def test_errors_and_refusals_are_plain_text() -> None:
    with nvdash_server(["--simulate", "t4", "--no-history", "--metrics-token", "s3cret"]) as server:
        answers = {path: http_get(server.url + path) for path in ("/export.csv?range=1h", "/metrics")}
    status, body, headers = answers["/export.csv?range=1h"]
    assert (status, body) == (404, "history is off (--no-history)\n")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    status, body, headers = answers["/metrics"]
    assert (status, body) == (401, "a bearer token is needed for /metrics\n")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
