"""How long the Fleet Health page takes to build over a large fleet, from synthetic Prometheus answers.

    python benchmarks/fleet_page.py [--nodes 1000] [--gpus 8] [--repeat 5]

Makes the answers one refresh of the cluster poller would get for ``--nodes`` x ``--gpus`` GPUs (every family of the
overview's instant query per GPU, both namings' worth of work left out; one node in 50 with a hot GPU, one in 100
with an XID, one in 200 with a lost GPU, one in 300 silent now) and the fleet round's four per-node answers, then
measures, best and median of ``--repeat`` runs, in milliseconds:

- ``build_gpus``: the cluster poller's model of every GPU with its health (done once per 5 s refresh for every
  cluster page, not by the fleet page; shown for scale);
- ``per_host``: reading the fleet round's four answers (one series per node each);
- ``fleet_view``: the tallies and the sorted node rows;
- ``table_data``: the table's columns;
- ``open page``: a whole page opened in a Bokeh document (its first redraw included) over that state.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bokeh.document import Document

from nvdash.apps import cluster_fleet
from nvdash.cluster import open_cluster
from nvdash.cluster.fleet import FleetDay, fleet_view, per_host
from nvdash.cluster.model import ClusterState, build_gpus
from nvdash.cluster.selectors import SeriesScope
from tests.unit.test_apps import make_ctx

Answer = list[tuple[dict[str, str], float]]
HEALTHY = {"DCGM_FI_DEV_GPU_UTIL": 70.0, "DCGM_FI_DEV_FB_USED": 40_000.0, "DCGM_FI_DEV_FB_FREE": 40_000.0,
           "DCGM_FI_DEV_FB_RESERVED": 500.0, "DCGM_FI_DEV_GPU_TEMP": 60.0, "DCGM_FI_DEV_MEMORY_TEMP": 62.0,
           "DCGM_FI_DEV_SLOWDOWN_TEMP": 90.0, "DCGM_FI_DEV_POWER_USAGE": 500.0,
           "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700.0, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 700.0,
           "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0, "DCGM_FI_DEV_XID_ERRORS": 0.0,
           "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0, "DCGM_FI_DEV_ROW_REMAP_PENDING": 0.0,
           "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0, "DCGM_FI_DEV_PCIE_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16.0,
           "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16.0, "nvdash_gpu_lost": 0.0}


def answers(nodes: int, gpus: int) -> tuple[Answer, list[dict[str, str]], list[Answer]]:
    """The overview's answer, the last hour's GPUs, and the fleet round's four answers."""
    current: Answer = []
    seen: list[dict[str, str]] = []
    day: list[Answer] = [[], [], [], []]
    for n in range(nodes):
        host = f"gpu-node-{n:04d}"
        for g in range(gpus):
            labels = {"Hostname": host, "gpu": str(g), "UUID": f"GPU-{n:08d}-{g:04d}", "modelName": "NVIDIA H100"}
            seen.append(labels)
            if n % 300 == 7:
                continue  # silent now
            values = dict(HEALTHY)
            if n % 50 == 1 and g == 3:
                values["DCGM_FI_DEV_GPU_TEMP"] = 88.0
            if n % 100 == 2 and g == 0:
                values["DCGM_FI_DEV_XID_ERRORS"] = 79.0
            if n % 200 == 3 and g == 5:
                values = {"nvdash_gpu_lost": 1.0}
            current += [({**labels, "__name__": name}, value) for name, value in values.items()]
        labels = {"Hostname": host}
        day[0].append((labels, 1.0 if n % 100 == 2 else 0.0))
        day[1].append((labels, 1.0 if n % 100 == 2 else 0.0))
        day[2].append((labels, float(gpus - (n % 200 == 3) - (gpus if n % 300 == 7 else 0))))
        day[3].append((labels, float(gpus)))
    return current, seen, day


def timed(action: Callable[[], object], repeat: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        result = action()
        times.append((time.perf_counter() - began) * 1000.0)
    return times, result


def row(name: str, times: list[float]) -> str:
    return f"| {name:<12} | {min(times):9.1f} | {statistics.median(times):9.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    current, seen, day_answers = answers(args.nodes, args.gpus)
    now = time.time()
    lines = [f"{args.nodes} nodes x {args.gpus} GPUs: {len(current)} samples in the overview's answer", "",
             "| step         |  best ms  | median ms |", "|---|---:|---:|"]
    times, gpus = timed(lambda: build_gpus(current, seen, now), args.repeat)
    lines.append(row("build_gpus", times))
    state = ClusterState(time_s=now, gpus=gpus, ok_time_s=now, generation=1)  # type: ignore[arg-type]
    scope = SeriesScope()
    times, parsed = timed(lambda: [per_host(answer, scope) for answer in day_answers], args.repeat)
    lines.append(row("per_host", times))
    xids, xid_gpus, now_gpus, then = parsed  # type: ignore[misc]
    day = FleetDay(xids, xid_gpus, now_gpus, then, ok_time_s=now, generation=1)
    times, view = timed(lambda: fleet_view(state, day), args.repeat)
    lines.append(row("fleet_view", times))
    times, _data = timed(lambda: cluster_fleet.table_data(view), args.repeat)  # type: ignore[arg-type]
    lines.append(row("table_data", times))
    cluster = open_cluster("http://127.0.0.1:9", timeout_s=1.0)  # never asked: the states are handed in
    assert cluster.fleet is not None
    cluster.poller._state = state
    cluster.fleet._day = day
    ctx = replace(make_ctx(rows=()), cluster=cluster)
    times, _doc = timed(lambda: cluster_fleet.build(Document(), ctx), args.repeat)
    lines.append(row("open page", times))
    cluster.close()
    first = view.rows[:3]  # type: ignore[attr-defined]
    lines += ["", "worst first: " + ", ".join(f"{r.node} ({r.worst.value})" for r in first)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
