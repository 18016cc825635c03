"""/Cluster-Fleet over a real Prometheus: four simulated nodes (two A100 PCIe each) scraped live: one with an injected
XID 48, one that loses a GPU, one whose day-ago history (backfilled with promtool before Prometheus starts) lists a
third GPU it no longer has, and a healthy one. The page, as a Bokeh client pulls it from a server behind
``--prefix``, lists the lost node first, then the XID's, then the one with a GPU fewer than a day ago, with their
counts, and each row's link opens that node's page.

Only the past is backfilled: Prometheus refuses scraped samples older than its newest block's end, so a block
reaching into "now" would stop the live scrapes."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from bokeh.models import ColumnDataSource, DataTable, Div

from tests.conftest import NvdashServer, get_json, http_get, nvdash_server, wait_for
from tests.prometheus_cluster import query, run_prometheus
from tests.server.bokeh_viewer import open_session, receive_for

LIVE: dict[str, dict[str, str]] = {
    "node-a": {},
    "node-b": {"NVDASH_FAKE_FAULTS": "xid:48:0@3"},
    "node-c": {"NVDASH_FAKE_FAULTS": "lose:1@5"},
    "node-d": {},
}
"""The nodes (two A100 PCIe each) and their injected faults."""
DROPPED = "node-d"
GONE_UUID = "GPU-dddddddd-0000-0000-0000-000000000002"
PREFIX = "/nv"


@dataclass
class Fleet:
    prometheus: str
    central: NvdashServer


def backfill(uuids: list[str], now_s: float) -> str:
    """node-d's GPU temperatures every minute from 25 h to 23 h ago: its GPUs ``uuids`` and a third one."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    minute = math.floor(now_s / 60) * 60
    for gpu, uuid in enumerate([*uuids, GONE_UUID]):
        labels = f'Hostname="{DROPPED}",gpu="{gpu}",UUID="{uuid}",modelName="NVIDIA A100-PCIE-40GB"'
        lines += [f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 45 {minute + 60 * k:.0f}" for k in range(-25 * 60, -23 * 60)]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    with ExitStack() as stack:
        nodes = {name: stack.enter_context(nvdash_server(
            ["--simulate", "a100-pcie-2", "--interval", "0.5", "--no-history", "--hostname", name], env=env))
            for name, env in LIVE.items()}
        uuids = [gpu["uuid"] for gpu in get_json(nodes[DROPPED].url + "/info.json")["gpus"]]
        source = root / "node-d.om.txt"
        source.write_text(backfill(uuids, time.time()))
        (root / "data").mkdir()
        done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source),
                               str(root / "data")], capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        targets = [f"127.0.0.1:{node.port}" for node in nodes.values()]
        url = stack.enter_context(run_prometheus(root, targets, rules=False))
        # The day's round is asked when the page opens, then every minute: start it once both faults are scraped.
        wait_for(lambda: query(url, 'max by (Hostname) (DCGM_FI_DEV_XID_ERRORS == 48 or nvdash_gpu_lost == 1)'),
                 lambda rows: {row["metric"]["Hostname"] for row in rows} == {"node-b", "node-c"}, timeout_s=90)
        central = stack.enter_context(nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url],
                                                    prefix=PREFIX))
        yield Fleet(url, central)


def rows(fleet: Fleet, until: Any) -> dict[str, list[Any]]:
    """The node table of a freshly opened page, once ``until`` accepts it (the pollers answer within seconds)."""
    def read() -> dict[str, list[Any]]:
        session = open_session(fleet.central.url, "/Cluster-Fleet")
        try:
            receive_for(session, 0.5)
            (table,) = session.document.select({"type": DataTable})
            assert isinstance(table.source, ColumnDataSource)
            data = {name: list(values) for name, values in table.source.data.items()}
            data["_divs"] = [div.text for div in session.document.select({"type": Div})]
            return data
        finally:
            session.close()

    return dict(wait_for(read, until, timeout_s=90))


def test_the_worst_nodes_come_first_with_their_counts_and_links(fleet: Fleet) -> None:
    data = rows(fleet, lambda found: found["node"] == ["node-c", "node-b", "node-d", "node-a"]
                and found["xids"][1] == 1 and found["dropped"][2] == 1)
    by_node = {node: {name: values[i] for name, values in data.items() if name != "_divs"}
               for i, node in enumerate(data["node"])}
    lost, xid, dropped, healthy = (by_node[name] for name in ("node-c", "node-b", "node-d", "node-a"))
    assert (lost["health"], lost["gpus"], lost["lost"], lost["ok"], lost["critical"]) == ("lost", 2, 1, 1, 0)
    assert lost["gpus_now"] == "1"  # the lost GPU reads no temperature
    assert (xid["health"], xid["critical"], xid["ok"], xid["xids"], xid["xid_gpus"]) == ("critical", 1, 1, 1, 1)
    assert xid["problems"].startswith("GPU 0: ")
    assert lost["problems"] == "GPU 1: GPU lost: it stopped answering (fallen off the bus?)"
    assert (dropped["health"], dropped["gpus"], dropped["gpus_day_ago"], dropped["gpus_now"], dropped["dropped"]) == (
        "ok", 2, "3", "2", 1)
    assert (healthy["health"], healthy["gpus"], healthy["ok"], healthy["xids"], healthy["dropped"]) == (
        "ok", 2, 2, 0, 0)
    summary = next(text for text in data["_divs"] if "nodes</b>" in text)
    assert "<b>4 nodes</b>" in summary
    assert "<b>8 GPUs</b>" in summary
    assert "<b>1</b></span> lost" in summary
    assert "<b>1</b> nodes with fewer GPUs than a day ago" in summary
    # Each link is relative to the page, so it opens the node's page under the prefix.
    page = fleet.central.url + "/Cluster-Fleet"
    assert fleet.central.url.endswith(PREFIX)
    target = urllib.parse.urljoin(page, lost["link"])
    assert target == f"{fleet.central.url}/Cluster-Nodes?node=node-c"
    status, body, _headers = http_get(target)
    assert status == 200
    assert "Cluster Nodes" in body
