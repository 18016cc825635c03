"""The whole fleet on one screen: every node's GPUs tallied by health (the cluster poller's per-GPU judgement, so the
fleet says what the nodes page says), each node's XIDs over the last day, and the nodes whose GPU count dropped
since a day ago, worst first.

The day's answers come from four PromQL aggregations (one series per node each, whatever the number of GPUs),
asked by :class:`~nvdash.cluster.fleet_poller.FleetPoller` at a longer interval than the poller's 5 s.

XIDs: nvdash exports no XID counter, only ``DCGM_FI_DEV_XID_ERRORS`` (4.9: ``DCGM_FI_DEV_XID_ERROR``), the GPU's
last XID code, a gauge with the code also in its ``err_code`` label, as dcgm-exporter does. So each new code starts
a new series and ``changes()`` sees nothing (every series is constant); what a day's samples do say exactly is
which codes each GPU showed: a node's XIDs are its distinct (GPU, code) pairs with a non-zero code in the last day
(``max_over_time() > 0``, one standing when the day began included). The same code again on the same GPU is not
seen (the gauge does not move), nor two codes on a GPU whose exporter leaves out ``err_code``.

With nvdash's recording rules loaded (:mod:`nvdash.cluster.recorded`) the same answers come from their series: the
non-zero XID codes only (a day of them is a few series, not every GPU's) and each node's GPU count. A recorded XID
is seen within the rules' evaluation interval of the raw one, and a GPU count a day ago is the node's highest in
the 15 minutes then rather than its distinct GPUs over them: the same while no GPU changes in those 15 minutes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nvdash.cluster.model import ClusterState, GpuClass, host_of, names
from nvdash.cluster.recorded import NODE_GPUS, XID_NONZERO
from nvdash.cluster.selectors import HOST_LABELS, SeriesScope

DAY = "24h"
DAY_AGO_WINDOW = "15m"
"""A day ago's GPUs are those with a temperature reading in the 15 minutes before that moment (a missed scrape or
two is no drop)."""
RECORDED_WINDOW = "24h15m"
"""How long the recording rules must have been recording for the day's queries to read them: the day, and the
15 minutes before a day ago."""
XID = "DCGM_FI_DEV_XID_ERRORS"
TEMP = "DCGM_FI_DEV_GPU_TEMP"


@dataclass(frozen=True)
class FleetQueries:
    """The day's queries, each an aggregation by host (one series per node), every series within the scope."""

    xids: str
    """How many distinct (GPU, XID code) pairs each node showed over the day."""
    xid_gpus: str
    """How many of each node's GPUs showed a non-zero XID code over the day."""
    gpus_now: str
    """Each node's distinct GPUs (UUIDs) reporting a temperature now."""
    gpus_day_ago: str
    """The same a day ago."""
    recorded: bool = False
    """Whether these read the recording rules' series rather than the raw ones."""

    def all(self) -> tuple[str, ...]:
        return (self.xids, self.xid_gpus, self.gpus_now, self.gpus_day_ago)


def fleet_queries(scope: SeriesScope, *, recorded: bool = False) -> FleetQueries:
    """The day's queries, each series selected within ``scope``: over the raw series under both namings, or over
    the recording rules' series (``recorded``). Either way a node's XIDs are its distinct (GPU, code) pairs, so a
    GPU's series repeated per pod counts once."""
    by = ", ".join(scope.host_labels)

    def per_node(xid_series: str) -> tuple[str, str]:
        """The distinct (GPU, code) pairs and the GPUs of a day's non-zero XID series, per node."""
        return (f"count by ({by}) (count by ({by}, UUID, err_code) ({xid_series}))",
                f"count by ({by}) (count by ({by}, UUID) ({xid_series}))")

    if recorded:
        xids, xid_gpus = per_node(f"max_over_time({scope.series(XID_NONZERO)}[{DAY}])")
        return FleetQueries(
            xids=xids, xid_gpus=xid_gpus,
            gpus_now=f"sum by ({by}) ({scope.series(NODE_GPUS)})",
            gpus_day_ago=f"sum by ({by}) (max_over_time({scope.series(NODE_GPUS)}[{DAY_AGO_WINDOW}] offset 1d))",
            recorded=True)

    def either(template: str, family: str) -> str:
        return " or ".join(template.format(scope.series(name)) for name in names(family))

    uuids_now = f"count by ({by}, UUID) ({either('{}', TEMP)})"
    uuids_then = f"count by ({by}, UUID) ({either(f'last_over_time({{}}[{DAY_AGO_WINDOW}] offset 1d)', TEMP)})"
    xids, xid_gpus = per_node(f"({either(f'max_over_time({{}}[{DAY}])', XID)}) > 0")
    return FleetQueries(
        xids=xids, xid_gpus=xid_gpus,
        gpus_now=f"count by ({by}) ({uuids_now})",
        gpus_day_ago=f"count by ({by}) ({uuids_then})",
    )


def host_in(labels: Mapping[str, str], scope: SeriesScope) -> str | None:
    """The node a series names, by the scope's host label (either of dcgm-exporter's by default)."""
    if scope.host_label in HOST_LABELS:
        return host_of(labels)
    return labels.get(scope.host_label)


def per_host(samples: Iterable[tuple[Mapping[str, str], float]], scope: SeriesScope) -> dict[str, int]:
    """An aggregation's answer as node -> whole number (two host labels naming one node are added up)."""
    result: dict[str, int] = {}
    for labels, value in samples:
        host = host_in(labels, scope)
        if host is not None and math.isfinite(value):
            result[host] = result.get(host, 0) + int(value)
    return result


@dataclass(frozen=True)
class FleetDay:
    """The day's answers, per node, or why Prometheus could not give them (the rest is the last good answer)."""

    xids: Mapping[str, int] = field(default_factory=dict)
    xid_gpus: Mapping[str, int] = field(default_factory=dict)
    gpus_now: Mapping[str, int] = field(default_factory=dict)
    gpus_day_ago: Mapping[str, int] = field(default_factory=dict)
    ok_time_s: float | None = None
    error: str | None = None
    generation: int = 0
    queries_ms: float = 0.0
    recorded: bool = False
    """Whether the answers came from the recording rules' series (else the raw series)."""


@dataclass(frozen=True)
class NodeRow:
    """One node of the fleet: its GPUs by class, its day's XIDs and its GPU count now and a day ago."""

    node: str
    worst: GpuClass
    counts: Mapping[GpuClass, int]
    xids: int = 0
    xid_gpus: int = 0
    xid_now: int = 0
    """GPUs whose last XID code is non-zero now."""
    gpus_now: int | None = None
    gpus_day_ago: int | None = None
    problems: str = ""
    group: str = ""
    """The node's group (``--prometheus-group-label``)."""

    @property
    def gpus(self) -> int:
        return sum(self.counts.values())

    @property
    def dropped(self) -> int:
        """GPUs fewer than a day ago (0 when unknown or not fewer)."""
        if self.gpus_day_ago is None:
            return 0
        return max(0, self.gpus_day_ago - (self.gpus_now or 0))

    def sort_key(self) -> tuple[int, int, int, int, str]:
        """Worst first: the worst GPU's class, dropped GPUs, the day's XIDs, then by name."""
        return (-self.worst.rank, -self.dropped, -max(self.xids, self.xid_gpus, self.xid_now),
                -self.counts.get(self.worst, 0), self.node)


@dataclass(frozen=True)
class FleetView:
    """What the fleet page shows: the tallies of nodes and GPUs by class, and one row per node, worst first."""

    nodes: Mapping[GpuClass, int]
    gpus: Mapping[GpuClass, int]
    rows: tuple[NodeRow, ...]

    @property
    def dropped_nodes(self) -> int:
        return sum(1 for row in self.rows if row.dropped)

    @property
    def xid_nodes(self) -> int:
        return sum(1 for row in self.rows if row.xids or row.xid_gpus or row.xid_now)


def fleet_view(state: ClusterState, day: FleetDay, *, silent_nodes: bool = True) -> FleetView:
    """The fleet from the poller's newest state and the day's answers. A node only the day-ago answer knows (silent
    for over an hour) is listed as not reporting, with no GPU in the tallies (they count what the nodes page
    shows), unless ``silent_nodes`` is False (a group's view: such a node's group is not known)."""
    nodes = {node.hostname: node for node in state.nodes}
    gpu_tally = dict.fromkeys(GpuClass, 0)
    node_tally = dict.fromkeys(GpuClass, 0)
    rows = []
    for host in sorted(set(nodes) | (set(day.gpus_day_ago) if silent_nodes else set())):
        node = nodes.get(host)
        counts = dict(node.counts) if node is not None else dict.fromkeys(GpuClass, 0)
        for kind, number in counts.items():
            gpu_tally[kind] += number
        worst = node.worst if node is not None else GpuClass.NOT_REPORTING
        node_tally[worst] += 1
        problems = ("; ".join(node.problems) if node is not None and node.gpus
                    else "no reading for over an hour (nvdash down or the node gone?)")
        rows.append(NodeRow(
            node=host, worst=worst, counts=counts,
            xids=day.xids.get(host, 0), xid_gpus=day.xid_gpus.get(host, 0),
            xid_now=node.xid_now if node is not None else 0,
            gpus_now=day.gpus_now.get(host, 0) if day.ok_time_s is not None else None,
            gpus_day_ago=day.gpus_day_ago.get(host), problems=problems,
            group=node.group if node is not None else ""))
    return FleetView(node_tally, gpu_tally, tuple(sorted(rows, key=NodeRow.sort_key)))

