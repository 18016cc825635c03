"""The 4.9 alert rules on a real Prometheus (Debian's package) scraping a real nvdash run with ``--metrics-compat 4.9``:
every family the rules read is there under the name they use, and an injected XID fires the XID rules, labelled
``hostname``, while the 4.8 rules' input is gone (they would be silent)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import get_json, nvdash_server, wait_for
from tests.prometheus_cluster import firing_alerts, query, run_prometheus

RULES_4_9 = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "nvdash-alerts-4.9.yml"
NOT_ON_THIS_NODE = {"DCGM_FI_DEV_RETIRED_PENDING"}
"""Families a DGX H100 does not export: page retirement is for GPUs before Ampere (Hopper remaps rows instead), and
the family is off in the default counters file, as in dcgm-exporter's."""


def families_read(path: Path) -> set[str]:
    """The families named in the rules (expressions and ``query`` templates), comments left out."""
    body = path.read_text(encoding="utf-8").split("\ngroups:", 1)[1]
    lines = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))
    return set(re.findall(r"\b(?:DCGM_FI_\w+|nvdash_\w+)\b", lines))


@pytest.fixture
def prometheus_4_9(tmp_path: Path) -> Iterator[str]:
    """Prometheus with the 4.9 rules, scraping a simulated DGX H100 (every family the rules read) named node-b with
    an XID 48 on GPU 0 after 3 s; yields Prometheus's URL once it has scraped the XID."""
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.5", "--no-history", "--hostname", "node-b",
                        "--metrics-compat", "4.9"], env={"NVDASH_FAKE_FAULTS": "xid:48:0@3"}) as server, \
            run_prometheus(tmp_path, [f"127.0.0.1:{server.port}"], rules=RULES_4_9) as url:
        wait_for(lambda: query(url, "DCGM_FI_DEV_XID_ERROR > 0"), bool, timeout_s=90.0)
        yield url


def test_the_4_9_rules_fire_on_a_4_9_node(prometheus_4_9: str) -> None:
    url = prometheus_4_9
    wanted = families_read(RULES_4_9) - NOT_ON_THIS_NODE
    per_family = query(url, 'count by (__name__) ({__name__=~"DCGM_FI_.+|nvdash_.+"})')
    exported = {row["metric"]["__name__"] for row in per_family}
    assert not wanted - exported, f"the 4.9 rules read families the node does not export: {sorted(wanted - exported)}"
    rules = {rule["name"] for group in get_json(url + "/api/v1/rules")["data"]["groups"] for rule in group["rules"]}
    assert "NvdashGpuCriticalXid" in rules

    alerts = wait_for(lambda: firing_alerts(url), lambda found: {a["labels"]["alertname"] for a in found}
                      >= {"NvdashGpuXidError", "NvdashGpuCriticalXid"}, timeout_s=90.0)
    critical = [alert for alert in alerts if alert["labels"]["alertname"] == "NvdashGpuCriticalXid"]
    assert [(a["labels"]["hostname"], a["labels"]["gpu"], a["labels"]["err_code"]) for a in critical] == [
        ("node-b", "0", "48")]
    assert "Hostname" not in critical[0]["labels"]
    assert critical[0]["annotations"]["summary"] == "GPU 0 on node-b reported critical XID 48"
    # What the 4.8 rules read is not there: loaded against this node, they would stay silent.
    assert query(url, "DCGM_FI_DEV_XID_ERRORS") == []
    assert query(url, '{Hostname!=""}') == []
