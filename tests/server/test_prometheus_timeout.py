"""``--prometheus-timeout`` reaches the Prometheus client of a real server and of ``nvdash report``: against a
Prometheus that accepts connections and never answers, the failure names the given seconds."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.conftest import http_get, nvdash_env, nvdash_server, wait_for


@contextmanager
def silent_prometheus() -> Iterator[str]:
    """The URL of a TCP server on a free loopback port that takes connections (the kernel completes them into the
    listen backlog) and never answers a request."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_the_cluster_views_wait_the_given_timeout_for_prometheus() -> None:
    with silent_prometheus() as url, nvdash_server(
            ["--simulate", "none", "--no-history", "--prometheus", url, "--prometheus-timeout", "2.5"]) as server:
        assert http_get(server.url + "/Cluster-Nodes")[0] == 200  # a page wants the cluster: the poller asks
        health = wait_for(server.health, lambda found: found["cluster"]["error"] is not None, timeout_s=60)
        assert health["cluster"]["error"] == f"Prometheus at {url} did not answer within 2.5 s"
        assert health["cluster"]["last_answer_at"] is None


def test_report_waits_the_given_timeout_for_prometheus() -> None:
    with silent_prometheus() as url:
        done = subprocess.run(
            [sys.executable, "-m", "nvdash", "report", "--prometheus", url, "--prometheus-timeout", "1.5"],
            env=nvdash_env(None), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == f"nvdash: error: Prometheus at {url} did not answer within 1.5 s"
