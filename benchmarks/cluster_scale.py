"""The cluster views at fleet size: a real Prometheus backfilled with N nodes x 8 GPUs, and what nvdash adds on top.

    python benchmarks/cluster_scale.py [--nodes 1000] [--gpus 8] [--span-min 30] [--step 60]
                                       [--history-nodes 2] [--history-days 7] [--history-step 60] [--repeat 5]

Backfills a Prometheus (``promtool tsdb create-blocks-from openmetrics``) with two files:

- the fleet: ``--nodes`` x ``--gpus`` GPUs over the last ``--span-min`` minutes (and 10 minutes ahead, so the
  instant queries find current readings however long the run takes) at one sample per ``--step`` seconds, every
  per-GPU family of nvdash's default counters (``--families read``: only those the cluster views read) with the
  labels nvdash exports (``Hostname``, ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, the driver
  version, and the scrape's ``job`` and ``instance``); 30 % of the GPUs (``--pod-share``) held by a pod, their
  series carrying its ``namespace``/``pod``/``container`` and the ``nvdash_pod_gpu_*`` families exported;
- the history: the first ``--history-nodes`` nodes' timeline families and their pods' shares over the
  ``--history-days`` before the fleet's span, at ``--history-step`` seconds (promtool makes a 2-hour block per
  pass over its input, so a week of the whole fleet in one file is out of reach here: see the printed estimate).

Then measures, ``--repeat`` times each (best, median, worst, ms): Prometheus's own time for each instant query a
refresh sends (the HTTP call's wall time), nvdash's decoding and model building on top (one ClusterPoller refresh
minus the queries), the two pages' models, opening each page (``bokeh.client.pull_session`` against a real
``nvdash --prometheus``), and a node's and a pod's timelines over 30 min and the backfilled span.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvdash.cluster.model import DEFAULT_QUERIES, GAUGES, HEALTH_STATUS, POD_MEMORY, POD_SM_SHARE
from nvdash.cluster.selectors import SeriesScope

POD_FAMILIES = ("nvdash_pod_gpu_allocated", "nvdash_pod_gpu_idle", POD_SM_SHARE, POD_MEMORY,
                "nvdash_pod_gpu_power_watts", "nvdash_pod_gpu_energy_joules_total")
PER_POD = ("nvdash_pod_", "nvdash_process_")
TIMELINE_FAMILIES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
                     "DCGM_FI_DEV_GPU_TEMP")
COUNTERS = Path(__file__).resolve().parents[1] / "nvdash" / "metrics" / "default-counters.csv"
MODEL = "NVIDIA H100 80GB HBM3"
AHEAD_S = 5400.0
"""The fleet's readings run this far past the backfill, so instant queries find current ones while it is reused."""
BYTES_PER_SAMPLE_GUESS = 1.5
"""What a sample of these slowly moving gauges takes in a TSDB block, refined by the run's own measurement."""


def default_families() -> list[str]:
    """The per-GPU families of nvdash's default counters (the per-pod and per-process ones are written apart)."""
    found = []
    for line in COUNTERS.read_text().splitlines():
        fields = [part.strip() for part in line.split(",")]
        if line.startswith("#") or len(fields) < 2 or fields[1] not in ("gauge", "counter"):
            continue
        if not fields[0].startswith(PER_POD):
            found.append(fields[0])
    return found


@dataclass(frozen=True)
class Shape:
    """What is backfilled."""

    nodes: int
    gpus: int
    families: tuple[str, ...]
    pod_share: float
    span_s: float
    step_s: float
    history_nodes: int
    history_s: float
    history_step_s: float

    def host(self, node: int) -> str:
        return f"node-{node:04d}"

    def has_pod(self, node: int, gpu: int) -> bool:
        """Whether a pod holds this GPU: a fixed share of them, spread over the nodes."""
        return (node * self.gpus + gpu) * 0.618034 % 1.0 < self.pod_share


def _value(family: str, seed: int, t: float) -> str:
    """A plausible, slowly moving value (integers where the family counts)."""
    if family == "DCGM_FI_DEV_GPU_UTIL":
        return str(int(50 + 45 * math.sin(t / 3600.0 + seed)))
    if family == "DCGM_FI_DEV_FB_USED":
        return str(20_000 + (seed * 997 + int(t // 600)) % 60_000)
    if family == "DCGM_FI_DEV_FB_FREE":
        return str(81_000 - 20_000 - (seed * 997 + int(t // 600)) % 60_000)
    if family == "DCGM_FI_DEV_GPU_TEMP":
        return str(40 + (seed + int(t // 300)) % 30)
    if family == "DCGM_FI_DEV_POWER_USAGE":
        return f"{300 + 300 * abs(math.sin(t / 1800.0 + seed)):.1f}"
    if family in ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"):
        return "700"
    if family == "DCGM_FI_DEV_SLOWDOWN_TEMP":
        return "87"
    if family in ("DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN"):
        return "5"
    if family in ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"):
        return "16"
    if family == "DCGM_FI_DEV_FB_RESERVED":
        return "512"
    if family == HEALTH_STATUS:
        # The node's own verdict: a few GPUs not OK (about 1 in 1,000 critical, 2 in 1,000 a warning).
        return "2" if seed % 997 == 0 else "1" if seed % 499 == 0 else "0"
    if "_DBE_" in family:
        return "0"  # no uncorrectable ECC error: these GPUs are healthy, as their nodes' verdicts say
    if family.endswith(("_total", "_TOTAL")) or "VIOLATION" in family:
        return str(int(t) % 100_000)
    return "0"


def _gpu_labels(shape: Shape, node: int, gpu: int) -> str:
    host = shape.host(node)
    uuid = "GPU-" + hashlib.md5(f"{host}/{gpu}".encode()).hexdigest()
    pod = (f',namespace="team-{node % 40:02d}",pod="job-{node:04d}-{gpu}",container="main"'
           if shape.has_pod(node, gpu) else "")
    return (f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:{gpu + 0x18:02X}:00.0",device="nvidia{gpu}",'
            f'modelName="{MODEL}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="570.86.15",job="nvdash",'
            f'instance="{host}:8000"{pod}')


def _pod_value(family: str, seed: int, t: float) -> str:
    if family == "nvdash_pod_gpu_allocated":
        return "1"
    if family == "nvdash_pod_gpu_idle":
        return "0" if seed % 10 else "1"
    if family == POD_SM_SHARE:
        return f"{0.4 + 0.4 * math.sin(t / 3600.0 + seed):.3f}"
    if family == POD_MEMORY:
        return str((10 + seed % 50) << 30)
    if family == "nvdash_pod_gpu_power_watts":
        return f"{250 + 100 * math.sin(t / 1800.0 + seed):.1f}"
    return str(int(t) % 1_000_000)


def write_openmetrics(out: TextIO, shape: Shape, nodes: range, families: tuple[str, ...], *,
                      pod_families: tuple[str, ...], times: list[float]) -> int:
    """Every series of ``nodes``' GPUs at ``times``, family after family; returns the samples written."""
    stamps = [f" {t:.0f}\n" for t in times]
    written = 0
    for family in (*families, *pod_families):
        kind = "counter" if family.endswith(("_total", "_TOTAL")) or "VIOLATION" in family else "gauge"
        out.write(f"# TYPE {family} {kind}\n")
        pods = family in pod_families
        for node in nodes:
            for gpu in range(shape.gpus):
                if pods and not shape.has_pod(node, gpu):
                    continue
                head = f"{family}{{{_gpu_labels(shape, node, gpu)}" + (
                    ',resource="nvidia.com/gpu"}' if family == "nvdash_pod_gpu_allocated" else "}") + " "
                seed = node * shape.gpus + gpu
                value = _pod_value if pods else _value
                out.write("".join(head + value(family, seed, t) + stamp
                                  for t, stamp in zip(times, stamps, strict=True)))
                written += len(times)
    out.write("# EOF\n")
    return written


def backfill(promtool: str, source: Path, data: Path) -> float:
    """Seconds promtool took to turn ``source`` into blocks under ``data``."""
    began = time.perf_counter()
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"promtool failed: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - began


def size_of(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def timed(action: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """Milliseconds of each run, and the last result."""
    times = []
    result: Any = None
    for _ in range(repeat):
        began = time.perf_counter()
        result = action()
        times.append((time.perf_counter() - began) * 1000.0)
    return times, result


def row(name: str, times: list[float], size: str) -> str:
    return f"{name:<50} {min(times):>9.1f} {statistics.median(times):>9.1f} {max(times):>9.1f}  {size}"


def header() -> str:
    return f"{'what':<50} {'best':>9} {'median':>9} {'worst':>9}  answer"


def estimate(shape: Shape, fleet_samples: int, fleet_s: float, block_bytes: int) -> list[str]:
    """The issue's full size (the fleet over 7 days at 15 s), extrapolated from this run's throughput."""
    per_series = 7 * 86400 / 15
    gpus = shape.nodes * shape.gpus
    pod_gpus = sum(shape.has_pod(n, g) for n in range(shape.nodes) for g in range(shape.gpus))
    samples = (gpus * len(shape.families) + pod_gpus * len(POD_FAMILIES)) * per_series
    rate = fleet_samples / fleet_s if fleet_s > 0 else math.nan
    per_sample = block_bytes / fleet_samples if fleet_samples else BYTES_PER_SAMPLE_GUESS
    return [f"the issue's size, {shape.nodes} nodes x {shape.gpus} GPUs over 7 d at 15 s: {samples / 1e9:.1f} G "
            "samples; "
            f"at this run's {rate / 1e6:.2f} M samples/s (text + promtool) about {samples / rate / 3600:.0f} h and "
            f"{samples * per_sample / 1e9:.0f} GB of blocks ({per_sample:.2f} B/sample), and about "
            f"{samples * 330 / 1e12:.1f} TB of OpenMetrics text: extrapolated, not measured"]


def prepare(shape: Shape, root: Path, now: float) -> tuple[Path, list[str]]:
    """Backfill both files; returns the data folder and the lines saying what it holds and what it took."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise SystemExit("promtool is not installed (Debian: apt-get install prometheus)")
    data = root / "data"
    data.mkdir()
    notes = []
    fleet_end = math.floor(now / shape.step_s) * shape.step_s + AHEAD_S
    fleet_start = fleet_end - AHEAD_S - shape.span_s
    fleet_times = [fleet_start + k * shape.step_s for k in range(int((fleet_end - fleet_start) / shape.step_s) + 1)]
    source = root / "fleet.om.txt"
    began = time.perf_counter()
    with source.open("w") as out:
        samples = write_openmetrics(out, shape, range(shape.nodes), shape.families, pod_families=POD_FAMILIES,
                                     times=fleet_times)
    text_s = time.perf_counter() - began
    text_bytes = source.stat().st_size
    promtool_s = backfill(promtool, source, data)
    source.unlink()
    block_bytes = size_of(data)
    series = samples // len(fleet_times)
    notes.append(f"fleet: {shape.nodes} nodes x {shape.gpus} GPUs, {len(shape.families)} per-GPU families + "
                 f"{len(POD_FAMILIES)} pod families on {shape.pod_share:.0%} of GPUs = {series:,} series x "
                 f"{len(fleet_times)} samples ({shape.span_s / 60:.0f} min + {AHEAD_S / 60:.0f} min ahead at "
                 f"{shape.step_s:g} s) = "
                 f"{samples / 1e6:.1f} M samples; text {text_bytes / 1e9:.2f} GB in {text_s:.0f} s, promtool "
                 f"{promtool_s:.0f} s, blocks {block_bytes / 1e6:.0f} MB")
    if shape.history_nodes and shape.history_s > 0:
        history_times = [fleet_start - shape.history_s + k * shape.history_step_s
                         for k in range(int(shape.history_s / shape.history_step_s))]
        source = root / "history.om.txt"
        with source.open("w") as out:
            history_samples = write_openmetrics(out, shape, range(shape.history_nodes), TIMELINE_FAMILIES,
                                                pod_families=(POD_SM_SHARE, POD_MEMORY), times=history_times)
        history_promtool_s = backfill(promtool, source, data)
        source.unlink()
        notes.append(f"history: {shape.history_nodes} nodes' timeline and pod-share families over the "
                     f"{shape.history_s / 86400:g} d before, at {shape.history_step_s:g} s = "
                     f"{history_samples / 1e6:.1f} M samples; promtool {history_promtool_s:.0f} s")
    notes += estimate(shape, samples, text_s + promtool_s, block_bytes)
    return data, notes


@dataclass
class Measured:
    lines: list[str]

    def add(self, name: str, times: list[float], size: str) -> None:
        line = row(name, times, size)
        self.lines.append(line)
        print(line, flush=True)


def prometheus_time(url: str, promql: str) -> tuple[float, float, int]:
    """One instant query asked over plain HTTP: the call's wall time (answer read, not decoded), Prometheus's own
    execution time (``stats=all``), both in ms, and the series answered."""
    body = urllib.parse.urlencode({"query": promql, "stats": "all"}).encode()
    began = time.perf_counter()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=300) as answer:
        raw = answer.read()
    wall = (time.perf_counter() - began) * 1000.0
    data = json.loads(raw)["data"]
    return wall, float(data["stats"]["timings"]["execTotalTime"]) * 1000.0, len(data["result"])


def measure_queries(url: str, repeat: int, out: Measured) -> None:
    """Prometheus's time for each instant query of a refresh, read every GPU's readings or the nodes aggregated, then
    one refresh of each kind and the models built on top."""
    from nvdash.apps.cluster_nodes import node_rows, overview_data
    from nvdash.apps.cluster_pods import PodFilter, namespace_rows, pod_rows, shown
    from nvdash.cluster.nodes import detail_queries, node_queries
    from nvdash.cluster.poller import ClusterPoller
    from nvdash.cluster.promapi import PrometheusClient

    scope = SeriesScope()
    client = PrometheusClient(url, timeout_s=120.0)
    every_gpu = ClusterPoller(client, fleet_from_gpus=1 << 40)
    fleet = ClusterPoller(client)
    fleet.want_node("node-0500")
    probe = fleet.refresh()
    detailed = sorted({gpu.hostname for gpu in probe.gpus})
    nodes = node_queries(scope)
    pods = DEFAULT_QUERIES.all()[2:]
    paths = {
        "every GPU": [("nodes: GPUs reporting", nodes.reporting), ("per GPU: 21 families", DEFAULT_QUERIES.gpus),
                      ("per GPU: seen in 1 h", DEFAULT_QUERIES.seen)],
        "fleet": [(f"nodes: {name}", query) for name, query in zip(
            ("GPUs reporting", "GPUs seen in 1 h", "sums", "counts", "nodes with verdicts", "verdicts not OK",
             "XIDs now"), nodes.all(), strict=True)]
        + [(f"detail: {len(detailed)} nodes, {name}", query)
           for name, query in zip(("21 families", "seen in 1 h"), detail_queries(scope, detailed), strict=True)],
    }
    shared = [(name, query) for name, query in zip(("pods: allocations", "pods: readings", "pods: idle 30 min"),
                                                   pods, strict=True)]
    def asked(label: str, promql: str) -> float:
        """Ask ``promql`` ``repeat`` times, print its row, return the median wall time."""
        runs = [prometheus_time(url, promql) for _ in range(repeat)]
        walls = [wall for wall, _exec, _series in runs]
        executed = statistics.median(run[1] for run in runs)
        out.add(f"Prometheus: {label}", walls, f"{runs[-1][2]:,} series, exec {executed:.0f} ms")
        return statistics.median(walls)

    pods_ms = sum(asked(name, query) for name, query in shared)
    total = {key: pods_ms + sum(asked(f"{key}: {name}", query) for name, query in queries)
             for key, queries in paths.items()}
    for key, value in total.items():
        out.lines.append(f"{'Prometheus: ' + key + ' (with the pods), medians summed':<50} {'':>9} {value:>9.1f}")
        print(out.lines[-1])
    states = {}
    for key, poller in (("every GPU", every_gpu), ("fleet", fleet)):
        times = []
        for _ in range(repeat):
            state = poller.refresh()
            times.append(state.queries_ms)
        states[key] = state
        out.add(f"{key}: one ClusterPoller refresh", times,
                f"{state.gpu_count:,} GPUs on {len(state.nodes):,} nodes, {len(state.gpus):,} read one by one, "
                f"{len(state.pods):,} pods, truncated={state.truncated}, error={state.error!r}"[:160])
        out.lines.append(f"{'  ' + key + ': of which nvdash (- Prometheus)':<50} {'':>9} "
                         f"{statistics.median(times) - total[key]:>9.1f}")
        print(out.lines[-1])
    same = [(node.hostname, dict(node.counts), node.utilization_pct, node.memory_used_bytes)
            for node in states["fleet"].nodes] == [
        (node.hostname, dict(node.counts), node.utilization_pct, node.memory_used_bytes)
        for node in states["every GPU"].nodes]
    out.lines.append(f"the nodes' counts, mean utilization and memory equal on both paths: {same}")
    print(out.lines[-1])
    state = states["fleet"]
    times, data = timed(lambda: overview_data(state), repeat)
    out.add("/Cluster-Nodes overview, node cells", times,
            f"{len(data['x']):,} cells, {len(json.dumps(data)) / 1e6:.1f} MB")
    times, rows = timed(lambda: node_rows(state), repeat)
    out.add("/Cluster-Nodes node table", times, f"{len(rows['node']):,} rows")

    def pods_model() -> None:
        pods, shares = shown(state, PodFilter())
        pod_rows(pods, shares)
        namespace_rows(pods, shares)

    times, _ = timed(pods_model, repeat)
    out.add("nvdash: /Cluster-Pods model", times, f"{len(state.pods):,} rows")


def measure_timelines(url: str, shape: Shape, now: float, repeat: int, out: Measured) -> None:
    from nvdash.cluster.history import PrometheusHistory
    from nvdash.cluster.pod_history import PrometheusPodHistory
    from nvdash.cluster.promapi import PrometheusClient

    client = PrometheusClient(url, timeout_s=120.0)
    history = PrometheusHistory(client, shape.host(0))
    pods = PrometheusPodHistory(client)
    gpu = next((g for g in range(shape.gpus) if shape.has_pod(0, g)), None)
    span = shape.history_s + shape.span_s if shape.history_nodes else shape.span_s
    for label, seconds in (("30 min", 1800.0), (f"{span / 86400:.1f} d", span)):
        times, result = timed(lambda s=seconds: history.query(list(TIMELINE_FAMILIES_METRICS), now - s, now), repeat)
        points = sum(len(item.time_s) for by_gpu in result.series.values() for item in by_gpu.values())
        out.add(f"node timelines, {label}", times, f"{points:,} points, step {result.step_s:g} s")
        if gpu is not None:
            times, timeline = timed(lambda s=seconds: pods.timeline("team-00", f"job-0000-{gpu}", now - s, now), repeat)
            known = int(sum(not math.isnan(v) for v in timeline.sm_gpus))
            out.add(f"pod timeline, {label}", times, f"{known:,} points, step {timeline.step_s:g} s")


TIMELINE_FAMILIES_METRICS = ("utilization_pct", "memory_used_bytes", "power_w", "temperature_c")


def status_text(document: Any) -> str:
    from bokeh.models.widgets import Div

    return " ".join(model.text for model in document.select({"type": Div}) if "Prometheus" in model.text)


def measure_pages(url: str, repeat: int, out: Measured, label: str, env: Mapping[str, str] | None) -> None:
    """Open each page against a real nvdash --prometheus (run with ``env``), once its poller has answered."""
    from bokeh.client import pull_session

    from tests.conftest import nvdash_server

    with nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url], env=env) as server:
        for page in ("/Cluster-Nodes", "/Cluster-Pods"):
            deadline = time.monotonic() + 300.0
            while True:
                session = pull_session(url=server.url + page)
                text = status_text(session.document)
                session.close()
                if "updated" in text or "Prometheus down" in text or "refused" in text:
                    break
                if time.monotonic() > deadline:
                    out.lines.append(f"{page}: the poller had no state within 300 s: {text[:200]!r}")
                    print(out.lines[-1])
                    break
                time.sleep(1.0)

            def pull(page: str = page) -> int:
                session = pull_session(url=server.url + page)
                try:
                    return len(json.dumps(session.document.to_json(), default=str))
                finally:
                    session.close()

            times, size = timed(pull, repeat)
            shown = re.sub(r"<[^>]*>", "", text)[-90:]
            out.add(f"{label}: open {page}", times, f"document {size / 1e6:.1f} MB; {shown}")


def parse() -> tuple[Shape, int, bool, Path | None, Path | None]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--span-min", type=float, default=30.0, help="minutes of the whole fleet, up to now")
    parser.add_argument("--step", type=float, default=60.0, help="seconds between the fleet's samples")
    parser.add_argument("--families", choices=("default", "read"), default="default")
    parser.add_argument("--pod-share", type=float, default=0.3)
    parser.add_argument("--history-nodes", type=int, default=2)
    parser.add_argument("--history-days", type=float, default=7.0)
    parser.add_argument("--history-step", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-pages", action="store_true", help="skip opening the pages")
    parser.add_argument("--keep", type=Path, default=None, help="backfill into (or reuse) this folder")
    parser.add_argument("--before-tree", type=Path, default=None,
                        help="also open the pages from this nvdash source tree (e.g. `git archive` of the base)")
    args = parser.parse_args()
    families = tuple(dict.fromkeys((*default_families(), HEALTH_STATUS))) if args.families == "default" else tuple(
        dict.fromkeys((*GAUGES, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")))
    shape = Shape(args.nodes, args.gpus, families, args.pod_share, args.span_min * 60.0, args.step,
                  args.history_nodes, args.history_days * 86400.0, args.history_step)
    return shape, args.repeat, not args.no_pages, args.keep, args.before_tree


def main() -> None:
    from tests.prometheus_cluster import run_prometheus

    shape, repeat, pages, keep, before = parse()
    now = time.time()
    with tempfile.TemporaryDirectory() as folder:
        root = keep if keep is not None else Path(folder)
        if keep is not None and (keep / "data").exists():
            notes = [f"reusing the backfill in {keep} (its readings end 90 min after it was made)"]
        else:
            root.mkdir(parents=True, exist_ok=True)
            _data, notes = prepare(shape, root, now)
        for line in notes:
            print(line, flush=True)
        with run_prometheus(root, [], rules=False) as url:
            out = Measured([])
            print(header())
            measure_queries(url, repeat, out)
            measure_timelines(url, shape, time.time(), repeat, out)
            if pages and before is not None:
                measure_pages(url, repeat, out, "before", {"PYTHONPATH": str(before.resolve())})
            if pages:
                measure_pages(url, repeat, out, "after" if before is not None else "nvdash", None)


if __name__ == "__main__":
    main()
