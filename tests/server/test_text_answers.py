"""Answers that are not pages say so: a browser shown an error or a refusal renders it as text, never as HTML.

Tornado answers ``text/html`` unless told otherwise, so a message naming a file (whose name may hold markup) would
be parsed as a page in the server's origin. The browser test (``tests/browser/test_markup_as_text.py``) shows a
replayed file's name arriving as text in the export's error; these are the other plain-text answers.
"""

from __future__ import annotations

import urllib.error
import urllib.request

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


def test_the_login_form_holds_the_page_asked_for_as_text() -> None:
    markup = '"><svg/onload=alert(1)>'
    with nvdash_server(["--simulate", "t4", "--no-history", "--token", "s3cret"]) as server:
        asked = http_get(f"{server.url}/login?next=/GPU-Memory{markup}")
        refused = urllib.request.Request(f"{server.url}/GPU-Memory?x={markup}", headers={"Accept": "text/html"})
        try:
            urllib.request.urlopen(refused, timeout=10)
            raise AssertionError("a page was served without the token")
        except urllib.error.HTTPError as error:
            login = (error.code, error.read().decode("utf-8"))
    for body in (asked[1], login[1]):
        assert "<svg" not in body
        assert "&#34;&gt;&lt;svg/onload=alert(1)&gt;" in body, body
    assert (asked[0], login[0]) == (200, 403)
