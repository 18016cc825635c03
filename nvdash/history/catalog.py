"""What the history keeps: the raw columns (one per reading field) and the named metrics queried over them.

Raw columns mirror the records field by field (``GpuSample`` and ``HostSample``), with the records' names and
units, so a new reading field is kept without touching this module. A *metric* is what a query names: a raw
column, or a sum of two (``pcie_bytes_per_s``). Each metric is aggregated into the downsampled tiers by its kind.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nvdash.sampling.records import GpuSample, HostSample

GPU_SKIPPED_FIELDS = ("index", "nvlinks", "error")
"""Kept elsewhere (``nvlinks`` as a change log, ``error`` as a text column) or implied by the row."""
HOST_PREFIX = "host_"


class Kind(Enum):
    """How a metric is aggregated into a coarser bucket."""

    GAUGE = "gauge"
    """A level: min, mean and max over the bucket."""
    COUNTER = "counter"
    """A running total (energy, ECC counts): the bucket keeps its largest value, the newest of a counter."""
    BITS = "bits"
    """A flag or a bitmask: the bitwise OR over the bucket (set at any moment in it)."""


class Scope(Enum):
    """Whether a metric has one series per GPU or one for the host."""

    GPU = "gpu"
    HOST = "host"


@dataclass(frozen=True)
class Metric:
    """A named series: its scope, unit, aggregation and the SQL expression over the raw columns."""

    name: str
    scope: Scope
    unit: str
    kind: Kind
    expression: str
    description: str

    def tier_columns(self) -> tuple[str, ...]:
        """The columns this metric has in a downsampled tier, by its kind."""
        if self.kind is Kind.GAUGE:
            return (f"{self.name}_min", f"{self.name}_mean", f"{self.name}_max")
        if self.kind is Kind.COUNTER:
            return (f"{self.name}_max",)
        return (f"{self.name}_or",)


def _unit(name: str) -> str:
    for suffix, unit in (("_bytes_per_s", "B/s"), ("_bytes", "B"), ("_pct", "%"), ("_c", "°C"), ("_w", "W"),
                         ("_mhz", "MHz"), ("_mj", "mJ"), ("_ns", "ns")):
        if name.endswith(suffix):
            return unit
    return ""


_COUNTER_FIELDS = frozenset({
    "energy_mj", "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate", "remapped_rows_corrected", "remapped_rows_uncorrected", "retired_pages_sbe",
    "retired_pages_dbe", "pcie_replay_count",
    "violation_power_ns", "violation_thermal_ns", "violation_sync_boost_ns", "violation_board_limit_ns",
    "violation_low_utilization_ns", "violation_reliability_ns",
    "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors",
})
"""Running totals since the driver loaded (NVML's violation times, error counts, energy): a bucket keeps the
newest (largest) value; a rate or a share of time is a difference of two values, never their mean."""
_BITS_FIELDS = frozenset({
    "lost", "nvlink_partial", "clock_event_reasons", "remap_pending", "remap_failure", "retired_pages_pending",
})


def _kind(name: str) -> Kind:
    if name in _COUNTER_FIELDS:
        return Kind.COUNTER
    if name in _BITS_FIELDS:
        return Kind.BITS
    return Kind.GAUGE


def gpu_raw_columns() -> tuple[str, ...]:
    """One column per ``GpuSample`` reading field, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(GpuSample) if f.name not in GPU_SKIPPED_FIELDS)


def host_raw_columns() -> tuple[str, ...]:
    """One column per ``HostSample`` field."""
    return tuple(f.name for f in dataclasses.fields(HostSample))


def gpu_row(sample: GpuSample) -> tuple[Any, ...]:
    """A sample's values in ``gpu_raw_columns`` order; booleans as 0/1, unknown as ``None``."""
    return tuple(_plain(getattr(sample, name)) for name in gpu_raw_columns())


def host_row(sample: HostSample) -> tuple[Any, ...]:
    """A host sample's values in ``host_raw_columns`` order."""
    return tuple(_plain(getattr(sample, name)) for name in host_raw_columns())


def _plain(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


def _build() -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    for name in gpu_raw_columns():
        metrics[name] = Metric(name, Scope.GPU, _unit(name), _kind(name), name, name.replace("_", " "))
    metrics["pcie_bytes_per_s"] = Metric("pcie_bytes_per_s", Scope.GPU, "B/s", Kind.GAUGE,
                                         "(pcie_tx_bytes_per_s + pcie_rx_bytes_per_s)", "PCIe TX + RX")
    metrics["nvlink_bytes_per_s"] = Metric("nvlink_bytes_per_s", Scope.GPU, "B/s", Kind.GAUGE,
                                           "(nvlink_tx_bytes_per_s + nvlink_rx_bytes_per_s)", "NVLink TX + RX")
    for name in host_raw_columns():
        metrics[HOST_PREFIX + name] = Metric(HOST_PREFIX + name, Scope.HOST, _unit(name), Kind.GAUGE, name,
                                             "host " + name.replace("_", " "))
    return metrics


METRICS: dict[str, Metric] = _build()
"""Every metric a query may name, by name."""


def metrics_of(scope: Scope) -> tuple[Metric, ...]:
    """The metrics of one scope, in catalogue order."""
    return tuple(metric for metric in METRICS.values() if metric.scope is scope)
