"""A pane nobody can see gets no updates, and catches up at once when it is seen again."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from tests.browser.chromium import chromium, wait_until_drawn
from tests.conftest import nvdash_server, wait_for

pytestmark = pytest.mark.browser


def _streamed_rows(payload: str | bytes) -> int | None:
    """The rows a websocket frame streams into a source, or ``None`` when it streams nothing."""
    if isinstance(payload, bytes) or '"ColumnsStreamed"' not in payload:
        return None
    content: Any = json.loads(payload)
    for event in content.get("events", []):
        if event.get("kind") == "ColumnsStreamed":
            times = event["data"]["entries"] if isinstance(event["data"], dict) and "entries" in event["data"] \
                else event["data"]
            for entry in times if isinstance(times, list) else []:
                if isinstance(entry, list) and entry and entry[0] == "time":
                    values = entry[1]
                    return len(values) if isinstance(values, list) else int(values.get("shape", [0])[0])
    return None


def test_a_hidden_pane_is_not_updated_and_catches_up_when_shown() -> None:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25", "--no-history"]) as server, \
            chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        lock = threading.Lock()
        streams: list[int] = []

        def on_frame(payload: str | bytes) -> None:
            rows = _streamed_rows(payload)
            if rows is not None:
                with lock:
                    streams.append(rows)

        page.on("websocket", lambda socket: socket.on("framereceived", on_frame))
        # The dashboard in a frame, as a JupyterLab pane shows it: framed by a page of the same origin (the
        # pane's page is Jupyter's, which proxies nvdash), as the server's frame-ancestors policy requires.
        page.goto(server.url + "/health")
        page.set_content(f'<iframe id="pane" src="{server.url}/GPU-Resources" style="width:1100px;height:800px">'
                         "</iframe>")
        frame = wait_for(lambda: next((f for f in page.frames if f.url.endswith("/GPU-Resources")), None),
                         lambda found: found is not None)
        assert frame is not None
        wait_until_drawn(frame)

        def received() -> list[int]:
            page.wait_for_timeout(100)  # Playwright delivers the frames received meanwhile only while called
            with lock:
                return list(streams)

        wait_for(received, lambda rows: len(rows) >= 3)  # live: a row or two per update
        # Hidden as a JupyterLab tab behind another is: the frame is not displayed.
        page.evaluate("document.getElementById('pane').style.display = 'none'")
        hidden_at = server.health()["store"]["last_seq"]
        wait_for(lambda: server.health()["store"]["last_seq"], lambda seq: seq >= hidden_at + 12, timeout_s=60)
        seen = len(received())
        page.evaluate("document.getElementById('pane').style.display = 'block'")

        # Shown again: one update brings every row the pane missed (a visible pane never gets ten at once).
        after = wait_for(lambda: received()[seen:], lambda rows: any(count >= 10 for count in rows), timeout_s=30)
        assert max(after) >= 10
        page.close()
