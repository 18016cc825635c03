"""The day's queries over the recording rules' series, within the series scope and by the configured host label,
and the fleet poller's choice between them and the raw ones: asked of Prometheus at most every ``recheck_s``, and
told in each answer."""

from __future__ import annotations

from nvdash.cluster.fleet import RECORDED_WINDOW, fleet_queries
from nvdash.cluster.fleet_poller import FleetPoller
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.recorded import NODE_GPUS, RULES_INFO, XID_NONZERO, presence_query
from nvdash.cluster.selectors import SeriesScope
from tests.unit.rogue_prometheus import Behaviour, rogue_prometheus, vector

NOW = 1_800_000_000.0


def test_the_recorded_queries_read_the_recorded_series_within_the_scope() -> None:
    queries = fleet_queries(SeriesScope(matchers=('job="nvdash"', 'cluster=~"east|west"')), recorded=True)
    scoped = 'job="nvdash", cluster=~"east|west"'
    assert queries.recorded is True
    assert queries.xids == (
        f"count by (Hostname, hostname) (count by (Hostname, hostname, UUID, err_code) ("
        f"max_over_time({XID_NONZERO}{{{scoped}}}[24h])))")
    assert queries.xid_gpus == (
        f"count by (Hostname, hostname) (count by (Hostname, hostname, UUID) ("
        f"max_over_time({XID_NONZERO}{{{scoped}}}[24h])))")
    assert queries.gpus_now == f"sum by (Hostname, hostname) ({NODE_GPUS}{{{scoped}}})"
    assert queries.gpus_day_ago == (
        f"sum by (Hostname, hostname) (max_over_time({NODE_GPUS}{{{scoped}}}[15m] offset 1d))")
    assert fleet_queries(SeriesScope(matchers=('job="nvdash"',))).recorded is False


def test_the_recorded_queries_group_by_a_custom_host_label() -> None:
    queries = fleet_queries(SeriesScope(host_label="node"), recorded=True)
    assert queries.xids == (f"count by (node) (count by (node, UUID, err_code) (max_over_time({XID_NONZERO}[24h])))")
    assert queries.gpus_now == f"sum by (node) ({NODE_GPUS})"
    assert all("Hostname" not in query and "hostname" not in query for query in queries.all())


def test_the_presence_query_asks_for_the_marker_of_this_version_a_window_ago() -> None:
    assert presence_query("24h15m") == f'count({RULES_INFO}{{version="1"}} offset 24h15m)'
    assert RECORDED_WINDOW == "24h15m"


def test_the_poller_asks_whether_the_rules_cover_the_day_at_most_every_recheck_s() -> None:
    clock = [NOW]
    with rogue_prometheus() as (url, rogue):
        # Every query answers nothing: no marker a day back, so the raw queries.
        rogue.behaviour = Behaviour(raw=vector())
        poller = FleetPoller(PrometheusClient(url, timeout_s=2.0), clock=lambda: clock[0], recheck_s=300.0)
        first = poller.refresh()
        assert (first.recorded, first.error, rogue.requests) == (False, None, 1 + 4)
        # The marker appears; within recheck_s the poller does not ask again.
        rogue.behaviour = Behaviour(raw=vector({"metric": {"Hostname": "node-a"}, "value": [NOW, "2"]}))
        clock[0] += 299.0
        second = poller.refresh()
        assert (second.recorded, dict(second.xids), rogue.requests) == (False, {"node-a": 2}, 1 + 4 + 4)
        clock[0] += 1.0
        third = poller.refresh()
        assert (third.recorded, dict(third.gpus_now), rogue.requests) == (True, {"node-a": 2}, 1 + 4 + 4 + 1 + 4)
        # The rules gone: the next check goes back to the raw queries.
        rogue.behaviour = Behaviour(raw=vector())
        clock[0] += 300.0
        assert poller.refresh().recorded is False
