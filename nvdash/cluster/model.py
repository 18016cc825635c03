"""The cluster as Prometheus knows it: every node's GPUs with their newest readings and health, and the pods
that hold them, rebuilt from the dcgm-exporter families every nvdash node exports.

A node may export dcgm-exporter 4.8's names or 4.9's (``--metrics-compat 4.9``, or a real dcgm-exporter 4.9), and
label its host ``Hostname`` or ``hostname``. Every reading is read back here into 4.8's name and unit (the one
mapping of :mod:`nvdash.metrics.compat`, inverted), so the rest of the cluster view keeps one vocabulary.

Health is nvdash's own rules (:mod:`nvdash.health.status`) applied to readings turned back from dcgm-exporter's
units into nvdash's records, so a GPU is judged the same on its node's pages and on the cluster's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from nvdash.cluster.selectors import HOST_LABELS, SeriesScope
from nvdash.health.quotas import FINDING_KINDS
from nvdash.health.status import Finding, GpuHealth, Status, evaluate_gpu, worst
from nvdash.health.xid import xid_info
from nvdash.metrics.compat import RENAMES_4_9
from nvdash.metrics.fields import QUOTA_FAMILIES
from nvdash.sampling.records import GpuInfo, GpuSample

MIB = 1024 * 1024
FROM_4_9: Mapping[str, tuple[str, float, float]] = {
    rename.name: (family, rename.divisor, rename.factor) for family, rename in RENAMES_4_9.items()}
"""dcgm-exporter 4.9 family -> (its 4.8 name, multiplier, divisor): 4.9's value * multiplier / divisor is in 4.8's
unit."""


def names(family: str) -> tuple[str, ...]:
    """A 4.8 family's names under every naming, 4.8's first (one name where 4.9 kept it)."""
    rename = RENAMES_4_9.get(family)
    return (family,) if rename is None or rename.name == family else (family, rename.name)


def unit_back(name: str) -> tuple[str, float, float]:
    """(4.8 name, multiplier, divisor) of the family named ``name`` under either naming."""
    return FROM_4_9.get(name, (name, 1.0, 1.0))


def reading(name: str, value: float) -> tuple[str, float]:
    """A sample's family under 4.8's name and its value in 4.8's unit (MiB, MHz, %, mJ)."""
    family, multiplier, divisor = unit_back(name)
    return family, value * multiplier / divisor


def host_of(labels: Mapping[str, str]) -> str | None:
    """A series' host, whichever of the two host labels it carries."""
    for label in HOST_LABELS:
        if label in labels:
            return labels[label]
    return None


def _either(families: Iterable[str]) -> str:
    """A ``__name__`` regex matching the families under both namings."""
    return "|".join(name for family in families for name in names(family))

SEEN_WINDOW = "1h"
"""A GPU seen within this window but silent now is listed as not reporting."""

GAUGES = (
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "nvdash_gpu_lost", "nvdash_gpu_health_status",
)
"""The per-GPU families the overview reads (one instant query for all of them, under both namings: a node exporting
both gives each reading twice, read back to one value per family)."""

HEALTH_STATUS = "nvdash_gpu_health_status"
"""The node's own health verdict of a GPU (0 OK, 1 warning, 2 critical), from every nvdash node."""
POD_SM_SHARE = "nvdash_pod_gpu_sm_share_ratio"
POD_MEMORY = "nvdash_pod_gpu_memory_bytes"
CORE_QUOTA, MEMORY_QUOTA, QUOTA_FINDING = QUOTA_FAMILIES
IDLE_WINDOW = "30m"


@dataclass(frozen=True)
class ClusterQueries:
    """The instant queries of one refresh of the cluster's state, every series selected within ``scope``."""

    gpus: str
    """The per-GPU families of :data:`GAUGES` now."""
    seen: str
    """Every GPU of the last hour (a node exporting both namings is one GPU per node and index in the model)."""
    allocated: str
    """The pods' allocations."""
    pod_values: str
    """The pods' device readings (the device's value repeated per pod, with ``--metrics-pods``) and, where the node
    exports them, each pod's own share of the device's SM time and the memory its processes hold, its vGPU or MPS
    quota and the quota findings that hold now."""
    idle: str
    """The allocations idle at every scrape of the last 30 minutes (or since first scraped): no process of the pod
    on the device, or the device at 0 % utilization."""

    def all(self) -> tuple[str, ...]:
        """Every query, in the order a refresh asks them."""
        return (self.gpus, self.seen, self.allocated, self.pod_values, self.idle)


def gpu_labels(scope: SeriesScope) -> tuple[str, ...]:
    """The labels the overview reads of each GPU family's series; the query keeps only these, so that at 8,000 GPUs
    x 20 families the answer is not also carrying every series' driver version, PCI bus, device, pod, instance and
    job labels (half its bytes, decoded for nothing). ``max`` merges what differed only in those (a GPU's series
    exported once per pod sharing it: the same value)."""
    return ("__name__", *scope.host_labels, "gpu", "UUID", "modelName", *scope.group_labels)


def cluster_queries(scope: SeriesScope) -> ClusterQueries:
    """The refresh's queries, each series selected within ``scope``."""
    pod_families = _either(("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                            POD_SM_SHARE, POD_MEMORY, *QUOTA_FAMILIES))
    seen = " or ".join(f"last_over_time({scope.series(name)}[{SEEN_WINDOW}])"
                       for name in (*names("DCGM_FI_DEV_GPU_TEMP"), "nvdash_gpu_lost"))
    in_pod = 'pod!=""'
    gpu_selector = scope.series("", f'__name__=~"{_either(GAUGES)}"', 'GPU_I_ID=""')
    idle = " or ".join((f"min_over_time({scope.series('nvdash_pod_gpu_idle')}[{IDLE_WINDOW}]) == 1",
                        *(f"max_over_time({scope.series(name, in_pod)}[{IDLE_WINDOW}]) == 0"
                          for name in names("DCGM_FI_DEV_GPU_UTIL"))))
    return ClusterQueries(
        gpus=f"max by ({', '.join(gpu_labels(scope))}) ({gpu_selector})",
        seen=f"group by ({', '.join((*scope.host_labels, 'gpu', 'UUID', 'modelName', *scope.group_labels))}) ({seen})",
        allocated=scope.series("nvdash_pod_gpu_allocated"),
        pod_values=scope.series("", f'__name__=~"{pod_families}"', in_pod),
        idle=idle,
    )


DEFAULT_QUERIES = cluster_queries(SeriesScope())
GPU_QUERY, SEEN_QUERY, ALLOCATED_QUERY, POD_VALUES_QUERY, IDLE_QUERY = DEFAULT_QUERIES.all()
"""The queries with no selector and either host label (what ``--prometheus`` alone asks)."""
MIG_SLICES = 7
"""Compute slices of a whole MIG-capable GPU (the ``7g`` profile)."""


@dataclass(frozen=True)
class ClusterGpu:
    """One GPU of one node: identity, newest readings (dcgm-exporter 4.8's names and units, whichever naming the node
    exports) and health."""

    hostname: str
    index: int
    uuid: str
    model: str
    values: Mapping[str, float]
    health: GpuHealth
    reporting: bool = True
    """False when the GPU was seen within the last hour but Prometheus has no current reading of it."""
    group: str = ""
    """Its node's group (the value of ``--prometheus-group-label``), ``""`` when none."""

    def value(self, name: str) -> float | None:
        """A family's value, ``None`` where unknown."""
        return _float(self.values.get(name))

    @property
    def utilization_pct(self) -> float | None:
        """GPU utilization, 0-100."""
        return self.value("DCGM_FI_DEV_GPU_UTIL")

    @property
    def memory_used_bytes(self) -> float | None:
        """Framebuffer memory in use."""
        return _bytes(self.value("DCGM_FI_DEV_FB_USED"))

    @property
    def memory_total_bytes(self) -> float | None:
        """Used + free + reserved framebuffer memory."""
        parts = [self.value(name) for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")]
        if any(part is None for part in parts):
            return None
        return (sum(part for part in parts if part is not None) + (self.value("DCGM_FI_DEV_FB_RESERVED") or 0)) * MIB


@dataclass(frozen=True)
class ClusterPod:
    """One device a pod holds: where, what kind, and how busy it is."""

    hostname: str
    namespace: str
    pod: str
    container: str
    gpu: int
    uuid: str
    resource: str
    sharing: str
    """``whole``, ``mig``, ``shared`` (time-slicing), ``mps`` or ``vgpu``."""
    mig_profile: str = ""
    mig_instance: str = ""
    utilization_pct: float | None = None
    """The device's utilization (for a MIG instance its graphics-engine activity), 0-100."""
    memory_used_bytes: float | None = None
    """The device's used memory (all its pods' and the driver's)."""
    idle: bool = False
    """Idle at every scrape of the last 30 minutes: no process of the pod on the device, or 0 % utilization."""
    sm_share_pct: float | None = None
    """The pod's own share of the device's SM time, 0-100 (``nvdash_pod_gpu_sm_share_ratio``: its processes' SM
    time from NVML's per-process samples; a pod's shares on one device never add up to more than
    ``utilization_pct``); ``None`` where the node exports no shares."""
    pod_memory_bytes: float | None = None
    """GPU memory the pod's container's processes hold on the device (``nvdash_pod_gpu_memory_bytes``); ``None``
    where the node exports no shares."""
    core_quota_pct: float | None = None
    """The container's vGPU or MPS core quota, 0-100 of the GPU (``nvdash_pod_gpu_core_quota_ratio``); ``None``:
    no quota."""
    memory_quota_bytes: float | None = None
    """The container's GPU memory quota (``nvdash_pod_gpu_memory_quota_bytes``); ``None``: no quota."""
    findings: tuple[str, ...] = ()
    """The quota findings holding now (:data:`~nvdash.health.quotas.FINDING_KINDS`, in that order)."""

    @property
    def device(self) -> str:
        """``GPU 3`` or ``GPU 0 · 3g.20gb #1``."""
        if self.mig_profile:
            return f"GPU {self.gpu} · {self.mig_profile} #{self.mig_instance}"
        return f"GPU {self.gpu}"


class GpuClass(Enum):
    """A GPU's place in the fleet's tally, one per GPU, from least to most urgent."""

    OK = "ok"
    WARNING = "warning"
    NOT_REPORTING = "not reporting"
    CRITICAL = "critical"
    LOST = "lost"

    @property
    def rank(self) -> int:
        """0 for OK up to 4 for lost: a node is ranked by its worst GPU."""
        return list(GpuClass).index(self)

    @property
    def status(self) -> Status:
        """The health status the class shows as (a GPU not reporting is a warning, a lost one critical)."""
        return _CLASS_STATUS[self]


_CLASS_STATUS = {GpuClass.OK: Status.OK, GpuClass.WARNING: Status.WARNING, GpuClass.NOT_REPORTING: Status.WARNING,
                 GpuClass.CRITICAL: Status.CRITICAL, GpuClass.LOST: Status.CRITICAL}


def gpu_class(gpu: ClusterGpu) -> GpuClass:
    """A GPU's class: silent now but seen within the last hour (the nodes page's "no data"), fallen off the bus
    (``nvdash_gpu_lost``), else its health status."""
    if not gpu.reporting:
        return GpuClass.NOT_REPORTING
    if gpu.value("nvdash_gpu_lost") == 1.0:
        return GpuClass.LOST
    if gpu.health.status is Status.CRITICAL:
        return GpuClass.CRITICAL
    return GpuClass.WARNING if gpu.health.status is Status.WARNING else GpuClass.OK


@dataclass(frozen=True)
class ClusterNode:
    """One node: its GPUs tallied by class, their mean utilization and memory, and the first reason of each GPU not
    OK. Built from its GPUs' readings, or at fleet size from PromQL aggregations (``detailed`` False: its GPUs'
    readings were not fetched)."""

    hostname: str
    counts: Mapping[GpuClass, int]
    models: tuple[str, ...] = ()
    utilization_pct: float | None = None
    """Mean utilization of the GPUs reporting one, 0-100."""
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    problems: tuple[str, ...] = ()
    """``GPU 3: <its worst finding>`` for each GPU not OK, by index."""
    xid_now: int = 0
    """GPUs whose last XID code is non-zero now."""
    detailed: bool = True
    """Its GPUs' readings are in :attr:`ClusterState.gpus`."""
    group: str = ""
    """Its group (the value of ``--prometheus-group-label``), ``""`` when none."""

    @property
    def gpus(self) -> int:
        """GPUs reporting now or seen within the last hour."""
        return sum(self.counts.values())

    @property
    def worst(self) -> GpuClass:
        """The worst GPU's class (not reporting for a node without GPUs)."""
        return max((kind for kind, number in self.counts.items() if number), key=lambda kind: kind.rank,
                   default=GpuClass.NOT_REPORTING)

    @property
    def status(self) -> Status:
        """The worst GPU's health, as the overview's outline shows it."""
        return self.worst.status


def node_summary(hostname: str, gpus: Sequence[ClusterGpu]) -> ClusterNode:
    """A node from its GPUs' readings (the same numbers the fleet-size aggregation gives)."""
    counts = dict.fromkeys(GpuClass, 0)
    for gpu in gpus:
        counts[gpu_class(gpu)] += 1
    utils = [gpu.utilization_pct for gpu in gpus if gpu.reporting and gpu.utilization_pct is not None]
    used = [gpu.memory_used_bytes for gpu in gpus if gpu.memory_used_bytes is not None]
    totals = [gpu.memory_total_bytes for gpu in gpus if gpu.memory_total_bytes is not None]
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    return ClusterNode(
        hostname=hostname, counts=counts, models=tuple(sorted({gpu.model for gpu in gpus if gpu.model})),
        utilization_pct=sum(utils) / len(utils) if utils else None,
        memory_used_bytes=sum(used) if used else None, memory_total_bytes=sum(totals) if totals else None,
        problems=tuple(f"GPU {gpu.index}: {gpu.health.findings[0].text}" for gpu in ordered
                       if gpu.health.status is not Status.OK and gpu.health.findings),
        xid_now=sum(1 for gpu in gpus if gpu.reporting and (gpu.value("DCGM_FI_DEV_XID_ERRORS") or 0) != 0),
        group=next((gpu.group for gpu in gpus if gpu.group), ""))


def summarize(gpus: Iterable[ClusterGpu]) -> tuple[ClusterNode, ...]:
    """Every node of ``gpus``, sorted by name."""
    found: dict[str, list[ClusterGpu]] = {}
    for gpu in gpus:
        found.setdefault(gpu.hostname, []).append(gpu)
    return tuple(node_summary(host, found[host]) for host in sorted(found))


@dataclass(frozen=True)
class ClusterState:
    """What the cluster pages show: the nodes, GPUs and pods as of ``time_s``, or why Prometheus could not say.

    Up to a few hundred GPUs every GPU's readings are fetched and ``nodes`` summarize them; at fleet size
    (``fleet``) the nodes come from PromQL aggregations and ``gpus`` holds only the GPUs of the nodes fetched in
    detail (a node chosen on a page, and the nodes with a GPU not OK)."""

    time_s: float = 0.0
    gpus: tuple[ClusterGpu, ...] = ()
    nodes: tuple[ClusterNode, ...] = ()
    """Every node, sorted by name (made from ``gpus`` when not given)."""
    fleet: bool = False
    """The nodes come from aggregations; ``gpus`` holds the detailed nodes' GPUs only."""
    pods: tuple[ClusterPod, ...] = ()
    error: str | None = None
    """The newest failure (Prometheus down, slow, or refusing); the rest is the last good answer."""
    refused: bool = False
    """The newest failure is Prometheus refusing nvdash's credentials (HTTP 401 or 403)."""
    ok_time_s: float | None = None
    """When Prometheus last answered; ``None`` before its first answer."""
    truncated: bool = False
    """Some series were cut off by the series bound."""
    generation: int = 0
    """Rises with every refresh, good or failed, so pages redraw only on change."""
    queries_ms: float = 0.0
    """How long the last refresh's queries took together."""

    def __post_init__(self) -> None:
        if not self.nodes and self.gpus:
            object.__setattr__(self, "nodes", summarize(self.gpus))

    @property
    def hostnames(self) -> list[str]:
        """The nodes, sorted."""
        return [node.hostname for node in self.nodes]

    @property
    def gpu_count(self) -> int:
        """Every node's GPUs (reporting, or seen within the last hour)."""
        return sum(node.gpus for node in self.nodes)

    def groups(self) -> list[str]:
        """The nodes' groups, sorted (none without ``--prometheus-group-label``)."""
        return sorted({node.group for node in self.nodes if node.group})

    def in_group(self, group: str) -> ClusterState:
        """This state with only the nodes (and GPUs) of ``group`` (``""``: every node); at fleet size, a group whose
        every node was read GPU by GPU is no longer aggregated."""
        if not group:
            return self
        nodes = tuple(node for node in self.nodes if node.group == group)
        hosts = {node.hostname for node in nodes}
        return replace(self, nodes=nodes, gpus=tuple(gpu for gpu in self.gpus if gpu.hostname in hosts),
                       fleet=self.fleet and not all(node.detailed for node in nodes))

    def node(self, hostname: str) -> list[ClusterGpu]:
        """One node's GPUs, by index."""
        return sorted((gpu for gpu in self.gpus if gpu.hostname == hostname), key=lambda gpu: gpu.index)

    def by_node(self) -> dict[str, list[ClusterGpu]]:
        """Every node's GPUs by index, the nodes sorted: one pass over the GPUs (asking :meth:`node` of each node
        is quadratic: 8 million comparisons at 1,000 nodes x 8 GPUs)."""
        found: dict[str, list[ClusterGpu]] = {}
        for gpu in self.gpus:
            found.setdefault(gpu.hostname, []).append(gpu)
        return {host: sorted(found[host], key=lambda gpu: gpu.index) for host in sorted(found)}


@dataclass
class _Gpu:
    labels: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)


def _float(value: float | None) -> float | None:
    """A reading, ``None`` where unknown: Prometheus's ``NaN`` and ``±Inf`` are no reading of a GPU."""
    return None if value is None or not math.isfinite(value) else value


def _int(value: float | None) -> int | None:
    known = _float(value)
    return None if known is None else int(known)


def _bytes(mib: float | None) -> int | None:
    known = _float(None if mib is None else mib * MIB)
    return None if known is None else int(known)


def _index(label: str) -> int | None:
    """A ``gpu`` label's index: ASCII digits only (``str.isdigit`` also admits ``²``, which ``int`` refuses)."""
    return int(label) if label.isascii() and label.isdigit() else None


def gpu_records(index: int, model: str, uuid: str, values: Mapping[str, float]) -> tuple[GpuInfo, GpuSample]:
    """dcgm-exporter's readings of one GPU (4.8's names and units) as nvdash's records (the fields the health rules
    read, and the power limits).

    ``power_limit_w`` is the enforced limit, ``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``; an exporter without it (a plain
    dcgm-exporter exports it only when its counters file asks) gives the requested ``DCGM_FI_DEV_POWER_MGMT_LIMIT``
    instead, the enforced limit's upper bound, and neither: ``None``."""
    def get(name: str) -> float | None:
        return _float(values.get(name))

    used, free, reserved = get("DCGM_FI_DEV_FB_USED"), get("DCGM_FI_DEV_FB_FREE"), get("DCGM_FI_DEV_FB_RESERVED")
    total = None if used is None or free is None else used + free + (reserved or 0.0)
    info = GpuInfo(index=index, name=model, uuid=uuid, memory_total_bytes=_bytes(total),
                   pcie_generation=_int(get("DCGM_FI_DEV_PCIE_MAX_LINK_GEN")),
                   pcie_width=_int(get("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH")), pcie_max_bytes_per_s=None,
                   nvlink_links=0, nvlink_max_bytes_per_s=None, temperature_slowdown_c=get("DCGM_FI_DEV_SLOWDOWN_TEMP"))
    if get("nvdash_gpu_lost") == 1.0:
        return info, GpuSample(index=index, lost=True)
    pending, failure = get("DCGM_FI_DEV_ROW_REMAP_PENDING"), get("DCGM_FI_DEV_ROW_REMAP_FAILURE")
    enforced, requested = get("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"), get("DCGM_FI_DEV_POWER_MGMT_LIMIT")
    sample = GpuSample(
        index=index,
        utilization_pct=get("DCGM_FI_DEV_GPU_UTIL"),
        memory_used_bytes=_bytes(used),
        memory_total_bytes=_bytes(total),
        memory_reserved_bytes=_bytes(reserved),
        temperature_c=get("DCGM_FI_DEV_GPU_TEMP"),
        memory_temperature_c=get("DCGM_FI_DEV_MEMORY_TEMP"),
        power_w=get("DCGM_FI_DEV_POWER_USAGE"),
        power_limit_w=enforced if enforced is not None else requested,
        power_management_limit_w=requested,
        clock_event_reasons=_int(get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")),
        ecc_uncorrected_volatile=_int(get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
        remap_pending=None if pending is None else pending > 0,
        remap_failure=None if failure is None else failure > 0,
        pcie_generation_current=_int(get("DCGM_FI_DEV_PCIE_LINK_GEN")),
        pcie_width_current=_int(get("DCGM_FI_DEV_PCIE_LINK_WIDTH")),
    )
    return info, sample


def gpu_health(index: int, model: str, uuid: str, values: Mapping[str, float], now_s: float, *,
               reporting: bool = True) -> GpuHealth:
    """nvdash's health rules over one GPU's readings from Prometheus, plus its last XID (the XID alert's rule:
    a non-zero ``DCGM_FI_DEV_XID_ERRORS`` stands until another XID replaces it)."""
    if not reporting:
        return GpuHealth(index, Status.WARNING, (Finding(Status.WARNING, "not reporting: no reading in Prometheus "
                                                         "now (nvdash down or the node unreachable?)", "lost"),))
    info, sample = gpu_records(index, model, uuid, values)
    health = evaluate_gpu(info, sample, (), now_s)
    code = _int(values.get("DCGM_FI_DEV_XID_ERRORS"))
    if not sample.lost and code:
        xid = xid_info(code)
        findings = (*health.findings, Finding(Status(xid.severity), f"last XID {code}: {xid.meaning}", "xid",
                                              xid.action))
        ordered = tuple(sorted(findings, key=lambda finding: -finding.status.rank))
        health = GpuHealth(index, worst(finding.status for finding in ordered), ordered)
    verdict = _int(values.get(HEALTH_STATUS))
    if not sample.lost and verdict in (1, 2) and verdict > health.status.rank:
        status = Status.CRITICAL if verdict == 2 else Status.WARNING
        finding = Finding(status, f"{status.label} by its node's own health rules (its node's Health page says why)",
                          "node")
        health = GpuHealth(index, status, (finding, *health.findings))
    return health


def _gpu_key(labels: Mapping[str, str]) -> tuple[str, str] | None:
    host, gpu = host_of(labels), labels.get("gpu")
    if host is None or gpu is None or _index(gpu) is None:
        return None
    return host, gpu


def build_gpus(current: Iterable[tuple[Mapping[str, str], float]], seen: Iterable[Mapping[str, str]],
               now_s: float, group_label: str = "") -> tuple[ClusterGpu, ...]:
    """The GPUs from the overview's instant query (``__name__`` on each sample, either naming) and the last hour's GPU
    list; each GPU's group read from ``group_label`` (``""``: none)."""
    gpus: dict[tuple[str, str], _Gpu] = {}
    for labels, number in current:
        key = _gpu_key(labels)
        name = labels.get("__name__")
        if key is None or name is None:
            continue
        gpu = gpus.setdefault(key, _Gpu(dict(labels)))
        family, value = reading(name, number)
        gpu.values[family] = value
    for labels in seen:
        key = _gpu_key(labels)
        if key is not None and key not in gpus:
            gpus[key] = _Gpu(dict(labels))
    result = []
    for (host, index), gpu in gpus.items():
        reporting = bool(gpu.values)
        model, uuid = gpu.labels.get("modelName", ""), gpu.labels.get("UUID", "")
        health = gpu_health(int(index), model, uuid, gpu.values, now_s, reporting=reporting)
        group = gpu.labels.get(group_label, "") if group_label else ""
        result.append(ClusterGpu(host, int(index), uuid, model, dict(gpu.values), health, reporting, group))
    return tuple(sorted(result, key=lambda gpu: (gpu.hostname, gpu.index)))


PodKey = tuple[str, str, str, str, str, str]


def _pod_key(labels: Mapping[str, str]) -> PodKey:
    return (host_of(labels) or "", labels.get("namespace", ""), labels.get("pod", ""),
            labels.get("container", ""), labels.get("gpu", ""), labels.get("GPU_I_ID", ""))


def build_pods(allocated: Iterable[Mapping[str, str]], values: Iterable[tuple[Mapping[str, str], float]],
               idle: Iterable[tuple[Mapping[str, str], float]]) -> tuple[ClusterPod, ...]:
    """One row per pod allocation (once, though two exporters of one node, under either naming, list it), with its
    device's utilization and memory, its own share of the device and memory where the node exports them, and
    whether it sat idle."""
    readings: dict[PodKey, dict[str, float]] = {}
    quotas: list[tuple[Mapping[str, str], float]] = []
    for labels, number in values:
        if labels.get("__name__") in QUOTA_FAMILIES:
            quotas.append((labels, number))
            continue
        family, value = reading(labels.get("__name__", ""), number)
        readings.setdefault(_pod_key(labels), {})[family] = value
    idle_keys = {_pod_key(labels) for labels, _number in idle}
    rows = []
    listed: set[PodKey] = set()
    for labels in allocated:
        key = _pod_key(labels)
        gpu = _index(labels.get("gpu", ""))
        if gpu is None or not key[2] or key in listed:
            continue
        listed.add(key)
        found = readings.get(key, {})
        util = found.get("DCGM_FI_DEV_GPU_UTIL")
        if util is None and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in found:
            util = found["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] * 100.0
        used = found.get("DCGM_FI_DEV_FB_USED")
        share = _float(found.get(POD_SM_SHARE))
        rows.append(ClusterPod(
            hostname=key[0], namespace=key[1], pod=key[2], container=key[3], gpu=gpu,
            uuid=labels.get("UUID", ""), resource=labels.get("resource", ""), sharing=labels.get("sharing", ""),
            mig_profile=labels.get("GPU_I_PROFILE", ""), mig_instance=labels.get("GPU_I_ID", ""),
            utilization_pct=_float(util), memory_used_bytes=_bytes(used),
            idle=key in idle_keys,
            sm_share_pct=None if share is None else share * 100.0, pod_memory_bytes=_float(found.get(POD_MEMORY)),
        ))
    rows = with_quotas(rows, quotas)
    return tuple(sorted(rows, key=lambda row: (row.namespace, row.pod, row.container, row.hostname, row.gpu,
                                               row.mig_instance)))


UNALLOCATED = "unallocated"
"""The kind of a row a finding of use on a GPU nobody was allocated adds."""


def _quota_target(labels: Mapping[str, str]) -> tuple[tuple[str, str, str, str], str, str]:
    """(host, namespace, pod, container), the GPU index and the MIG instance a quota series names (``""``: none)."""
    who = (host_of(labels) or "", labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
    return who, labels.get("gpu", ""), labels.get("GPU_I_ID", "")


def _matches(row: ClusterPod, gpu: str, instance: str) -> bool:
    """Whether a quota series naming ``gpu`` (``""``: a GPU-Manager grant, any of the pod's) is about ``row``."""
    return not gpu or (str(row.gpu) == gpu and row.mig_instance == instance)


def with_quotas(rows: Sequence[ClusterPod], series: Iterable[tuple[Mapping[str, str], float]]) -> list[ClusterPod]:
    """``rows`` with each container's quota and findings (``nvdash_pod_gpu_*_quota_*``, ``..._quota_finding``),
    matched on host, namespace, pod, container and the series' GPU (every GPU of the container where it names none).
    A finding about no allocated device (``unallocated_use``: a pod's processes on a GPU nobody was given) adds a
    row of its own, kind ``unallocated``."""
    result = list(rows)
    extra: dict[tuple[str, ...], int] = {}
    for labels, number in series:
        family = labels.get("__name__", "")
        value = _float(number)
        finding = labels.get("finding", "")
        if value is None or (family == QUOTA_FINDING and (value != 1.0 or finding not in FINDING_KINDS)):
            continue
        who, gpu, instance = _quota_target(labels)
        hits = [i for i, row in enumerate(result)
                if (row.hostname, row.namespace, row.pod, row.container) == who and _matches(row, gpu, instance)]
        if not hits and family == QUOTA_FINDING and _index(gpu) is not None:
            key = (*who, gpu, instance)
            if key not in extra:
                extra[key] = len(result)
                result.append(ClusterPod(
                    hostname=who[0], namespace=who[1], pod=who[2], container=who[3], gpu=int(gpu),
                    uuid=labels.get("UUID", ""), resource="", sharing=UNALLOCATED,
                    mig_profile=labels.get("GPU_I_PROFILE", ""), mig_instance=instance))
            hits = [extra[key]]
        for i in hits:
            row = result[i]
            if family == CORE_QUOTA:
                result[i] = replace(row, core_quota_pct=value * 100.0)
            elif family == MEMORY_QUOTA:
                result[i] = replace(row, memory_quota_bytes=value)
            elif family == QUOTA_FINDING and finding not in row.findings:
                result[i] = replace(row, findings=tuple(kind for kind in FINDING_KINDS
                                                        if kind in (*row.findings, finding)))
    return result


def mig_slices(profile: str) -> int | None:
    """The compute slices of a MIG profile: 3 for ``3g.20gb`` (and for ``1c.3g.20gb``'s GPU instance)."""
    for part in profile.split("."):
        if part.endswith("g") and part[:-1].isdigit():
            return int(part[:-1])
    return None


def gpu_shares(pods: Sequence[ClusterPod]) -> list[float]:
    """Each allocation's share of a whole GPU: 1 for a whole GPU, slices / 7 for a MIG instance, and 1 / N for
    each of the N pods sharing a GPU (time-slicing, MPS, vGPU)."""
    shared_kinds = ("shared", "mps", "vgpu")
    sharing: dict[tuple[str, int], int] = {}
    for pod in pods:
        if pod.sharing in shared_kinds:
            sharing[(pod.hostname, pod.gpu)] = sharing.get((pod.hostname, pod.gpu), 0) + 1
    shares = []
    for pod in pods:
        if pod.sharing == "mig":
            slices = mig_slices(pod.mig_profile)
            shares.append(slices / MIG_SLICES if slices else 0.0)
        elif pod.sharing in shared_kinds:
            shares.append(1.0 / sharing[(pod.hostname, pod.gpu)])
        else:
            shares.append(1.0)
    return shares
