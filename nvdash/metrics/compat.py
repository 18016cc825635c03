"""The naming ``/metrics`` follows: dcgm-exporter up to 4.8 (the default), or 4.9's (``--metrics-compat 4.9``).

dcgm-exporter 4.9.0 (tested with DCGM 4.7) renamed the fields of its default and profiling presets that DCGM 4.7
deprecates to their new DCGM names, and eleven of them changed unit: clocks MHz -> Hz, energy mJ -> J,
utilization % -> a 0-1 ratio, framebuffer MiB -> bytes, NVLink throughput DCGM's 1000 KiB/s -> bytes per second.
It also renamed two labels: ``Hostname`` -> ``hostname`` (already in 4.8.3) and the driver-version label
``DCGM_FI_DRIVER_VERSION`` -> ``DCGM_FI_SYSTEM_DRIVER_VERSION``. Families outside those presets keep their names.

The families are built once under 4.8's names and units; :meth:`Naming.families` renames them on the way out, so
the counters file, the alert rules' names and every reader keep one vocabulary inside nvdash.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from nvdash.metrics.fields import MIB, NVLINK_BANDWIDTH_UNIT_BYTES_PER_S

COMPAT_VERSIONS = ("4.8", "4.9")
DEFAULT_COMPAT = "4.8"
MHZ = 1_000_000.0
"""Hertz in a megahertz."""


@dataclass(frozen=True)
class Rename:
    """One family's new name; its value times ``factor`` over ``divisor`` is in the new unit, and ``unit`` rewrites
    its help text."""

    name: str
    factor: float = 1.0
    divisor: float = 1.0
    unit: tuple[str, str] | None = None
    """(old, new) unit text in the help, e.g. ``("(in MHz)", "(in Hz)")``; ``None``: unchanged."""


PERCENT_TO_RATIO = ("(in %)", "(ratio, 0 to 1)")
MIB_TO_BYTES = ("(in MiB)", "(in bytes)")

RENAMES_4_9: Mapping[str, Rename] = {
    # Unit changes (11, as 4.9's release notes count them).
    "DCGM_FI_DEV_SM_CLOCK": Rename("DCGM_FI_DEV_SM_CLOCK_HERTZ", MHZ, 1.0, ("(in MHz)", "(in Hz)")),
    "DCGM_FI_DEV_MEM_CLOCK": Rename("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", MHZ, 1.0, ("(in MHz)", "(in Hz)")),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Rename("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0, 1000.0,
                                                   ("(in mJ)", "(in J)")),
    "DCGM_FI_DEV_GPU_UTIL": Rename("DCGM_FI_DEV_GPU_UTIL_RATIO", 1.0, 100.0, PERCENT_TO_RATIO),
    "DCGM_FI_DEV_MEM_COPY_UTIL": Rename("DCGM_FI_DEV_MEMORY_UTIL_RATIO", 1.0, 100.0, PERCENT_TO_RATIO),
    "DCGM_FI_DEV_ENC_UTIL": Rename("DCGM_FI_DEV_ENC_UTIL_RATIO", 1.0, 100.0, PERCENT_TO_RATIO),
    "DCGM_FI_DEV_DEC_UTIL": Rename("DCGM_FI_DEV_DEC_UTIL_RATIO", 1.0, 100.0, PERCENT_TO_RATIO),
    "DCGM_FI_DEV_FB_FREE": Rename("DCGM_FI_DEV_FB_FREE_BYTES", MIB, 1.0, MIB_TO_BYTES),
    "DCGM_FI_DEV_FB_USED": Rename("DCGM_FI_DEV_FB_USED_BYTES", MIB, 1.0, MIB_TO_BYTES),
    "DCGM_FI_DEV_FB_RESERVED": Rename("DCGM_FI_DEV_FB_RESERVED_BYTES", MIB, 1.0, MIB_TO_BYTES),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": Rename("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
                                                 NVLINK_BANDWIDTH_UNIT_BYTES_PER_S),
    # 4.9 collects the total framebuffer in bytes by default under this name.
    "DCGM_FI_DEV_FB_TOTAL": Rename("DCGM_FI_DEV_FB_CAPACITY_BYTES", MIB, 1.0, MIB_TO_BYTES),
    # Same unit, DCGM's new name (dcgm_fields.h, "renamed per DCGM Field Naming Standard").
    "DCGM_FI_DEV_GPU_TEMP": Rename("DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
    "DCGM_FI_DEV_MEMORY_TEMP": Rename("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS"),
    "DCGM_FI_DEV_POWER_USAGE": Rename("DCGM_FI_DEV_BOARD_POWER_WATTS"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": Rename("DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
    "DCGM_FI_DEV_XID_ERRORS": Rename("DCGM_FI_DEV_XID_ERROR"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": Rename("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": Rename("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": Rename("DCGM_FI_DEV_ROW_REMAP_FAILED"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Rename("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Rename("DCGM_FI_PROF_TENSOR_UTIL_RATIO"),
    "DCGM_FI_PROF_DRAM_ACTIVE": Rename("DCGM_FI_PROF_DRAM_UTIL_RATIO"),
}
"""dcgm-exporter 4.8 family name -> its 4.9 name and unit, for the families nvdash exports."""

LABEL_RENAMES_4_9: Mapping[str, str] = {
    "Hostname": "hostname",
    "DCGM_FI_DRIVER_VERSION": "DCGM_FI_SYSTEM_DRIVER_VERSION",
}
"""dcgm-exporter 4.8 label -> its 4.9 name."""


@dataclass(frozen=True)
class Naming:
    """A dcgm-exporter version's names: families and labels renamed, values scaled to the new units."""

    version: str = DEFAULT_COMPAT
    renames: Mapping[str, Rename] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def families(self, families: Iterable[Metric]) -> Iterator[Metric]:
        """``families`` under this naming. A label set shared by several families stays one shared dict."""
        if not self.renames and not self.labels:
            yield from families
            return
        relabelled: dict[int, tuple[Mapping[str, str], dict[str, str]]] = {}
        for family in families:
            rename = self.renames.get(family.name)
            if rename is None:
                rename = Rename(family.name)
            help_text = family.documentation
            if rename.unit is not None:
                help_text = help_text.replace(*rename.unit)
            renamed = Metric(rename.name, help_text, family.type)
            for sample in family.samples:
                known = relabelled.get(id(sample.labels))
                if known is None or known[0] is not sample.labels:
                    labels = {self.labels.get(name, name): value for name, value in sample.labels.items()}
                    known = relabelled[id(sample.labels)] = (sample.labels, labels)
                name = rename.name if sample.name == family.name else sample.name
                renamed.add_sample(name, known[1], sample.value * rename.factor / rename.divisor)
            yield renamed


NAMINGS = {
    "4.8": Naming("4.8"),
    "4.9": Naming("4.9", RENAMES_4_9, LABEL_RENAMES_4_9),
}
"""``--metrics-compat``'s choices."""


def naming(version: str) -> Naming:
    """The naming of a ``--metrics-compat`` version; raises ``ValueError`` naming the choices."""
    try:
        return NAMINGS[version]
    except KeyError:
        raise ValueError(f"unknown dcgm-exporter naming {version!r}; choose from {', '.join(COMPAT_VERSIONS)}") \
            from None
