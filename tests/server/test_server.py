"""A real ``python -m nvdash --simulate dgx-h100`` on a free port: pages, JSON, dashboards, security."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest
from bokeh.client import ClientSession
from bokeh.models import ColumnDataSource
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from tests.conftest import NvdashServer, get_json, http_get, nvdash_server, wait_for
from tests.server.bokeh_viewer import fingerprint, open_session, receive_for, source_data

ROUTES = {
    "/GPU-Utilization": "GPU Utilization",
    "/GPU-Memory": "GPU Memory",
    "/GPU-Processes": "GPU Processes",
    "/GPU-Accounting": "GPU Accounting",
    "/GPU-Resources": "GPU Resources",
    "/GPU-Health": "GPU Health",
    "/GPU-Details": "GPU Details",
    "/PCIe-Throughput": "PCIe Throughput",
    "/NVLink-Throughput": "NVLink Throughput",
    "/NVLink-Timeline": "NVLink Timeline",
    "/GPU-Topology": "GPU Topology",
    "/Machine-Resources": "Machine Resources",
}
STATIC_ROUTES = frozenset({"/GPU-Topology", "/GPU-Accounting"})
"""Dashboards that stream no live data: the topology does not change while the server runs, the accounting is
read again only every 30 s (see ``test_accounting_page_fills_its_table_and_links_the_csv``)."""
LIVE_ROUTES = [route for route in ROUTES if route not in STATIC_ROUTES]
JUPYTER_ROUTES = {**ROUTES, "/GPU-Memory-by-Notebook": "GPU Memory by Notebook"}
"""What nvdash offers when a Jupyter server started it (the proxy gives it the server's kernels file)."""


@pytest.fixture(scope="module")
def server() -> Iterator[NvdashServer]:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.2"]) as running:
        yield running


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            self.sources.append(str(values["src"]))
        if tag == "link" and values.get("href"):
            self.links.append(str(values["href"]))


def test_index_json_lists_every_dashboard_in_order(server: NvdashServer) -> None:
    index = get_json(server.url + "/index.json")
    assert index == ROUTES
    assert list(index) == list(ROUTES)


def test_info_json_describes_the_simulated_gpus(server: NvdashServer) -> None:
    info = get_json(server.url + "/info.json")
    assert info["simulated"] == "dgx-h100"
    assert [gpu["index"] for gpu in info["gpus"]] == list(range(8))
    assert {gpu["name"] for gpu in info["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    gpu = info["gpus"][0]
    assert gpu["memory_total_bytes"] == 81559 * 2**20
    assert (gpu["pcie_generation"], gpu["pcie_width"]) == (5, 16)
    assert gpu["pcie_max_bytes_per_s"] == pytest.approx(16 * 32e9 * 128 / 130 / 8)
    assert gpu["nvlink_links"] == 18
    # NVIDIA's H100 figure: 18 links x 25 GB/s of data per direction; the driver's speed field (26,562 MB/s per
    # link, as `nvidia-smi nvlink -s` shows) is the signalling rate.
    assert gpu["nvlink_max_bytes_per_s"] == pytest.approx(18 * 25e9)
    assert gpu["nvlink_version"] == "4.0"
    assert gpu["pci_bus_id"].endswith(":00.0")


def test_index_page_shows_host_gpus_and_links(server: NvdashServer) -> None:
    status, body, headers = http_get(server.url + "/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    info = get_json(server.url + "/info.json")
    assert info["hostname"] in body
    assert body.count("NVIDIA H100 80GB HBM3") == 8
    assert "79.6 GiB" in body
    assert "simulated" in body
    for route, title in ROUTES.items():
        assert f'href="{route}"' in body
        assert title in body


@pytest.mark.parametrize("route", list(ROUTES))
def test_route_page_loads_bokeh_from_this_server_only(server: NvdashServer, route: str) -> None:
    status, body, _ = http_get(server.url + route)
    assert status == 200
    parser = _Scripts()
    parser.feed(body)
    assert parser.sources, "the page loads no script"
    for src in parser.sources + parser.links:
        assert not re.match(r"^(https?:)?//", src) or src.startswith(server.url), src
        assert "cdn" not in src
    for src in parser.sources:
        url = src if src.startswith("http") else f"http://127.0.0.1:{server.port}{src}"
        assert http_get(url)[0] == 200, url


def _received(session: ClientSession) -> str:
    """The fingerprint of the session's data after applying what the server pushed for half a second."""
    receive_for(session, 0.5)
    return fingerprint(source_data(session))


@pytest.mark.parametrize("route", LIVE_ROUTES)
def test_every_dashboard_streams_data_that_advances(server: NvdashServer, route: str) -> None:
    session = open_session(server.url, route)
    try:
        before = source_data(session)
        assert before, "no data source in the document"
        assert any(any(len(col) for col in source.values()) for source in before), "all sources are empty"
        # The simulated job has data-loader stalls of a few seconds with no traffic at all: wait past one.
        wait_for(lambda: _received(session), lambda after: after != fingerprint(before))
    finally:
        session.close()


def test_accounting_page_fills_its_table_and_links_the_csv(server: NvdashServer) -> None:
    session = open_session(server.url, "/GPU-Accounting")
    try:
        def owners() -> list[str]:
            receive_for(session, 0.2)
            (source,) = session.document.select({"type": ColumnDataSource, "name": "accounting"})
            return list(source.data["key"])

        assert wait_for(owners, bool) == ["unknown"]  # the simulated processes' user, whom no system names
        (link,) = session.document.select({"name": "csv"})
        found = re.search(r'href="([^"]+)"', link.text)
        assert found is not None, link.text
        href = found.group(1).replace("&amp;", "&")
        assert href == "api/accounting.csv?range=7d&by=job"  # relative: under any prefix or proxy
        status, body, _ = http_get(f"{server.url}/{href}")
        assert status == 200
        assert body.splitlines()[0].startswith("job,kinds,gpus,gpu_hours,")
        assert body.splitlines()[1].startswith("unknown,user,")
    finally:
        session.close()


def test_timelines_are_backfilled_when_a_pane_opens(server: NvdashServer) -> None:
    rows = wait_for(lambda: server.health()["store"]["rows"], lambda rows: rows >= 5)
    session = open_session(server.url, "/Machine-Resources")
    try:
        lengths = [len(next(iter(source.values()))) for source in source_data(session) if source]
        assert max(lengths) >= rows
    finally:
        session.close()


def test_websocket_from_a_foreign_origin_is_refused(server: NvdashServer) -> None:
    async def connect(origin: str) -> int:
        request = HTTPRequest(f"ws://127.0.0.1:{server.port}/GPU-Utilization/ws", headers={"Origin": origin})
        try:
            connection = await websocket_connect(request)
        except HTTPClientError as error:
            return error.code
        connection.close()
        return 101

    assert IOLoop.current().run_sync(lambda: connect("http://evil.example:8000")) == 403


def test_unknown_route_is_a_plain_404(server: NvdashServer) -> None:
    status, _, _ = http_get(server.url + "/No-Such-Dashboard")
    assert status == 404


def test_health_reports_the_sampler_keeping_up(server: NvdashServer) -> None:
    started = time.monotonic()
    first = server.health()
    first_calls = get_json(server.url + "/api/simulation.json")["fake_nvml_calls"]
    second = wait_for(server.health, lambda h: h["sampler"]["sweeps"] >= first["sampler"]["sweeps"] + 3)
    elapsed_s = time.monotonic() - started
    assert second["sampler"]["interval_s"] == 0.2
    # Sweeps may come late on a busy machine, never early: at most one per interval (and the one under way).
    sweeps = second["sampler"]["sweeps"] - first["sampler"]["sweeps"]
    assert sweeps <= elapsed_s // 0.2 + 2
    # The store holds one row per sweep (a sweep appends its row before it counts itself).
    for health in (first, second):
        assert health["sampler"]["sweeps"] <= health["store"]["last_seq"] <= health["sampler"]["sweeps"] + 1
    assert second["sampler"]["errors"] == 0
    assert second["store"]["capacity"] == 1200
    assert get_json(server.url + "/api/simulation.json")["fake_nvml_calls"] > first_calls
    assert "fake_nvml_calls" not in second, "the simulated library's counts are its own route's, not /health's"
    assert first["started_at"] == second["started_at"] < time.time()
