"""The Fleet Health page's day over nvdash's recording rules, on a real Prometheus: a day and more of five nodes'
raw series backfilled with promtool, then the recording rules' series backfilled from them (``promtool tsdb
create-blocks-from rules``, which evaluates the shipped rules over the raw data as Prometheus would have).

The fleet poller reads the raw series while the rules' marker does not reach a day back (no recorded series at all,
then only the last hour of them), and the recorded series once it does; its answers are the same each time, and the
ones the data says: each node's distinct (GPU, XID code) pairs over the day (a GPU's series repeated per pod once,
a node exporting both namings once, an XID from before the day not at all), its GPUs now and a day ago, every
series within ``--prometheus-selector``."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nvdash.cluster.fleet import FleetDay, FleetQueries, per_host
from nvdash.cluster.fleet_poller import FleetPoller
from nvdash.cluster.promapi import PrometheusClient
from nvdash.cluster.selectors import SeriesScope
from tests.prometheus_cluster import run_prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "nvdash-recording-rules.yml"
STEP_S = 60
HOUR = 3600
BEGIN_H = -26
END_S = 15 * 60
"""Samples every minute from 26 hours ago to 15 minutes ahead (Prometheus answers "now" however long the test
takes)."""
SCOPE = SeriesScope(matchers=('job="nvdash"',))


def series(lines: dict[str, list[str]], family: str, labels: str, value: float, now_s: float, *,
           from_h: float = BEGIN_H, to_s: float = END_S) -> None:
    """``family{labels}`` at ``value`` every minute from ``from_h`` hours to ``to_s`` seconds from ``now_s``."""
    minute = math.floor(now_s / STEP_S) * STEP_S
    first, last = int(from_h * HOUR / STEP_S), int(to_s / STEP_S)
    lines.setdefault(family, []).extend(
        f"{family}{{{labels}}} {value:g} {minute + STEP_S * k}" for k in range(first, last + 1))


def openmetrics(now_s: float) -> str:
    """node-a (4.8 names, Hostname): GPU 0 shared by two pods showed XID 79 for the last 10 hours; GPU 1 XID 31
    (20 to 19 hours ago) then 43. node-b (4.9 names, hostname, a cluster label): GPU 1's XID 48 from 20 to 19 hours
    ago; GPU 2 silent for the last 2 hours. node-c: both namings, the same labels: GPU 0's XID 31 standing all
    along. node-d: one GPU whose XID 13 ended 25 hours ago. node-e: a dcgm-exporter outside the selector's job,
    with an XID."""
    lines: dict[str, list[str]] = {}

    def gpu(node: str, host: str, index: int, extra: str = "", job: str = "nvdash") -> str:
        return (f'{host}="{node}",instance="{node}:8000",job="{job}",gpu="{index}",UUID="GPU-{node}-{index}",'
                f'device="nvidia{index}",modelName="NVIDIA H100 80GB HBM3"{extra}')

    def xid(code: int) -> str:
        return f',err_code="{code}",err_msg="xid {code}"'

    pods = [',container="main",namespace="ml",pod="train"', ',container="main",namespace="ml",pod="eval"']
    for pod in pods:
        labels = gpu("node-a", "Hostname", 0, pod)
        series(lines, "DCGM_FI_DEV_GPU_TEMP", labels, 60, now_s)
        series(lines, "DCGM_FI_DEV_XID_ERRORS", labels + xid(0), 0, now_s, to_s=-10 * HOUR - 60)
        series(lines, "DCGM_FI_DEV_XID_ERRORS", labels + xid(79), 79, now_s, from_h=-10)
    labels = gpu("node-a", "Hostname", 1)
    series(lines, "DCGM_FI_DEV_GPU_TEMP", labels, 55, now_s)
    series(lines, "DCGM_FI_DEV_XID_ERRORS", labels + xid(0), 0, now_s, to_s=-20 * HOUR - 60)
    series(lines, "DCGM_FI_DEV_XID_ERRORS", labels + xid(31), 31, now_s, from_h=-20, to_s=-19 * HOUR - 60)
    series(lines, "DCGM_FI_DEV_XID_ERRORS", labels + xid(43), 43, now_s, from_h=-19)
    cluster = ',cluster="east"'
    for index in range(3):
        labels = gpu("node-b", "hostname", index, cluster)
        series(lines, "DCGM_FI_DEV_GPU_TEMP_CELSIUS", labels, 50, now_s, to_s=-2 * HOUR if index == 2 else END_S)
        if index == 1:
            series(lines, "DCGM_FI_DEV_XID_ERROR", labels + xid(48), 48, now_s, from_h=-20, to_s=-19 * HOUR)
        else:
            series(lines, "DCGM_FI_DEV_XID_ERROR", labels + xid(0), 0, now_s)
    for index in range(2):
        labels = gpu("node-c", "hostname", index)
        for family in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"):
            series(lines, family, labels, 45, now_s)
        for family in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"):
            series(lines, family, labels + xid(31 if index == 0 else 0), 31 if index == 0 else 0, now_s)
    labels = gpu("node-d", "Hostname", 0)
    series(lines, "DCGM_FI_DEV_GPU_TEMP", labels, 40, now_s)
    series(lines, "DCGM_FI_DEV_XID_ERRORS", labels + xid(13), 13, now_s, to_s=-25 * HOUR)
    labels = gpu("node-e", "Hostname", 0, job="dcgm-exporter")
    series(lines, "DCGM_FI_DEV_GPU_TEMP", labels, 40, now_s)
    series(lines, "DCGM_FI_DEV_XID_ERRORS", labels + xid(94), 94, now_s)
    text = [line for family, samples in lines.items() for line in (f"# TYPE {family} gauge", *samples)]
    return "\n".join([*text, "# EOF"]) + "\n"


EXPECTED = {
    "xids": {"node-a": 3, "node-b": 1, "node-c": 1},
    "xid_gpus": {"node-a": 2, "node-b": 1, "node-c": 1},
    "gpus_now": {"node-a": 2, "node-b": 2, "node-c": 2, "node-d": 1},
    "gpus_day_ago": {"node-a": 2, "node-b": 3, "node-c": 2, "node-d": 1},
}


def answers(day: FleetDay) -> dict[str, dict[str, int]]:
    assert day.error is None
    return {"xids": dict(day.xids), "xid_gpus": dict(day.xid_gpus), "gpus_now": dict(day.gpus_now),
            "gpus_day_ago": dict(day.gpus_day_ago)}


def promtool(*args: str) -> None:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: run the tests with `bash scripts/test.sh`, which installs it")
    done = subprocess.run([path, *args], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]


@contextmanager
def prometheus(root: Path) -> Iterator[PrometheusClient]:
    """A Prometheus over ``root``'s data, evaluating no rule (every recorded sample is backfilled)."""
    with run_prometheus(root, [], rules=False) as url:
        yield PrometheusClient(url, timeout_s=30.0)


def backfill_rules(client: PrometheusClient, root: Path, start_s: float, end_s: float) -> None:
    """The recording rules' series from ``start_s`` to ``end_s``, evaluated over the data ``client`` reaches, into
    blocks added to ``root``'s data once Prometheus stops."""
    out = root / f"rules-{int(start_s)}"
    promtool("tsdb", "create-blocks-from", "rules", f"--url={client.url}", f"--start={int(start_s)}",
             f"--end={int(end_s)}", f"--output-dir={out}", str(RULES))
    assert list(out.iterdir()), "promtool wrote no block"
    for block in out.iterdir():
        block.rename(root / "data" / block.name)


def asked(client: PrometheusClient, queries: FleetQueries) -> dict[str, dict[str, int]]:
    """The day's answers to ``queries``, asked directly."""
    return {name: per_host(((sample.labels, sample.value) for sample in client.instant(query).samples), SCOPE)
            for name, query in zip(EXPECTED, queries.all(), strict=True)}


def test_the_fleet_poller_reads_the_recorded_series_once_they_cover_the_day(tmp_path: Path) -> None:
    now_s = time.time()
    source = tmp_path / "fleet.om.txt"
    source.write_text(openmetrics(now_s))
    promtool("tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "data"))

    with prometheus(tmp_path) as client:
        raw = FleetPoller(client, scope=SCOPE).refresh()
        assert raw.recorded is False
        assert answers(raw) == EXPECTED
        # Only the last hour recorded: not enough for a day's queries.
        backfill_rules(client, tmp_path, now_s - HOUR, now_s + END_S)
    with prometheus(tmp_path) as client:
        recent = FleetPoller(client, scope=SCOPE).refresh()
        assert recent.recorded is False
        assert answers(recent) == EXPECTED
        backfill_rules(client, tmp_path, now_s + BEGIN_H * HOUR, now_s - HOUR)
    with prometheus(tmp_path) as client:
        poller = FleetPoller(client, scope=SCOPE)
        recorded = poller.refresh()
        assert recorded.recorded is True
        assert answers(recorded) == EXPECTED
        # The same data through the other queries, asked directly: the raw ones agree, and the recorded ones read
        # nothing but the recorded series.
        assert asked(client, poller.raw_queries) == EXPECTED
        assert all("DCGM_FI" not in query for query in poller.recorded_queries.all())
        everyone = FleetPoller(client)
        assert everyone.refresh().recorded is True
        # Without the selector, node-e (another job) counts too: the recorded series keep the node's labels.
        assert answers(everyone.day())["xids"] == {**EXPECTED["xids"], "node-e": 1}
