"""The cluster at fleet size: each node summarized by PromQL aggregations (one series per node, whatever its GPUs),
and every GPU's readings fetched only for the nodes that need them.

Above a few hundred GPUs, asking for every GPU's 20 families (160,000 series at 1,000 nodes x 8 GPUs) costs seconds
of decoding per refresh. The summary needs per node only: the GPUs reporting now and seen within the hour, their mean
utilization and memory, and which GPUs are not OK. "Not OK" comes from each node's own verdict
(``nvdash_gpu_health_status``, the node's Health page) and from a standing XID code (the cluster's XID rule); the
GPUs' full readings, judged by nvdash's rules as on a small cluster, are fetched for the nodes chosen on a page and
for the nodes with a GPU not OK, not reporting, or no verdict (a plain dcgm-exporter), worst first, at most
:data:`DETAIL_NODES_MAX`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from nvdash.cluster.model import (
    GAUGES,
    HEALTH_STATUS,
    SEEN_WINDOW,
    ClusterGpu,
    ClusterNode,
    GpuClass,
    gpu_labels,
    host_of,
    names,
    node_summary,
    reading,
)
from nvdash.cluster.selectors import HOST_LABELS, SeriesScope, quote
from nvdash.health.status import Status
from nvdash.health.xid import xid_info

FLEET_FROM_GPUS = 256
"""Above this many GPUs the nodes are summarized by aggregation (the nodes page shows one cell per node from here)."""
DETAIL_NODES_MAX = 128
"""The most nodes whose GPUs' readings one refresh fetches (1,024 GPUs of 8)."""
REPORTING_FAMILIES = ("DCGM_FI_DEV_GPU_TEMP", "nvdash_gpu_lost")
"""A GPU reports when it has a temperature reading (or its node says it is lost), as the last hour's list counts."""
SUMMED = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
XID = "DCGM_FI_DEV_XID_ERRORS"
MIB = 1024 * 1024


def _either(families: Iterable[str]) -> str:
    return "|".join(name for family in families for name in names(family))


@dataclass(frozen=True)
class NodeQueries:
    """The summary's queries, each answered with one series per node (per node and family, per not-OK GPU)."""

    reporting: str
    """GPUs reporting now, per node and model."""
    seen: str
    """GPUs seen within the last hour, per node."""
    sums: str
    """Per node and family (either naming), the sum of each GPU's utilization and framebuffer used, free, reserved
    (a GPU repeated per pod once)."""
    counts: str
    """How many GPUs the utilization sum adds up (per node and naming)."""
    verdict_nodes: str
    """Per node, the GPUs with a verdict of their node's own (nodes without one are judged here, in detail)."""
    verdicts: str
    """The GPUs whose node's verdict is not OK, with it (1 warning, 2 critical)."""
    xids: str
    """The GPUs whose last XID code is non-zero now, with the code."""

    def all(self) -> tuple[str, ...]:
        return (self.reporting, self.seen, self.sums, self.counts, self.verdict_nodes, self.verdicts, self.xids)


def node_queries(scope: SeriesScope) -> NodeQueries:
    """The summary's queries, every series selected within ``scope``."""
    hosts = ", ".join(scope.host_labels)
    grouped = ", ".join(("modelName", *scope.group_labels))
    whole = 'GPU_I_ID=""'
    reporting = scope.series("", f'__name__=~"{_either(REPORTING_FAMILIES)}"', whole)
    seen = " or ".join(f"last_over_time({scope.series(name)}[{SEEN_WINDOW}])" for name in names(REPORTING_FAMILIES[0]))
    seen += f" or last_over_time({scope.series(REPORTING_FAMILIES[1])}[{SEEN_WINDOW}])"
    summed = scope.series("", f'__name__=~"{_either(SUMMED)}"', whole)
    per_gpu = f"max by (__name__, {hosts}, gpu) ({summed})"
    utilization = scope.series("", f'__name__=~"{_either(SUMMED[:1])}"', whole)
    xid = " or ".join(f"{scope.series(name, whole)} != 0" for name in names(XID))
    return NodeQueries(
        reporting=f"count by ({hosts}, {grouped}) (group by ({hosts}, gpu, {grouped}) ({reporting}))",
        seen=f"count by ({hosts}) (group by ({hosts}, gpu) ({seen}))",
        sums=f"sum by (__name__, {hosts}) ({per_gpu})",
        counts=f"count by (__name__, {hosts}) (max by (__name__, {hosts}, gpu) ({utilization}))",
        verdict_nodes=f"count by ({hosts}) (group by ({hosts}, gpu) ({scope.series(HEALTH_STATUS)}))",
        verdicts=f"max by ({hosts}, gpu) ({scope.series(HEALTH_STATUS)}) > 0",
        xids=f"max by ({hosts}, gpu) ({xid})",
    )


def _host_regex(hosts: Sequence[str]) -> str:
    return quote("|".join(re.escape(host) for host in sorted(hosts)))


def detail_queries(scope: SeriesScope, hosts: Sequence[str]) -> tuple[str, str]:
    """The overview's two per-GPU queries (readings now, GPUs of the last hour) for ``hosts`` only."""
    pattern = _host_regex(hosts)
    readings = " or ".join(scope.series("", f'__name__=~"{_either(GAUGES)}"', 'GPU_I_ID=""', f"{label}=~{pattern}")
                           for label in scope.host_labels)
    seen = " or ".join(f"last_over_time({scope.series(name, f'{label}=~{pattern}')}[{SEEN_WINDOW}])"
                       for label in scope.host_labels
                       for name in (*names("DCGM_FI_DEV_GPU_TEMP"), "nvdash_gpu_lost"))
    return (f"max by ({', '.join(gpu_labels(scope))}) ({readings})",
            f"group by ({', '.join(scope.host_labels)}, gpu, UUID, modelName) ({seen})")


Labelled = Iterable[tuple[Mapping[str, str], float]]


@dataclass(frozen=True)
class NodeAnswers:
    """The summary queries' answers, each series' host label read as ``Hostname``; the nodes' groups read from
    ``group_label`` of the reporting answer."""

    reporting: Labelled
    seen: Labelled
    sums: Labelled
    counts: Labelled
    verdict_nodes: Labelled
    verdicts: Labelled
    xids: Labelled
    group_label: str = ""


@dataclass
class _Tally:
    reporting: int = 0
    seen: int = 0
    models: tuple[str, ...] = ()
    group: str = ""
    verdicts: int = 0
    gpu_verdicts: dict[int, int] | None = None
    xids: dict[int, int] | None = None


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _index(labels: Mapping[str, str]) -> int | None:
    gpu = labels.get("gpu", "")
    return int(gpu) if gpu.isascii() and gpu.isdigit() else None


def _host_label(labels: Mapping[str, str]) -> str:
    """Which of the two host labels a series carries: a node exported under both (nvdash beside a dcgm-exporter
    4.8.3+, which says ``hostname``) is counted once, as the per-GPU path keys GPUs by host and index."""
    return next((label for label in HOST_LABELS if label in labels), "")


def _counted(answer: Labelled) -> dict[str, int]:
    """host -> the count of an answer aggregated by host (and model: added up), the larger of the two host labels'."""
    by_label: dict[tuple[str, str], int] = {}
    for labels, value in answer:
        host = host_of(labels)
        if host and _finite(value):
            key = (host, _host_label(labels))
            by_label[key] = by_label.get(key, 0) + int(value)
    counted: dict[str, int] = {}
    for (host, _label), number in by_label.items():
        counted[host] = max(counted.get(host, 0), number)
    return counted


def _tallies(answers: NodeAnswers) -> tuple[dict[str, _Tally], dict[str, dict[str, float]], dict[str, dict[str, int]]]:
    tallies: dict[str, _Tally] = {}

    def tally(labels: Mapping[str, str]) -> _Tally | None:
        host = host_of(labels)
        return None if not host else tallies.setdefault(host, _Tally())

    answers = replace(answers, reporting=list(answers.reporting), seen=list(answers.seen),
                      verdict_nodes=list(answers.verdict_nodes))
    for host, number in _counted(answers.reporting).items():
        tallies.setdefault(host, _Tally()).reporting = number
    for host, number in _counted(answers.seen).items():
        tallies.setdefault(host, _Tally()).seen = number
    for host, number in _counted(answers.verdict_nodes).items():
        tallies.setdefault(host, _Tally()).verdicts = number
    for labels, value in answers.reporting:
        found = tally(labels)
        if found is not None and _finite(value):
            model = labels.get("modelName", "")
            if model and model not in found.models:
                found.models = tuple(sorted((*found.models, model)))
            if answers.group_label and not found.group:
                found.group = labels.get(answers.group_label, "")
    for labels, value in answers.verdicts:
        found, index = tally(labels), _index(labels)
        if found is not None and index is not None and value in (1.0, 2.0):
            found.gpu_verdicts = {**(found.gpu_verdicts or {}), index: int(value)}
    for labels, value in answers.xids:
        found, index = tally(labels), _index(labels)
        if found is not None and index is not None and _finite(value) and value == int(value):
            found.xids = {**(found.xids or {}), index: int(value)}
    counts = {host: {name: int(value) for name, value in families.items()}
              for host, families in _per_family(answers.counts, in_unit=False).items()}
    return tallies, _per_family(answers.sums, in_unit=True), counts


def _per_family(answer: Labelled, *, in_unit: bool) -> dict[str, dict[str, float]]:
    """host -> 4.8 family -> value, in 4.8's unit if ``in_unit`` (a count is not converted); a node exporting both
    namings gives 4.8's, not both added."""
    found: dict[str, dict[str, float]] = {}
    for labels, value in answer:
        host, name = host_of(labels), labels.get("__name__", "")
        if not host or not name or not _finite(value):
            continue
        family, converted = reading(name, value)
        if family != name and family in found.get(host, {}):
            continue
        found.setdefault(host, {})[family] = converted if in_unit else value
    return found


def needs_detail(tally: _Tally) -> int:
    """How urgently a node's GPUs' readings are wanted (0: not at all): GPUs critical, not reporting, an XID, a
    warning, no verdict of its own."""
    verdicts = tally.gpu_verdicts or {}
    if 2 in verdicts.values():
        return 5
    if tally.seen > tally.reporting:
        return 4
    if tally.xids:
        return 3
    if verdicts:
        return 2
    if tally.verdicts < tally.reporting:
        return 1
    return 0


def detail_hosts(answers: NodeAnswers, wanted: Sequence[str], limit: int = DETAIL_NODES_MAX) -> list[str]:
    """The nodes whose GPUs' readings to fetch: the nodes ``wanted`` by pages first, then the most urgent."""
    tallies, _sums, _counts = _tallies(answers)
    chosen = [host for host in wanted if host in tallies][:limit]
    urgent = sorted((host for host, tally in tallies.items() if host not in chosen and needs_detail(tally)),
                    key=lambda host: (-needs_detail(tallies[host]), host))
    return chosen + urgent[:max(0, limit - len(chosen))]


def fleet_nodes(answers: NodeAnswers, detail: Sequence[ClusterGpu], detailed: Iterable[str]) -> tuple[ClusterNode, ...]:
    """Every node: from its GPUs' readings where ``detailed``, else from the aggregations (its GPUs without a verdict
    of not OK counted OK)."""
    tallies, sums, counts = _tallies(answers)
    by_host: dict[str, list[ClusterGpu]] = {}
    for gpu in detail:
        by_host.setdefault(gpu.hostname, []).append(gpu)
    detailed = set(detailed)
    nodes = []
    for host in sorted(set(tallies) | set(by_host)):
        if host in detailed and by_host.get(host):
            nodes.append(node_summary(host, by_host[host]))
            continue
        nodes.append(_summary(host, tallies.get(host, _Tally()), sums.get(host, {}), counts.get(host, {})))
    return tuple(nodes)


def _gpu_statuses(tally: _Tally) -> dict[int, tuple[Status, str]]:
    """The GPUs not OK by the aggregations: the worse of the node's verdict and a standing XID code's severity (the
    XID rule of :func:`~nvdash.cluster.model.gpu_health`), with the reason."""
    found: dict[int, tuple[Status, str]] = {}
    for index, value in (tally.gpu_verdicts or {}).items():
        status = Status.CRITICAL if value == 2 else Status.WARNING
        found[index] = (status, f"{status.label} by its node's own health rules (its node's Health page says why)")
    for index, code in (tally.xids or {}).items():
        xid = xid_info(code)
        status = Status(xid.severity)
        if status is not Status.OK and (index not in found or status.rank > found[index][0].rank):
            found[index] = (status, f"last XID {code}: {xid.meaning}")
    return found


def _summary(host: str, tally: _Tally, sums: Mapping[str, float], counts: Mapping[str, int]) -> ClusterNode:
    statuses = _gpu_statuses(tally)
    critical = sum(1 for status, _why in statuses.values() if status is Status.CRITICAL)
    warning = len(statuses) - critical
    counts_by_class = dict.fromkeys(GpuClass, 0)
    counts_by_class[GpuClass.CRITICAL] = critical
    counts_by_class[GpuClass.WARNING] = warning
    counts_by_class[GpuClass.OK] = max(0, tally.reporting - critical - warning)
    counts_by_class[GpuClass.NOT_REPORTING] = max(0, tally.seen - tally.reporting)
    util_count = counts.get("DCGM_FI_DEV_GPU_UTIL", 0)
    util = sums.get("DCGM_FI_DEV_GPU_UTIL")
    used, free = sums.get("DCGM_FI_DEV_FB_USED"), sums.get("DCGM_FI_DEV_FB_FREE")
    total = None if used is None or free is None else (used + free + sums.get("DCGM_FI_DEV_FB_RESERVED", 0.0)) * MIB
    return ClusterNode(
        hostname=host, counts=counts_by_class, models=tally.models,
        utilization_pct=util / util_count if util is not None and util_count else None,
        memory_used_bytes=None if used is None else used * MIB, memory_total_bytes=total,
        problems=tuple(f"GPU {index}: {why}" for index, (_status, why) in sorted(statuses.items())),
        xid_now=len(tally.xids or {}), detailed=False, group=tally.group)


__all__ = ["DETAIL_NODES_MAX", "FLEET_FROM_GPUS", "NodeAnswers", "NodeQueries", "detail_hosts",
           "detail_queries", "fleet_nodes", "node_queries"]
