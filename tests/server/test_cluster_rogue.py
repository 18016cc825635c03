"""A real nvdash with ``--prometheus`` pointing at a broken Prometheus: the reason is on ``/health`` and on the
cluster page, the poller's thread keeps running, and a good answer afterwards is shown again."""

from __future__ import annotations

from bokeh.models import Div

from tests.conftest import http_get, nvdash_server, wait_for
from tests.server.bokeh_viewer import open_session
from tests.unit.rogue_prometheus import Behaviour, rogue_prometheus, vector


def status_line(url: str) -> str:
    """The cluster status line of a cluster page a viewer opens now (the Div that says where readings come from,
    not the node history's)."""
    session = open_session(url, "/Cluster-Nodes")
    try:
        texts = [div.text for div in session.document.select({"type": Div})
                 if "Prometheus down or slow" in div.text or div.text.startswith("Prometheus at ")]
    finally:
        session.close()
    assert len(texts) == 1, texts
    return str(texts[0])


def test_a_broken_prometheus_is_explained_and_survived_by_the_server() -> None:
    with rogue_prometheus() as (url, rogue):
        rogue.behaviour = Behaviour(raw=vector(1, 2))
        with nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url]) as server:
            assert http_get(server.url + "/Cluster-Nodes")[0] == 200  # a page wants the cluster: the poller asks
            reason = f"Prometheus at {url} answered a malformed result: result[0] is 1, not a series object"
            health = wait_for(server.health, lambda found: found["cluster"]["error"] == reason, timeout_s=60)
            assert health["cluster"]["prometheus"] == url
            assert health["cluster"]["last_answer_at"] is None
            assert health["threads"]["nvdash-cluster"]["running"] is True
            line = status_line(server.url)
            assert "Prometheus down or slow" in line
            assert reason in line
            rogue.behaviour = Behaviour()
            health = wait_for(server.health, lambda found: found["cluster"]["error"] is None, timeout_s=60)
            assert health["cluster"]["last_answer_at"] is not None
            line = status_line(server.url)
            assert line.startswith(f"Prometheus at {url} · "), line
            assert "updated" in line
            threads = server.health()["threads"]["nvdash-cluster"]
            assert (threads["running"], threads["deaths"]) == (True, 0)
