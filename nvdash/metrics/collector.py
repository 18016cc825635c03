"""The ``prometheus_client`` collector behind ``/metrics``: the store's newest snapshot in dcgm-exporter's names.

A scrape reads only the store (the sampler's newest snapshot and the event log); it never calls NVML, so any
number of scrapers cost the sampler nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from nvdash.health.xid import xid_info
from nvdash.metrics.counters import Counter
from nvdash.metrics.fields import FIELDS, GpuView
from nvdash.sampling.records import GpuEvent, GpuInfo, Snapshot
from nvdash.store import Store

LOST_FAMILY = "nvdash_gpu_lost"
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
"""dcgm-exporter's labels on every per-GPU series."""


LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)
"""The ``label`` rows nvdash can fill: the field becomes a label of every series."""
XID_FAMILY = "DCGM_FI_DEV_XID_ERRORS"
NO_ERROR = "No Error"


def unknown_fields(counters: Sequence[Counter]) -> list[str]:
    """The names of a counters file that nvdash cannot export."""
    return [counter.name for counter in counters
            if (counter.name not in LABEL_FIELDS if counter.kind == "label" else counter.name not in FIELDS)]


def xid_labels(code: int) -> dict[str, str]:
    """``err_code`` and ``err_msg`` of the XID family's sample, as dcgm-exporter adds them (0: no error)."""
    return {"err_code": str(code), "err_msg": NO_ERROR if code == 0 else xid_info(code).meaning}


def last_xids(events: Sequence[GpuEvent]) -> dict[int, int]:
    """Each GPU's newest XID code."""
    codes: dict[int, int] = {}
    for event in sorted(events, key=lambda event: event.time_s):
        if event.kind == "xid" and event.gpu_index is not None and event.code is not None:
            codes[event.gpu_index] = event.code
    return codes


@dataclass(frozen=True)
class ExportOptions:
    """What ``/metrics`` exports and how its series are labelled."""

    hostname: str
    drop_labels: frozenset[str] = frozenset()
    """Labels left off every series (``--metrics-labels``)."""


class StoreCollector:
    """Yields the counters file's families for every GPU of the store's newest snapshot."""

    def __init__(self, store: Store, counters: Sequence[Counter], options: ExportOptions,
                 openmetrics: bool = False) -> None:
        self.store = store
        self.counters = [counter for counter in counters if counter.kind != "label" and counter.name in FIELDS]
        self.options = options
        self.openmetrics = openmetrics
        self.label_names = [name for name in GPU_LABELS if name not in options.drop_labels]
        self.extra_labels = self._extra_labels([c.name for c in counters if c.kind == "label"])

    def _extra_labels(self, names: Sequence[str]) -> dict[str, str]:
        """The ``label`` rows' labels and values (a value nvdash does not know leaves its label off)."""
        driver = self.store.inventory.driver_version
        values = {"DCGM_FI_DRIVER_VERSION": driver}
        return {name: value for name in names if (value := values.get(name)) and name not in self.options.drop_labels}

    def _labels(self, info: GpuInfo) -> list[str]:
        values = {
            "gpu": str(info.index), "UUID": info.uuid, "pci_bus_id": info.pci_bus_id, "device": f"nvidia{info.index}",
            "modelName": info.name, "Hostname": self.options.hostname,
        }
        return [values[name] for name in self.label_names]

    def _family(self, counter: Counter) -> Metric:
        kind = counter.kind
        if kind == "counter" and self.openmetrics:
            # OpenMetrics wants counters' samples named *_total; dcgm-exporter's names have none, and renaming them
            # would break the dashboards and rules written for them: declare them untyped there.
            kind = "unknown"
        return Metric(counter.name, counter.help, kind)

    def collect(self) -> Iterator[Metric]:
        """One family per exported field, one sample per GPU that reads it."""
        snapshot: Snapshot | None = self.store.latest()
        infos = {info.index: info for info in self.store.inventory.gpus}
        xids = last_xids(self.store.events())
        views = []
        if snapshot is not None:
            for sample in snapshot.gpus:
                info = infos.get(sample.index)
                if info is not None:
                    views.append((GpuView(info, sample, xids.get(sample.index, 0)), self._labels(info)))
        for counter in self.counters:
            family = self._family(counter)
            read = FIELDS[counter.name]
            for view, labels in views:
                if view.sample.lost and counter.name != LOST_FAMILY:
                    continue  # a lost GPU has no readings: only its lost flag
                value = read(view)
                if value is not None:
                    sample_labels = dict(zip(self.label_names, labels, strict=True))
                    sample_labels.update(self.extra_labels)
                    if counter.name == XID_FAMILY:
                        sample_labels.update(xid_labels(view.last_xid))
                    family.add_sample(counter.name, sample_labels, float(value))
            yield family
