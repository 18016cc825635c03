"""The cluster poller against a broken Prometheus on a real loopback socket: every bad answer becomes a one-line
reason within the deadline, the thread lives on, and a good answer afterwards is used again."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from nvdash.cluster.model import ClusterState
from nvdash.cluster.poller import THREAD, ClusterPoller
from nvdash.cluster.promapi import MAX_BODY_BYTES, PrometheusClient
from nvdash.supervision import Supervisor
from tests.conftest import wait_for
from tests.unit.rogue_prometheus import (
    GOOD,
    Behaviour,
    RoguePrometheus,
    http_answer,
    json_answer,
    rogue_prometheus,
    vector,
)

SLACK_S = 10.0
"""Beyond the deadline, how long a refresh may take on a loaded machine before the test calls it a hang."""
MALFORMED = "answered a malformed result: "


BAD_ANSWERS: dict[str, tuple[bytes, str]] = {
    "numbers as series": (vector(1, 2), MALFORMED + "result[0] is 1, not a series object"),
    "html": (http_answer(b"<html>login</html>", content_type="text/html"), "did not answer with Prometheus API JSON"),
    "invalid utf-8": (http_answer(b'{"status": "\xff\xfe"}'), "did not answer with Prometheus API JSON"),
    "nested too deep": (http_answer(b"[" * 200_000), "did not answer with Prometheus API JSON"),
    "a json list": (json_answer([1]), "refused the query: no data"),
    "no data": (json_answer({"status": "success"}), "refused the query: no data"),
    "no result type": (json_answer({"status": "success", "data": {}}), "answered a None to an instant query"),
    "result an object": (json_answer({"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}),
                         MALFORMED + "result is {'a': 1}, not a list"),
    "label a number": (vector({"metric": {"gpu": 0}, "value": [1, "1"]}),
                       MALFORMED + "result[0].metric label 'gpu' is 0, not a string"),
    "labels a list": (vector({"metric": [], "value": [1, "1"]}), MALFORMED + "result[0].metric is [], not an object"),
    "no value": (vector({"metric": {}}), MALFORMED + 'result[0].value is None, not a [time, "value"] pair'),
    "value a string": (vector({"metric": {}, "value": "7"}),
                       MALFORMED + "result[0].value is '7', not a [time, \"value\"] pair"),
    "value a number": (vector({"metric": {}, "value": [1, 7]}), MALFORMED + "result[0].value value 7 is not a string"),
    "value not numeric": (vector({"metric": {}, "value": [1, "seven"]}),
                          MALFORMED + "result[0].value value 'seven' is not a number"),
    "scalar malformed": (json_answer({"status": "success", "data": {"resultType": "scalar", "result": "x"}}),
                         MALFORMED + "result is 'x', not a [time, \"value\"] pair"),
    "long error": (http_answer(json.dumps({"status": "error", "errorType": "internal", "error": "oops\n" * 20_000})
                               .encode(), status="500 Internal Server Error"),
                   "refused the query: internal: oops oops"),
    "not http": (b"garbage\r\n\r\n", "did not answer with HTTP: BadStatusLine"),
    "length beyond the cap": (f"HTTP/1.1 200 OK\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n{{}}".encode(),
                              f"answered more than {MAX_BODY_BYTES // 2**20} MiB; ask for fewer series"),
}


@pytest.fixture
def rogue() -> Iterator[tuple[str, RoguePrometheus]]:
    with rogue_prometheus() as running:
        yield running


def refresh_within(poller: ClusterPoller) -> tuple[ClusterState, float]:
    """One refresh on its own thread, and how long it took; fails when it outlives the deadline by ``SLACK_S``."""
    result: list[ClusterState] = []
    began = time.monotonic()
    worker = threading.Thread(target=lambda: result.append(poller.refresh()), daemon=True)
    worker.start()
    worker.join(poller.client.timeout_s + SLACK_S)
    assert not worker.is_alive(), f"refresh still running {poller.client.timeout_s + SLACK_S:g} s later"
    return result[0], time.monotonic() - began


def assert_one_line(state: ClusterState, expected: str) -> None:
    assert state.error is not None
    assert expected in state.error, state.error
    assert "\n" not in state.error
    assert len(state.error) < 500


@pytest.mark.parametrize("name", list(BAD_ANSWERS))
def test_each_bad_answer_is_a_one_line_reason_and_a_good_one_is_used_again(
        rogue: tuple[str, RoguePrometheus], name: str) -> None:
    url, server = rogue
    poller = ClusterPoller(PrometheusClient(url, timeout_s=5.0))
    server.behaviour = Behaviour(raw=BAD_ANSWERS[name][0])
    state, _ = refresh_within(poller)
    assert_one_line(state, BAD_ANSWERS[name][1])
    assert state.error.startswith((f"Prometheus at {url} ", f"{url} "))
    assert state.ok_time_s is None
    server.behaviour = Behaviour()
    state, _ = refresh_within(poller)
    assert state.error is None
    assert [(gpu.hostname, gpu.index, gpu.utilization_pct) for gpu in state.gpus] == [("node-a", 0, 42.0)]


def test_nan_and_inf_readings_are_unknown_not_a_crash(rogue: tuple[str, RoguePrometheus]) -> None:
    url, server = rogue
    gpu = {"Hostname": "node-a", "gpu": "0", "UUID": "GPU-a-0", "modelName": "NVIDIA H100 80GB HBM3"}
    readings = {"DCGM_FI_DEV_GPU_UTIL": "NaN", "DCGM_FI_DEV_FB_USED": "+Inf", "DCGM_FI_DEV_FB_FREE": "1e400",
                "DCGM_FI_DEV_GPU_TEMP": "-Inf", "DCGM_FI_DEV_PCIE_LINK_GEN": "+Inf", "DCGM_FI_DEV_POWER_USAGE": "300"}
    items = [{"metric": {"__name__": name, **gpu}, "value": [1.0, value]} for name, value in readings.items()]
    # A gpu label of digits Python's int() refuses ("²" is a digit to str.isdigit) is not a GPU of the node.
    items.append({"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", **gpu, "gpu": "²"}, "value": [1.0, "5"]})
    server.behaviour = Behaviour(raw=vector(*items))
    state, _ = refresh_within(ClusterPoller(PrometheusClient(url, timeout_s=5.0)))
    assert state.error is None
    assert len(state.gpus) == 1
    found = state.gpus[0]
    assert (found.utilization_pct, found.memory_used_bytes, found.memory_total_bytes) == (None, None, None)
    assert found.value("DCGM_FI_DEV_GPU_TEMP") is None
    assert found.value("DCGM_FI_DEV_POWER_USAGE") == 300.0


def test_an_answer_beyond_the_size_cap_is_abandoned(rogue: tuple[str, RoguePrometheus]) -> None:
    url, server = rogue
    # Valid JSON (whitespace, then a good answer), without a Content-Length: only counting the bytes finds it.
    server.behaviour = Behaviour(raw=json.dumps(GOOD).encode(), stream_bytes=MAX_BODY_BYTES + 2**20)
    poller = ClusterPoller(PrometheusClient(url, timeout_s=30.0))
    state, _ = refresh_within(poller)
    assert_one_line(state, f"Prometheus at {url} answered more than 64 MiB; ask for fewer series")
    server.behaviour = Behaviour()
    assert refresh_within(poller)[0].error is None


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_server_dripping_bytes_is_cut_off_at_the_deadline(rogue: tuple[str, RoguePrometheus], where: str) -> None:
    url, server = rogue
    answer = json_answer(GOOD)
    split = answer.index(b"\r\n\r\n") + 4 if where == "body" else 0
    # A byte every 0.2 s: each read is well within the socket's timeout, the whole answer takes minutes.
    server.behaviour = Behaviour(raw=answer[:split], drip=answer[split:], drip_every_s=0.2)
    poller = ClusterPoller(PrometheusClient(url, timeout_s=1.5))
    state, elapsed_s = refresh_within(poller)
    assert_one_line(state, f"Prometheus at {url} did not answer within 1.5 s")
    print(f"drip in the {where}: refresh returned after {elapsed_s:.2f} s (deadline 1.5 s)")
    server.behaviour = Behaviour()
    assert refresh_within(poller)[0].error is None


def test_the_supervised_thread_outlives_every_bad_answer_and_recovers(rogue: tuple[str, RoguePrometheus]) -> None:
    url, server = rogue
    supervisor = Supervisor()
    poller = ClusterPoller(PrometheusClient(url, timeout_s=2.0), refresh_s=0.05, supervisor=supervisor)
    poller.start()
    try:
        poller.want()
        for name, (raw, expected) in BAD_ANSWERS.items():
            server.behaviour = Behaviour(raw=raw)
            state = wait_for(poller.state, lambda found, e=expected: found.error is not None and e in found.error,
                             timeout_s=30)
            assert "\n" not in state.error, name
        server.behaviour = Behaviour(raw=b"", drip=json_answer(GOOD), drip_every_s=0.2)
        wait_for(poller.state, lambda found: found.error is not None and "did not answer within 2 s" in found.error,
                 timeout_s=30)
        server.behaviour = Behaviour()
        state = wait_for(poller.state, lambda found: found.error is None, timeout_s=30)
        assert [gpu.utilization_pct for gpu in state.gpus] == [42.0]
        report = supervisor.report()[THREAD]
        assert report["running"] is True
        assert report["deaths"] == 0
        assert report["last_beat_at"] is not None
        assert supervisor.overdue() == []
    finally:
        poller.stop()
    assert supervisor.report()[THREAD]["running"] is False


def test_the_idle_thread_still_beats(rogue: tuple[str, RoguePrometheus]) -> None:
    url, server = rogue
    supervisor = Supervisor()
    poller = ClusterPoller(PrometheusClient(url, timeout_s=1.0), refresh_s=0.05, supervisor=supervisor)
    poller.start()
    try:
        first = wait_for(lambda: supervisor.report()[THREAD]["last_beat_at"], lambda beat: beat is not None)
        wait_for(lambda: supervisor.report()[THREAD]["last_beat_at"], lambda beat: beat != first)
        assert server.requests == 0  # no page wants the cluster: Prometheus is not asked
    finally:
        poller.stop()
