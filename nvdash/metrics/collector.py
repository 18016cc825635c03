"""The ``prometheus_client`` collector behind ``/metrics``: the store's newest snapshot in dcgm-exporter's names.

A scrape reads only the store (the sampler's newest snapshot, with its usage reading, and the event log); it never
calls NVML, so any number of scrapers cost the sampler nothing.

Series, as dcgm-exporter writes them:

- one per GPU, labelled :data:`GPU_LABELS` (and the counters file's ``label`` rows);
- one more per GPU instance of a GPU in MIG mode, for the families an instance reads for itself
  (:data:`~nvdash.metrics.fields.MIG_FIELDS`), with the parent GPU's labels plus ``GPU_I_PROFILE`` and ``GPU_I_ID``;
- with pods on (``--metrics-pods``), a GPU's or instance's series once per container the kubelet allocated it to,
  with ``namespace``, ``pod`` and ``container`` (several for a time-sliced or MPS GPU shared by several pods), and
  the :data:`~nvdash.metrics.fields.POD_FAMILIES`;
- with processes on (``--metrics-processes``), the :data:`~nvdash.metrics.fields.PROCESS_FAMILIES`, one series per
  process on a GPU or instance;
- whenever the snapshot's shares name pods, the :data:`~nvdash.metrics.fields.POD_SHARE_FAMILIES`: one series per
  pod's container and GPU or instance, its part of the device's SM time, memory, power and energy (not the device's
  value repeated), and the :data:`~nvdash.metrics.fields.UNATTRIBUTED_FAMILIES` per device: what no owner explains;
- :data:`~nvdash.metrics.fields.HEALTH_FAMILY` per GPU: the node's own health verdict of it, judged by the one judge
  the Health page, the index page and ``/api/snapshot.json`` use (:func:`~nvdash.health.status.evaluate`, with the
  event log and the accountant's idle allocations, at the server's clock), so a cluster view can tell from it alone
  which GPUs need a closer look;
- with an accountant (a live server, not a replay), the :data:`~nvdash.metrics.fields.ACCOUNTING_FAMILIES`, one
  series per GPU: ``nvdash_gpu_allocated_idle_seconds``;
- with ``--metrics-accounting`` and an accountant, the accountant's counters per owner since nvdash started
  (:mod:`nvdash.metrics.accounting_families`), node-level (no GPU labels);
- with the job label on (``--metrics-job-label``), every series of a GPU or instance also carries :data:`JOB_LABEL`
  (dcgm-exporter's HPC job mapping label), naming the owners the accountant found for it;
- on a live server (``ExportOptions.stale_after_s``), :data:`LAST_SAMPLE_FAMILY` and
  :data:`LAST_PROCESS_SAMPLE_FAMILY` (when processes are read), and no GPU readings at all once the newest sweep is
  older than ``stale_after_s``: Prometheus then marks the series stale instead of recording frozen values as fresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from nvdash.health.quota_judge import store_findings
from nvdash.health.status import evaluate
from nvdash.metrics.accounting_families import OwnerBound, accounting_families
from nvdash.metrics.compat import Naming
from nvdash.metrics.counters import Counter
from nvdash.metrics.fields import (
    ACCOUNTING_FAMILIES,
    FAMILIES,
    FIELDS,
    HEALTH_FAMILY,
    MIG_FIELDS,
    POD_FAMILIES,
    POD_SHARE_FAMILIES,
    PROCESS_FAMILIES,
    QUOTA_FAMILIES,
    SHARE_FAMILIES,
    UNATTRIBUTED_FAMILIES,
    WHEN_LOST,
    GpuView,
    MigView,
)
from nvdash.metrics.quota_families import quota_families
from nvdash.metrics.xid_names import xid_err_msg
from nvdash.sampling.records import GpuEvent, GpuInfo, Snapshot
from nvdash.sampling.share_records import UnitShares
from nvdash.sampling.usage_records import GpuProcess, MigInstance, PodDevice, Usage
from nvdash.store import Store

if TYPE_CHECKING:
    from nvdash.accounting.accountant import Accountant
    from nvdash.accounting.attribution import Share

LAST_SAMPLE_FAMILY = "nvdash_last_sample_timestamp_seconds"
"""Unix time of the newest completed sweep (an alert fires when it falls behind)."""
LAST_PROCESS_SAMPLE_FAMILY = "nvdash_last_process_sample_timestamp_seconds"
"""Unix time of the newest reading of the GPU processes."""
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
"""dcgm-exporter's labels on every per-GPU series; ``--metrics-labels`` chooses among these."""
LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)
"""The ``label`` rows nvdash can fill: the field becomes a label of every series."""
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
POD_LABELS = ("namespace", "pod", "container")
PROCESS_LABELS = ("pid", "process_name")
ALLOCATION_LABELS = ("resource", "sharing")
KEPT_LABELS = (*MIG_LABELS, *POD_LABELS, *PROCESS_LABELS, *ALLOCATION_LABELS, "err_code", "err_msg")
"""Labels that tell the series of one GPU apart: always written (leaving one off would make series collide)."""
XID_FAMILY = "DCGM_FI_DEV_XID_ERRORS"
ALLOCATED_FAMILY, IDLE_FAMILY = POD_FAMILIES
MEMORY_FAMILY, SM_FAMILY = PROCESS_FAMILIES
(IDLE_SECONDS_FAMILY,) = ACCOUNTING_FAMILIES
POD_SM_FAMILY, POD_MEMORY_FAMILY, POD_POWER_FAMILY, POD_ENERGY_FAMILY = POD_SHARE_FAMILIES
UNATTRIBUTED_SM_FAMILY, UNATTRIBUTED_POWER_FAMILY, UNATTRIBUTED_ENERGY_FAMILY = UNATTRIBUTED_FAMILIES
JOB_LABEL = "hpc_job"
"""The owner label of ``--metrics-job-label``: dcgm-exporter's name for the job its HPC job mapping finds for a GPU
(``hpcJobAttribute`` in its ``internal/pkg/transformation/const.go``)."""
JOB_KINDS = ("slurm", "pod")
"""The owners the job label names, in order of preference: Slurm jobs, else pods (``namespace/pod``)."""

Labels = dict[str, str]


def _ratio(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


def unknown_fields(counters: Sequence[Counter]) -> list[str]:
    """The names of a counters file that nvdash cannot export."""
    return [counter.name for counter in counters
            if (counter.name not in LABEL_FIELDS if counter.kind == "label" else counter.name not in FAMILIES)]


def xid_labels(code: int) -> dict[str, str]:
    """``err_code`` and ``err_msg`` of the XID family's sample, as dcgm-exporter adds them, in its words (0: no
    error)."""
    return {"err_code": str(code), "err_msg": xid_err_msg(code)}


def last_xids(events: Sequence[GpuEvent]) -> dict[int, int]:
    """Each GPU's newest XID code."""
    codes: dict[int, int] = {}
    for event in sorted(events, key=lambda event: event.time_s):
        if event.kind == "xid" and event.gpu_index is not None and event.code is not None:
            codes[event.gpu_index] = event.code
    return codes


def job_label_value(shares: Iterable[Share]) -> str:
    """The job label's value for a device owned by ``shares``: its Slurm job IDs, else its pods' ``namespace/pod``,
    sorted and comma-joined (several for MIG instances or a shared GPU); ``""`` when no job or pod owns it."""
    by_kind: dict[str, set[str]] = {}
    for share in shares:
        by_kind.setdefault(share.owner.kind, set()).add(share.owner.job)
    for kind in JOB_KINDS:
        if by_kind.get(kind):
            return ",".join(sorted(by_kind[kind]))
    return ""


def idle_seconds(accountant: Accountant) -> dict[int, float]:
    """GPU index -> how long its longest-idle flagged allocation has been idle, at the accountant's latest reading
    (GPUs with none flagged are absent)."""
    now_s, flagged = accountant.idle()
    longest: dict[int, float] = {}
    for allocation in flagged:
        idle = allocation.idle_s(now_s)
        if idle > longest.get(allocation.gpu_index, -1.0):
            longest[allocation.gpu_index] = idle
    return longest


def process_name(process: GpuProcess) -> str:
    """The base name of the process's executable (its command's first word), or ``""`` when the host cannot say."""
    command = process.host.command if process.host is not None else None
    words = command.split(maxsplit=1) if command else []
    return words[0].rsplit("/", 1)[-1] if words else ""


def instance_profile(profile: str) -> str:
    """The GPU instance profile of a MIG device's profile: ``3g.20gb`` also for a compute instance ``1c.3g.20gb``."""
    parts = profile.split(".")
    return ".".join(parts[1:]) if len(parts) == 3 and parts[0].endswith("c") else profile


def mig_view(instances: Sequence[MigInstance]) -> MigView:
    """One GPU instance from its MIG devices (one per compute instance; they share the instance's memory)."""
    first = instances[0]

    def weighted(pick: Callable[[MigInstance], float | None]) -> float | None:
        activity = [(value, i.sm_count or 1) for i in instances if (value := pick(i)) is not None]
        if not activity or len(activity) != len(instances):
            return None
        return sum(pct * weight for pct, weight in activity) / sum(weight for _, weight in activity)

    return MigView(profile=instance_profile(first.profile), gpu_instance_id=first.gpu_instance_id,
                   memory_used_bytes=first.memory_used_bytes, memory_total_bytes=first.memory_total_bytes,
                   sm_active_pct=weighted(lambda i: i.sm_active_pct),
                   gpm_sm_active_pct=weighted(lambda i: i.gpm_sm_active_pct),
                   gpm_sm_occupancy_pct=weighted(lambda i: i.gpm_sm_occupancy_pct))


@dataclass(frozen=True)
class ExportOptions:
    """What ``/metrics`` exports and how its series are labelled."""

    hostname: str
    drop_labels: frozenset[str] = frozenset()
    """Labels left off every series (``--metrics-labels``); only :data:`GPU_LABELS` and :data:`LABEL_FIELDS`."""
    pods: bool = False
    """Label series with the pod using the device, and export the pod families (``--metrics-pods``)."""
    processes: bool = False
    """Export the per-process families (``--metrics-processes``)."""
    job_label: bool = False
    """Label every series of a GPU or instance with its owners, :data:`JOB_LABEL` (``--metrics-job-label``)."""
    naming: Naming = field(default_factory=Naming)
    """The dcgm-exporter version whose family and label names (and units) the scrape uses
    (``--metrics-compat``); the default is 4.8's."""
    stale_after_s: float | None = None
    """A live server's bound: GPU readings older than this are not exported, and the newest sweep's and process
    reading's times are (``None``: a replay or a test, every reading exported as it is)."""
    accounting: OwnerBound | None = None
    """With ``--metrics-accounting``: the accountant's counters per owner, this many owners at most (one bound per
    server, shared by its scrapes: see :mod:`nvdash.metrics.accounting_families`)."""


@dataclass
class _Scrape:
    """One scrape's series targets, built once and shared by every family (label dicts are reused, not copied)."""

    gpus: list[tuple[GpuView, list[Labels]]] = field(default_factory=list)
    """Each GPU's view and its label sets: one, or one per container allocated the GPU."""
    migs: list[tuple[MigView, list[Labels]]] = field(default_factory=list)
    """Each GPU instance's view and its label sets."""
    devices: dict[str, Labels] = field(default_factory=dict)
    """GPU or MIG UUID -> the device's labels (without pod labels)."""
    lost: set[str] = field(default_factory=set)
    """UUIDs of the GPUs that stopped answering."""
    usage: Usage | None = None
    shares: tuple[UnitShares, ...] = ()
    """How each GPU or instance divides among its owners (the snapshot's)."""
    idle_s: dict[int, float] | None = None
    """With an accountant: GPU index -> seconds its longest-idle flagged allocation has been idle."""


class StoreCollector:
    """Yields the counters file's families for every GPU (and GPU instance) of the store's newest snapshot.

    ``accountant`` (a live server's; ``None`` in a replay) gives the accounting families and the job label's
    owners."""

    def __init__(self, store: Store, counters: Sequence[Counter], options: ExportOptions,
                 openmetrics: bool = False, accountant: Accountant | None = None,
                 *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.accountant = accountant
        self.counters = [counter for counter in counters if counter.kind != "label" and counter.name in FAMILIES]
        self.judges = any(counter.name == HEALTH_FAMILY for counter in self.counters)
        self.options = options
        self.openmetrics = openmetrics
        self.label_names = [name for name in GPU_LABELS if name not in options.drop_labels]
        self.extra_labels = self._extra_labels([c.name for c in counters if c.kind == "label"])

    def _extra_labels(self, names: Sequence[str]) -> dict[str, str]:
        """The ``label`` rows' labels and values (a value nvdash does not know leaves its label off)."""
        driver = self.store.inventory.driver_version
        values = {"DCGM_FI_DRIVER_VERSION": driver}
        return {name: value for name in names if (value := values.get(name)) and name not in self.options.drop_labels}

    def _labels(self, info: GpuInfo) -> Labels:
        values = {
            "gpu": str(info.index), "UUID": info.uuid, "pci_bus_id": info.pci_bus_id, "device": f"nvidia{info.index}",
            "modelName": info.name, "Hostname": self.options.hostname,
        }
        labels = {name: values[name] for name in self.label_names}
        labels.update(self.extra_labels)
        return labels

    def _family(self, counter: Counter) -> Metric:
        kind = counter.kind
        if kind == "counter" and self.openmetrics and counter.name.endswith("_total"):
            return Metric(counter.name.removesuffix("_total"), counter.help, kind)  # samples keep the _total name
        if kind == "counter" and self.openmetrics:
            # OpenMetrics wants counters' samples named *_total; dcgm-exporter's names have none, and renaming them
            # would break the dashboards and rules written for them: declare them untyped there.
            kind = "unknown"
        return Metric(counter.name, counter.help, kind)

    # The scrape's series

    def _allocations(self, usage: Usage | None) -> dict[str, list[PodDevice]]:
        """GPU or MIG UUID -> the kubelet's allocations of it (shared replicas ``GPU-...::N`` under the GPU)."""
        found: dict[str, list[PodDevice]] = {}
        if self.options.pods and usage is not None:
            for device in usage.pods.devices:
                found.setdefault(device.uuid, []).append(device)
        return found

    @staticmethod
    def _with_pods(labels: Labels, devices: Sequence[PodDevice]) -> list[Labels]:
        """``labels`` once per container allocated the device (each container once), or alone when none is."""
        variants: dict[tuple[str, str, str], Labels] = {}
        for device in devices:
            key = (device.namespace, device.pod, device.container)
            if key not in variants:
                variants[key] = {**labels, "namespace": device.namespace, "pod": device.pod,
                                 "container": device.container}
        return list(variants.values()) or [labels]

    def _fresh(self, snapshot: Snapshot | None) -> Snapshot | None:
        """``snapshot`` unless it is older than the options' bound."""
        bound = self.options.stale_after_s
        if snapshot is None or bound is None or self.clock() - snapshot.time_s <= bound:
            return snapshot
        return None

    def _scrape(self, snapshot: Snapshot | None) -> _Scrape:
        scrape = _Scrape()
        if snapshot is None:
            return scrape
        infos = {info.index: info for info in self.store.inventory.gpus}
        events = self.store.events()
        xids = last_xids(events)
        usage = scrape.usage = snapshot.usage
        scrape.shares = snapshot.shares
        allocations = self._allocations(usage)
        if self.accountant is not None:
            scrape.idle_s = idle_seconds(self.accountant)
        owners = self._owners()
        verdicts = self._verdicts(snapshot, events)
        for sample in snapshot.gpus:
            info = infos.get(sample.index)
            if info is None:
                continue
            labels = scrape.devices[info.uuid] = self._labels(info)
            if owners is not None:
                labels[JOB_LABEL] = job_label_value(owners.get(info.index, ()))
            if sample.lost:
                scrape.lost.add(info.uuid)
            view = GpuView(info, sample, xids.get(sample.index, 0), verdicts.get(sample.index))
            scrape.gpus.append((view, self._with_pods(labels, allocations.get(info.uuid, ()))))
        for gpu in usage.gpus if usage is not None else ():
            parent = scrape.devices.get(gpu.uuid)
            if parent is None or gpu.uuid in scrape.lost or not gpu.instances:
                continue
            by_instance: dict[int, list[MigInstance]] = {}
            for instance in gpu.instances:
                by_instance.setdefault(instance.gpu_instance_id, []).append(instance)
            for instances in by_instance.values():
                mig = mig_view(instances)
                labels = {**parent, "GPU_I_PROFILE": mig.profile, "GPU_I_ID": str(mig.gpu_instance_id)}
                if owners is not None:
                    units = {instance.uuid for instance in instances}
                    labels[JOB_LABEL] = job_label_value(
                        share for share in owners.get(gpu.index, ()) if share.unit in units)
                devices: list[PodDevice] = []
                for instance in instances:
                    scrape.devices[instance.uuid] = labels
                    devices += allocations.get(instance.uuid, ())
                scrape.migs.append((mig, self._with_pods(labels, devices)))
        return scrape

    def _verdicts(self, snapshot: Snapshot, events: Sequence[GpuEvent]) -> dict[int, int]:
        """GPU index -> the rank of the node's health verdict of it (empty when the family is not exported): the
        same judge, inputs and clock as the Health page's, so both say the same of every GPU."""
        if not self.judges:
            return {}
        idle = self.accountant.idle()[1] if self.accountant is not None else ()
        health = evaluate(self.store.inventory, snapshot, events, self.clock(), idle=idle)
        return {item.index: item.status.rank for item in health}

    def _owners(self) -> dict[int, list[Share]] | None:
        """With the job label on: GPU index -> the accountant's shares of it at its latest reading (none without an
        accountant); ``None`` with the label off."""
        if not self.options.job_label:
            return None
        owners: dict[int, list[Share]] = {}
        for share in self.accountant.shares if self.accountant is not None else ():
            owners.setdefault(share.gpu_index, []).append(share)
        return owners

    # Families

    def collect(self) -> Iterator[Metric]:
        """One family per exported name: a sample per GPU (and instance, allocation, process) that reads it, under
        the options' naming."""
        return self.options.naming.families(self._collect())

    def _collect(self) -> Iterator[Metric]:
        newest: Snapshot | None = self.store.latest()
        scrape = self._scrape(self._fresh(newest))
        pods: dict[str, Metric] | None = None
        processes: dict[str, Metric] | None = None
        shares: dict[str, Metric] | None = None
        quotas: dict[str, Metric] | None = None
        for counter in self.counters:
            name = counter.name
            if name in SHARE_FAMILIES:
                shares = shares if shares is not None else self._share_families(scrape)
                yield self._filled(counter, shares[name])
                continue
            if name in POD_FAMILIES:
                if self.options.pods:
                    pods = pods if pods is not None else self._pod_families(scrape)
                    yield self._filled(counter, pods[name])
                continue
            if name in QUOTA_FAMILIES:
                if quotas is None:
                    unit_shares = newest.shares if newest is not None and scrape.usage is not None else ()
                    judged = store_findings(self.store, newest) if scrape.usage is not None else ()
                    quotas = quota_families(scrape.usage, unit_shares, scrape.devices, self._quota_fallback(), judged)
                yield self._filled(counter, quotas[name])
                continue
            if name in PROCESS_FAMILIES:
                if self.options.processes:
                    processes = processes if processes is not None else self._process_families(scrape)
                    yield self._filled(counter, processes[name])
                continue
            if name == IDLE_SECONDS_FAMILY:
                if scrape.idle_s is not None:
                    yield self._idle_family(counter, scrape, scrape.idle_s)
                continue
            yield self._gpu_family(counter, scrape)
        if self.options.accounting is not None and self.accountant is not None:
            node = {} if "Hostname" in self.options.drop_labels else {"Hostname": self.options.hostname}
            yield from accounting_families(self.accountant.running_totals(), self.options.accounting, node,
                                           openmetrics=self.openmetrics)
        if self.options.stale_after_s is not None:
            yield from self._timestamps(newest)

    def _quota_fallback(self) -> Labels:
        """The labels of a quota whose GPU is not known (a GPU-Manager grant): the node only."""
        return {"Hostname": self.options.hostname} if "Hostname" in self.label_names else {}

    def _timestamps(self, newest: Snapshot | None) -> Iterator[Metric]:
        """When the newest sweep and the newest process reading were taken (absent before the first), labelled
        with the node's ``Hostname`` like every other series, so a cluster's alert names the node."""
        if newest is None:
            return
        labels = {"Hostname": self.options.hostname}
        sweep = Metric(LAST_SAMPLE_FAMILY, "Unix time of the newest completed sweep of the sampler.", "gauge")
        sweep.add_sample(LAST_SAMPLE_FAMILY, labels, newest.time_s)
        yield sweep
        if newest.usage is not None:
            usage = Metric(LAST_PROCESS_SAMPLE_FAMILY, "Unix time of the newest reading of the GPU processes.",
                           "gauge")
            usage.add_sample(LAST_PROCESS_SAMPLE_FAMILY, labels, newest.usage.time_s)
            yield usage

    def _gpu_family(self, counter: Counter, scrape: _Scrape) -> Metric:
        name = counter.name
        family = self._family(counter)
        add = family.add_sample
        read = FIELDS[name]
        for view, variants in scrape.gpus:
            if view.sample.lost and name not in WHEN_LOST:
                continue  # a lost GPU has no readings: only its lost flag and its health
            value = read(view)
            if value is None:
                continue
            number = float(value)
            if name == XID_FAMILY:
                extra = xid_labels(view.last_xid)
                for labels in variants:
                    add(name, {**labels, **extra}, number)
            else:
                for labels in variants:
                    add(name, labels, number)
        mig_read = MIG_FIELDS.get(name)
        if mig_read is not None:
            for mig, variants in scrape.migs:
                mig_value = mig_read(mig)
                if mig_value is not None:
                    for labels in variants:
                        add(name, labels, float(mig_value))
        return family

    def _idle_family(self, counter: Counter, scrape: _Scrape, idle_s: dict[int, float]) -> Metric:
        """``nvdash_gpu_allocated_idle_seconds``: per GPU answering, how long the allocation of it idle longest has
        been idle, once idle for the accountant's ``idle_after_s``; 0 when none is."""
        family = self._family(counter)
        name = counter.name
        for view, variants in scrape.gpus:
            if view.sample.lost:
                continue  # a lost GPU has no readings: only its lost flag
            value = idle_s.get(view.info.index, 0.0)
            for labels in variants:
                family.add_sample(name, labels, value)
        return family

    def _filled(self, counter: Counter, samples: Metric) -> Metric:
        """A family named and typed by the counters file, holding ``samples``' samples."""
        family = self._family(counter)
        family.samples = samples.samples
        return family

    def _pod_families(self, scrape: _Scrape) -> dict[str, Metric]:
        """``nvdash_pod_gpu_allocated`` (the allocations, 1 each) and ``nvdash_pod_gpu_idle`` (1: no process of the
        pod runs on the device) per container and device; a container holding two replicas of one GPU counts 2."""
        allocated = Metric(ALLOCATED_FAMILY, "", "gauge")
        idle = Metric(IDLE_FAMILY, "", "gauge")
        usage = scrape.usage
        if usage is None:
            return {ALLOCATED_FAMILY: allocated, IDLE_FAMILY: idle}
        idle_devices = set(usage.idle_allocations())
        groups: dict[tuple[int, str, str, str, str, str], tuple[Labels, int, bool]] = {}
        for device in usage.pods.devices:
            base = scrape.devices.get(device.uuid)
            if base is None:
                continue  # not a device of this node's GPUs (or its GPU instance is gone)
            key = (id(base), device.namespace, device.pod, device.container, device.resource_name, device.sharing)
            labels, count, is_idle = groups.get(key) or (
                {**base, "namespace": device.namespace, "pod": device.pod, "container": device.container,
                 "resource": device.resource_name, "sharing": device.sharing}, 0, False)
            groups[key] = (labels, count + 1, is_idle or device in idle_devices)
        for labels, count, is_idle in groups.values():
            allocated.add_sample(ALLOCATED_FAMILY, labels, float(count))
            idle.add_sample(IDLE_FAMILY, labels, float(is_idle))
        return {ALLOCATED_FAMILY: allocated, IDLE_FAMILY: idle}

    def _process_families(self, scrape: _Scrape) -> dict[str, Metric]:
        """GPU memory (bytes) and SM utilization (0-1) of each process, where NVML reports them."""
        memory = Metric(MEMORY_FAMILY, "", "gauge")
        sm = Metric(SM_FAMILY, "", "gauge")
        usage = scrape.usage
        seen: set[tuple[int, int]] = set()
        for process in usage.processes if usage is not None else ():
            if process.gpu_uuid in scrape.lost:
                continue
            base = scrape.devices.get(process.mig_uuid or process.gpu_uuid) or scrape.devices.get(process.gpu_uuid)
            if base is None or (id(base), process.pid) in seen:
                continue
            seen.add((id(base), process.pid))
            labels = {**base, "pid": str(process.pid), "process_name": process_name(process)}
            if self.options.pods and process.pod_name is not None:
                labels.update(namespace=process.pod_namespace or "", pod=process.pod_name,
                              container=process.container_name or "")
            if process.gpu_memory_bytes is not None:
                memory.add_sample(MEMORY_FAMILY, labels, float(process.gpu_memory_bytes))
            if process.sm_pct is not None:
                sm.add_sample(SM_FAMILY, labels, process.sm_pct / 100.0)
        return {MEMORY_FAMILY: memory, SM_FAMILY: sm}

    def _share_families(self, scrape: _Scrape) -> dict[str, Metric]:
        """Per pod's container and device, its SM share (0-1), memory, power and energy; per device, what no owner
        explains. Owners that are not pods get no series (their work stays in the device's own series)."""
        families = {name: Metric(name, "", "gauge") for name in SHARE_FAMILIES}
        pod_values: dict[tuple[int, str, str, str, str], tuple[Labels, dict[str, float]]] = {}
        unattributed: dict[int, tuple[Labels, dict[str, float]]] = {}
        for unit in scrape.shares:
            base = scrape.devices.get(unit.unit)
            if base is None or unit.gpu_uuid in scrape.lost:
                continue
            for share in unit.owners:
                owner = share.owner
                if owner.kind != "pod":
                    continue
                namespace, pod, container = owner.namespace or "", owner.pod or "", owner.container or ""
                key = (id(base), namespace, pod, container, unit.sharing)
                labels, values = pod_values.setdefault(key, ({
                    **base, "namespace": namespace, "pod": pod, "container": container, "sharing": unit.sharing},
                    {}))
                readings = {POD_SM_FAMILY: _ratio(share.sm_pct),
                            POD_MEMORY_FAMILY: None if share.memory_bytes is None else float(share.memory_bytes),
                            POD_POWER_FAMILY: share.power_w, POD_ENERGY_FAMILY: share.energy_j}
                for name, value in readings.items():
                    if value is not None:  # two compute instances of one GPU instance: one series, added up
                        values[name] = values.get(name, 0.0) + value
            device = unattributed.setdefault(id(base), (base, {}))[1]
            for name, value in ((UNATTRIBUTED_SM_FAMILY, _ratio(unit.unattributed_sm_pct)),
                                (UNATTRIBUTED_POWER_FAMILY, unit.unattributed_power_w),
                                (UNATTRIBUTED_ENERGY_FAMILY, unit.unattributed_energy_j)):
                if value is not None:
                    device[name] = device.get(name, 0.0) + value
        for labels, values in (*pod_values.values(), *unattributed.values()):
            for name, value in values.items():
                families[name].add_sample(name, labels, value)
        return families
