"""Every simulated machine serves every dashboard it offers, and the snapshot, without an error."""

from __future__ import annotations

from bokeh.client import ClientSession

from tests.conftest import get_json, http_get, nvdash_server, wait_for
from tests.server.bokeh_viewer import open_session, receive_for, source_data
from tests.server.test_server import STATIC_ROUTES


def _has_data(session: ClientSession) -> bool:
    """Whether any data source of the session's document has a row."""
    return any(any(len(column) for column in source.values()) for source in source_data(session))


def _receives_data(session: ClientSession) -> bool:
    """Whether the session has a row after applying what the server pushed for a moment."""
    receive_for(session, 0.2)
    return _has_data(session)


def _every_offered_dashboard_opens_with_data(profile: str, gpus: int, nvlink: bool, gpm: bool) -> None:
    with nvdash_server(["--simulate", profile, "--interval", "0.25"]) as server:
        wait_for(lambda: server.health()["store"]["rows"], lambda rows: rows >= 4)
        index = get_json(server.url + "/index.json")
        assert ("/NVLink-Throughput" in index) is nvlink
        assert ("/GPU-Topology" in index) is (gpus >= 2)
        assert {"/GPU-Health", "/GPU-Details", "/Machine-Resources"} <= set(index)
        for route in index:
            assert http_get(server.url + route)[0] == 200, route
            session = open_session(server.url, route)
            try:
                if route in STATIC_ROUTES:  # a static page sends nothing after it opens
                    assert _has_data(session), route
                else:
                    wait_for(lambda session=session: _receives_data(session), bool)
            finally:
                session.close()
        snapshot = get_json(server.url + "/api/snapshot.json")
        assert len(snapshot["gpus"]) == gpus
        assert all(gpu["gpm_supported"] is gpm for gpu in snapshot["gpus"])
        assert all(gpu["health"]["status"] in ("ok", "warning", "critical") for gpu in snapshot["gpus"])
        assert server.health()["sampler"]["errors"] == 0
        assert "Traceback" not in server.output()


# One class per machine: the parallel test run hands each class to a worker of its own (each starts its own server).
class TestDgxA100:
    def test_every_offered_dashboard_opens_with_data(self) -> None:
        _every_offered_dashboard_opens_with_data("dgx-a100", 8, nvlink=True, gpm=False)


class TestDgxB200:
    def test_every_offered_dashboard_opens_with_data(self) -> None:
        _every_offered_dashboard_opens_with_data("dgx-b200", 8, nvlink=True, gpm=True)


class TestA100Pcie2:
    def test_every_offered_dashboard_opens_with_data(self) -> None:
        _every_offered_dashboard_opens_with_data("a100-pcie-2", 2, nvlink=False, gpm=False)


class TestT4:
    def test_every_offered_dashboard_opens_with_data(self) -> None:
        _every_offered_dashboard_opens_with_data("t4", 1, nvlink=False, gpm=False)
