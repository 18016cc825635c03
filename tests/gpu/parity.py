"""nvdash's readings beside nvidia-smi's: one row per reading per GPU, with the difference and a verdict.

Tolerances: what cannot move while the two tools read (names, limits, maxima, thresholds, link generation and
width, NVLink speed and link count, memory total and reserved) must match to the precision nvidia-smi prints;
momentary readings may drift between the two reads (memory used 64 MiB, utilization 30 points, encoder/decoder
20 points, temperature 5 C, power 20 % + 15 W, SM clock 25 %). Counters that nvidia-smi and NVML may take from
different sources (nvidia-smi's clock event counters against NVML's violation times) are shown, not judged.
A reading nvidia-smi gives and nvdash lacks fails where nvdash is meant to have it (``required``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvdash.sampling.nvml_usage import DeviceUsage
from nvdash.sampling.records import GpuInfo, GpuSample, NvLinkSample
from tests.gpu.nvsmi import XmlGpu, number

MIB = 2**20
Value = float | str | None

CSV_FIELDS = (
    "index", "name", "uuid", "memory.total", "memory.reserved", "memory.used", "utilization.gpu",
    "utilization.encoder", "utilization.decoder", "temperature.gpu", "temperature.memory", "power.draw", "power.limit",
    "enforced.power.limit", "power.default_limit", "power.min_limit", "power.max_limit", "pcie.link.gen.current",
    "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max", "clocks.sm", "clocks.max.sm",
    "clocks.max.mem", "clocks_event_reasons.active",
)
"""What the comparison asks ``--query-gpu`` for (those this nvidia-smi knows; see ``nvsmi.query_fields``)."""

NVLINK_ERROR_NAMES = {
    "Replay Errors": "replay_errors",
    "Recovery Errors": "recovery_errors",
    "CRC Errors": "crc_flit_errors",
    "CRC Flit Errors": "crc_flit_errors",
    "CRC Data Errors": "crc_data_errors",
    "Data CRC Errors": "crc_data_errors",
}
"""``nvidia-smi nvlink -e`` counter names -> ``NvLinkSample`` fields."""

EVENT_COUNTERS = {
    "clocks_event_reasons_counters_sw_power_cap": "violation_power_ns",
    "clocks_event_reasons_counters_sync_boost": "violation_sync_boost_ns",
    "clocks_event_reasons_counters_sw_thermal_slowdown": "violation_thermal_ns",
}
"""nvidia-smi -q "Clocks Event Reasons Counters" (µs) -> the NVML violation time nvdash keeps (ns): shown side by
side, not judged (nvidia-smi does not document that they are the same counters)."""


@dataclass(frozen=True)
class Check:
    """One reading of one GPU as both tools give it; ``tolerance`` ``None`` means shown, not judged."""

    gpu: str
    reading: str
    nvdash: Value
    smi: Value
    tolerance: float | None = 0.0
    required: bool = True

    @property
    def difference(self) -> float | None:
        """nvdash minus nvidia-smi, where both are numbers."""
        if isinstance(self.nvdash, (int, float)) and isinstance(self.smi, (int, float)):
            return float(self.nvdash) - float(self.smi)
        return None

    @property
    def ok(self) -> bool | None:
        """True or False where judged; ``None`` where shown only or nvidia-smi has no value."""
        if self.smi is None or self.tolerance is None:
            return None
        if self.nvdash is None:
            return False if self.required else None
        if isinstance(self.smi, str) or isinstance(self.nvdash, str):
            return str(self.nvdash) == str(self.smi)
        difference = self.difference
        return difference is not None and abs(difference) <= self.tolerance + 1e-9

    @property
    def verdict(self) -> str:
        """How the row reads in the table."""
        if self.ok is True:
            return "ok"
        if self.ok is False:
            return "MISSING in nvdash" if self.nvdash is None else "MISMATCH"
        if self.smi is None:
            return "n/a in nvidia-smi"
        return "shown" if self.tolerance is None else "not yet in nvdash"


def _scaled(value: float | int | None, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _show(value: Value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def format_table(checks: Sequence[Check]) -> str:
    """The checks as one aligned text table."""
    header = ("GPU", "reading", "nvdash", "nvidia-smi", "difference", "tolerance", "verdict")
    rows = [
        (
            check.gpu,
            check.reading,
            _show(check.nvdash),
            _show(check.smi),
            _show(check.difference),
            "shown" if check.tolerance is None else _show(check.tolerance),
            check.verdict,
        )
        for check in checks
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in (header, *rows)]
    return "\n".join([lines[0], "  ".join("-" * width for width in widths), *lines[1:]])


def _csv_checks(gpu: str, info: GpuInfo, sample: GpuSample, row: dict[str, str | None]) -> list[Check]:
    checks: list[Check] = []

    def add(field: str, nvdash: Value, tolerance: float | None = 0.0, required: bool = True) -> None:
        if field in row:
            smi: Value = row[field] if isinstance(nvdash, str) else number(row[field])
            checks.append(Check(gpu, field, nvdash, smi, tolerance, required))

    add("name", info.name)
    add("uuid", info.uuid)
    add("memory.total", _scaled(info.memory_total_bytes, 1 / MIB), 1.0)
    add("memory.reserved", _scaled(sample.memory_reserved_bytes, 1 / MIB), 1.0)
    add("memory.used", _scaled(sample.memory_used_bytes, 1 / MIB), 64.0)
    add("utilization.gpu", sample.utilization_pct, 30.0)
    add("utilization.encoder", sample.encoder_utilization_pct, 20.0, required=False)
    add("utilization.decoder", sample.decoder_utilization_pct, 20.0, required=False)
    add("temperature.gpu", sample.temperature_c, 5.0)
    add("temperature.memory", sample.memory_temperature_c, 5.0)
    power = number(row.get("power.draw"))
    add("power.draw", sample.power_w, None if power is None else 0.2 * power + 15)
    add("power.limit", sample.power_management_limit_w, 0.01, required=False)
    add("enforced.power.limit", sample.power_limit_w, 0.01)
    add("power.default_limit", info.power_default_limit_w, 0.01)
    add("power.min_limit", info.power_min_limit_w, 0.01)
    add("power.max_limit", info.power_max_limit_w, 0.01)
    add("pcie.link.gen.current", sample.pcie_generation_current)
    add("pcie.link.gen.max", info.pcie_generation)
    add("pcie.link.width.current", sample.pcie_width_current)
    add("pcie.link.width.max", info.pcie_width)
    sm = number(row.get("clocks.sm"))
    add("clocks.sm", sample.clock_sm_mhz, None if sm is None else 0.25 * max(sm, 300.0))
    add("clocks.max.sm", info.clock_sm_max_mhz)
    add("clocks.max.mem", info.clock_memory_max_mhz)
    add("clocks_event_reasons.active", sample.clock_event_reasons, None)
    return checks


def _xml_checks(gpu: str, info: GpuInfo, sample: GpuSample, xml: XmlGpu) -> list[Check]:
    thresholds = (
        ("temperature/gpu_temp_max_threshold", info.temperature_shutdown_c),
        ("temperature/gpu_temp_slow_threshold", info.temperature_slowdown_c),
        ("temperature/gpu_temp_max_gpu_threshold", info.temperature_gpu_max_c),
        ("temperature/gpu_temp_max_mem_threshold", info.temperature_memory_max_c),
    )
    checks = [Check(gpu, path, value, number(xml.get(path))) for path, value in thresholds]
    checks.append(Check(
        gpu, "power: current (enforced) limit", sample.power_limit_w,
        number(xml.first("gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit")), 0.01,
    ))
    checks.append(Check(
        gpu, "power: requested (management) limit", sample.power_management_limit_w,
        number(xml.first("gpu_power_readings/requested_power_limit", "power_readings/power_limit")), 0.01,
        required=False,
    ))
    checks.append(Check(
        gpu, "pci: max link width", info.pcie_width,
        number(xml.get("pci/pci_gpu_link_info/link_widths/max_link_width")),
    ))
    for tag, attribute in EVENT_COUNTERS.items():
        counted = xml.get(f"clocks_event_reasons_counters/{tag}")
        if counted is not None:
            nvdash_us = _scaled(getattr(sample, attribute), 1e-3)
            checks.append(Check(gpu, f"{tag.removeprefix('clocks_event_reasons_counters_')} [us]", nvdash_us,
                                number(counted), None, required=False))
    return checks


def _mig_checks(gpu: str, usage: DeviceUsage | None, xml: XmlGpu) -> list[Check]:
    instances = {} if usage is None else {
        (instance.gpu_instance_id, instance.compute_instance_id): instance for instance in usage.gpu.instances
    }
    checks: list[Check] = []
    for device in xml.mig_devices:
        gi, ci = number(device.get("gpu_instance_id")), number(device.get("compute_instance_id"))
        if gi is None or ci is None:
            continue
        instance = instances.get((int(gi), int(ci)))
        where = f"{gpu} MIG {int(gi)}.{int(ci)}"
        used = None if instance is None else _scaled(instance.memory_used_bytes, 1 / MIB)
        total = None if instance is None else _scaled(instance.memory_total_bytes, 1 / MIB)
        checks.append(Check(where, "fb_memory_usage/used", used, number(device.get("fb_memory_usage/used")), 64.0))
        checks.append(Check(where, "fb_memory_usage/total", total, number(device.get("fb_memory_usage/total")), 1.0))
    return checks


def _nvlink_checks(
    gpu: str, info: GpuInfo, sample: GpuSample, speeds: dict[int, float | None] | None,
    errors: dict[int, dict[str, int]] | None,
) -> list[Check]:
    checks: list[Check] = []
    if speeds:
        up = [speed for speed in speeds.values() if speed is not None]
        checks.append(Check(gpu, "nvlink: active links", info.nvlink_links, len(up)))
        if up:
            signalling = _scaled(info.nvlink_link_signalling_bytes_per_s, 1e-9)
            checks.append(Check(gpu, "nvlink: link speed [GB/s]", signalling, up[0] / 1e9, 0.001, required=False))
    if errors:
        links: dict[int, NvLinkSample] = {link.link: link for link in sample.nvlinks or ()}
        totals: dict[str, int] = {}
        for counters in errors.values():
            for name, count in counters.items():
                totals[name] = totals.get(name, 0) + count
        for name, total in totals.items():
            attribute = NVLINK_ERROR_NAMES.get(name)
            if attribute is None:
                continue
            known = [value for link in links.values() if (value := getattr(link, attribute)) is not None]
            checks.append(Check(gpu, f"nvlink: {name}", float(sum(known)) if known else None, float(total)))
    return checks


@dataclass(frozen=True)
class SmiOutput:
    """What nvidia-smi said, parsed (see :mod:`tests.gpu.nvsmi`)."""

    rows: Sequence[dict[str, str | None]]
    xml_gpus: Sequence[XmlGpu]
    speeds: dict[int, dict[int, float | None]]
    errors: dict[int, dict[int, dict[str, int]]]


def build_checks(
    infos: Sequence[GpuInfo], samples: Sequence[GpuSample], usages: Sequence[DeviceUsage], smi: SmiOutput
) -> list[Check]:
    """Every comparison for every GPU; nvidia-smi's rows are matched by index, its XML by PCI bus id."""
    by_index = {int(number(row.get("index")) or 0): row for row in smi.rows if row.get("index") is not None}
    by_bus = {gpu.bus_id.upper(): gpu for gpu in smi.xml_gpus}
    usage_of: Callable[[int], DeviceUsage | None] = lambda index: next(  # noqa: E731 - a one-line lookup
        (usage for usage in usages if usage.gpu.index == index), None
    )
    checks: list[Check] = []
    for info, sample in zip(infos, samples, strict=True):
        gpu = str(info.index)
        row = by_index.get(info.index)
        if row is not None:
            checks += _csv_checks(gpu, info, sample, row)
        xml = by_bus.get(info.pci_bus_id.upper())
        if xml is not None:
            checks += _xml_checks(gpu, info, sample, xml)
            checks += _mig_checks(gpu, usage_of(info.index), xml)
        checks += _nvlink_checks(gpu, info, sample, smi.speeds.get(info.index), smi.errors.get(info.index))
    return checks
