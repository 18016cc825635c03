"""A real Prometheus (Debian's package) scraping three simulated nvdash nodes, with nvdash's alert rules loaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.conftest import NvdashServer, free_port, get_json, http_get, nvdash_server, wait_for

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "nvdash-alerts.yml"
NODES = {
    "node-a": (["--simulate", "dgx-h100"], {}, 8),
    "node-b": (["--simulate", "a100-pcie-2"], {"NVDASH_FAKE_FAULTS": "xid:48:0@3"}, 2),
    "node-c": (["--simulate", "t4"], {}, 1),
}


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("prometheus is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, NvdashServer]]]:
    root = tmp_path_factory.mktemp("prometheus")
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(nvdash_server([*args, "--interval", "0.5", "--no-history", "--hostname", name],
                                                    env=env))
            for name, (args, env, _count) in NODES.items()
        }
        targets = [f"127.0.0.1:{server.port}" for server in servers.values()]
        config = root / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {RULES}\n"
            f"scrape_configs:\n  - job_name: nvdash\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        port = free_port()
        log = (root / "prometheus.log").open("w")
        process = subprocess.Popen(
            [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _status(url + "/-/ready"), lambda status: status == 200, timeout_s=60.0)
            yield url, servers
        finally:
            process.terminate()
            process.wait(20)
            log.close()


def _status(url: str) -> int:
    try:
        return http_get(url)[0]
    except OSError:
        return 0


def query(url: str, promql: str) -> list[dict[str, Any]]:
    answer = get_json(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def test_every_node_and_gpu_is_scraped(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster
    result = wait_for(lambda: query(url, "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"),
                      lambda rows: len(rows) == 3, timeout_s=90.0)
    counts = {row["metric"]["Hostname"]: int(row["value"][1]) for row in result}
    assert counts == {name: count for name, (_args, _env, count) in NODES.items()}


def test_every_exported_family_is_queryable_with_its_labels(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, servers = cluster
    for name, server in servers.items():
        status, text, _ = http_get(server.url + "/metrics")
        assert status == 200
        families = {family.name: family for family in parse_text(text) if family.samples}
        assert families
        for family_name, family in families.items():
            rows = wait_for(lambda n=family_name, h=name: query(url, f'{n}{{Hostname="{h}"}}'),
                            lambda rows: len(rows) > 0, timeout_s=60.0)
            labels = rows[0]["metric"]
            assert labels["__name__"] == family_name
            assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "instance", "job"} <= set(labels)
            assert labels["job"] == "nvdash"
            assert len(rows) == len(family.samples), family_name


def test_grafana_12239_queries_give_one_series_per_gpu(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster
    for promql in ('max(DCGM_FI_DEV_GPU_TEMP{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, uuid)',
                   'max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, uuid)',
                   'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"node-a", gpu=~".*"} * 1000000) by (Hostname, UUID, gpu)',
                   'max(DCGM_FI_DEV_FB_USED{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, GPU_I_ID, '
                   'GPU_I_PROFILE)',
                   'max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"node-a", gpu=~".*"}) by (Hostname, gpu, '
                   'GPU_I_ID, GPU_I_PROFILE)'):
        rows = wait_for(lambda q=promql: query(url, q), lambda rows: len(rows) == 8, timeout_s=60.0)
        assert sorted(int(row["metric"]["gpu"]) for row in rows) == list(range(8)), promql
    values = {row["metric"]["gpu"]: float(row["value"][1]) for row in query(
        url, 'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"node-a"} * 1000000) by (Hostname, UUID, gpu)')}
    assert all(1e8 < value <= 1980e6 for value in values.values())  # Hz: the H100's SM clock tops out at 1980 MHz


def test_an_injected_xid_fires_the_xid_rules(cluster: tuple[str, dict[str, NvdashServer]]) -> None:
    url, _servers = cluster

    def firing() -> list[dict[str, Any]]:
        alerts = get_json(url + "/api/v1/alerts")["data"]["alerts"]
        return [alert for alert in alerts if alert["state"] == "firing"]

    alerts = wait_for(firing, lambda found: {a["labels"]["alertname"] for a in found}
                      >= {"NvdashGpuXidError", "NvdashGpuCriticalXid"}, timeout_s=90.0)
    critical = [alert for alert in alerts if alert["labels"]["alertname"] == "NvdashGpuCriticalXid"]
    assert [(a["labels"]["Hostname"], a["labels"]["gpu"], a["labels"]["err_code"]) for a in critical] == [
        ("node-b", "0", "48")]
    assert critical[0]["labels"]["severity"] == "critical"
    assert "node-b" in critical[0]["annotations"]["summary"] or "node-b" in critical[0]["annotations"]["description"]
    # Nothing fires on the nodes without an XID.
    assert {a["labels"].get("Hostname") for a in alerts if "Xid" in a["labels"]["alertname"]} == {"node-b"}
