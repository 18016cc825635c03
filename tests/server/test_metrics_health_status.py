"""``nvdash_gpu_health_status`` on a real server: per GPU, the status the node's own health verdict gives it."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.conftest import nvdash_server, wait_for

FAMILY = "nvdash_gpu_health_status"
RANKS = {"ok": 0, "warning": 1, "critical": 2}
FAULTS = {"NVDASH_FAKE_FAULTS": "xid:13:6@1;xid:46:1@1;lose:5@1"}
"""GPU 6 a warning XID and GPU 1 a critical one (the event log alone judges them), GPU 5 lost; dgx-h100's GPU 3
runs its PCIe link at x8 (a warning from its readings)."""
ARGS = ["--simulate", "dgx-h100", "--interval", "0.25", "--no-history"]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _exported(url: str, host_label: str = "Hostname") -> dict[str, float]:
    """GPU index -> the family's value, from one scrape parsed by prometheus_client's parser."""
    values: dict[str, float] = {}
    for family in parse_text(_get(url + "/metrics")):
        if family.name == FAMILY:
            assert family.type == "gauge"
            assert "Health page" in family.documentation
            for sample in family.samples:
                assert sample.labels[host_label] == "node-h"
                assert sample.labels["UUID"].startswith("GPU-")
                assert sample.labels["device"] == f"nvidia{sample.labels['gpu']}"
                values[sample.labels["gpu"]] = sample.value
    return values


def _judged(url: str) -> dict[str, float]:
    """GPU index -> the rank of the status the node's own snapshot API (the Health page's verdict) gives it."""
    doc = json.loads(_get(url + "/api/snapshot.json"))
    return {str(gpu["index"]): float(RANKS[gpu["health"]["status"]]) for gpu in doc["gpus"]}


def _agreeing(url: str, host_label: str = "Hostname") -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """A scrape, the health verdict, and a second scrape (equal when nothing changed in between)."""
    return _exported(url, host_label), _judged(url), _exported(url, host_label)


def _faults_judged(found: tuple[dict[str, float], dict[str, float], dict[str, float]]) -> bool:
    before, judged, after = found
    return (before == judged == after and judged.get("5") == 2 and judged.get("1") == 2 and judged.get("6") == 1
            and 0 in judged.values())


def test_every_gpus_health_status_is_the_nodes_own_verdict() -> None:
    with nvdash_server([*ARGS, "--hostname", "node-h"], env=FAULTS) as server:
        before, judged, _after = wait_for(lambda: _agreeing(server.url), _faults_judged, timeout_s=60.0)
        assert sorted(before, key=int) == [str(gpu) for gpu in range(8)]
        assert before == judged
        assert before["5"] == 2, "a lost GPU is critical"
        assert before["1"] == 2, "a critical XID from the event log"
        assert before["6"] == 1, "a warning XID from the event log"
        assert before["3"] == 1, "PCIe running at x8"
        assert 0 in before.values()


def test_the_name_stays_under_dcgm_exporter_4_9_naming() -> None:
    with nvdash_server([*ARGS, "--hostname", "node-h", "--metrics-compat", "4.9"], env=FAULTS) as server:
        before, judged, _after = wait_for(lambda: _agreeing(server.url, "hostname"), _faults_judged, timeout_s=60.0)
        assert before == judged
        text = _get(server.url + "/metrics")
        assert "Hostname=" not in text
        assert 'nvdash_gpu_health_status{' in text
