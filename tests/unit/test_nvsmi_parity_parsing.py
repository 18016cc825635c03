"""The real-GPU comparison's reading of nvidia-smi, against recorded samples of nvidia-smi's documented formats.

The fixtures (tests/unit/fixtures/nvidia_smi/) follow nvidia-smi's layouts: ``-q -x`` per nvsmi_device_v12.dtd
(``<fb_memory_usage><used>70123 MiB</used>``, ``<gpu_power_readings><current_power_limit>``, ``<mig_devices>``),
``--query-gpu`` CSV with ``[N/A]``, ``nvlink -s`` (``Link 0: 26.562 GB/s``, ``<inactive>``) and ``nvlink -e``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nvdash.sampling.nvml_usage import DeviceUsage
from nvdash.sampling.records import GpuInfo, GpuSample, NvLinkSample
from nvdash.sampling.usage_records import GpuUsage, MigInstance
from tests.gpu import nvsmi
from tests.gpu.parity import CSV_FIELDS, Check, SmiOutput, build_checks, format_table

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
MIB = 2**20


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_help_lists_fields_and_their_aliases() -> None:
    fields = nvsmi.query_fields(_read("help_query_gpu.txt"))
    assert {"index", "name", "gpu_name", "utilization.encoder", "enforced.power.limit", "clocks.max.mem"} <= fields
    assert set(CSV_FIELDS) <= fields
    assert "List of valid properties" not in " ".join(fields)


def test_query_csv_reads_unknowns_as_none() -> None:
    rows = nvsmi.parse_query_csv(_read("query_gpu.csv"), list(CSV_FIELDS))
    assert [row["index"] for row in rows] == ["0", "1"]
    assert rows[0]["power.limit"] == "650.00"
    assert rows[1]["utilization.gpu"] is None
    assert nvsmi.number(rows[0]["clocks_event_reasons.active"]) == 4.0
    with pytest.raises(ValueError, match="2 values for 3 fields"):
        nvsmi.parse_query_csv("a, b\n", ["x", "y", "z"])


@pytest.mark.parametrize(
    ("cell", "value"),
    [("81559 MiB", 81559.0), ("650.00 W", 650.0), ("16x", 16.0), ("45 C", 45.0), ("5066215 us", 5066215.0),
     ("[N/A]", None), ("N/A", None), ("[Not Supported]", None), ("0x0000000000000004", 4.0), (None, None)],
)
def test_numbers_lose_their_units(cell: str | None, value: float | None) -> None:
    assert nvsmi.number(cell) == value


def test_xml_is_flattened_per_gpu_with_its_mig_devices() -> None:
    first, second = nvsmi.parse_smi_xml(_read("q_x_two_h100.xml"))
    assert first.bus_id == "00000000:18:00.0"
    assert first.get("product_name") == "NVIDIA H100 80GB HBM3"
    assert first.get("fb_memory_usage/used") == "70123 MiB"
    assert first.get("pci/pci_gpu_link_info/pcie_gen/max_link_gen") == "5"
    assert first.get("temperature/gpu_temp_tlimit") is None
    assert first.first("power_readings/enforced_power_limit", "gpu_power_readings/current_power_limit") == "650.00 W"
    assert first.get("clocks_event_reasons_counters/clocks_event_reasons_counters_sw_power_cap") == "5066215 us"
    assert first.mig_devices == []
    assert [(d["gpu_instance_id"], d["fb_memory_usage/used"]) for d in second.mig_devices] == [
        ("1", "18126 MiB"), ("5", "13 MiB")]


def test_nvlink_speeds_and_errors() -> None:
    speeds = nvsmi.parse_nvlink_speeds(_read("nvlink_s.txt"))
    assert speeds[0] == {0: 26.562e9, 1: 26.562e9, 2: 26.562e9, 3: None}
    assert len(speeds[1]) == 4
    errors = nvsmi.parse_nvlink_errors(_read("nvlink_e.txt"))
    assert errors[0][0] == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 3}
    assert errors[0][1]["Replay Errors"] == 2
    assert errors[1] == {0: {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}}


def _as_the_fixtures_say() -> tuple[list[GpuInfo], list[GpuSample], list[DeviceUsage]]:
    """What nvdash would read on the machine the fixtures describe (values written from the fixtures)."""
    base = GpuInfo(
        index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b",
        memory_total_bytes=81559 * MIB, pcie_generation=5, pcie_width=16, pcie_max_bytes_per_s=None,
        nvlink_links=3, nvlink_max_bytes_per_s=75e9, pci_bus_id="00000000:18:00.0",
        nvlink_link_bytes_per_s=25e9, nvlink_link_signalling_bytes_per_s=26.5625e9,
        temperature_slowdown_c=89, temperature_shutdown_c=92, temperature_gpu_max_c=87,
        temperature_memory_max_c=95, power_default_limit_w=700.0, power_min_limit_w=200.0,
        power_max_limit_w=700.0, clock_sm_max_mhz=1980, clock_memory_max_mhz=2619,
    )
    infos = [base, replace(base, index=1, uuid="GPU-9a0c44f1-2b3e-4d5f-8a6b-7c8d9e0f1a2b",
                           pci_bus_id="00000000:2A:00.0", nvlink_links=4, nvlink_max_bytes_per_s=100e9)]
    links = (NvLinkSample(0, True, 3, 0, 0, 0), NvLinkSample(1, True, 0, 0, 2, 0), NvLinkSample(2, True, 0, 0, 0, 1))
    first = GpuSample(
        index=0, utilization_pct=95.0, memory_used_bytes=70100 * MIB, memory_reserved_bytes=328 * MIB,
        temperature_c=46.0, memory_temperature_c=52.0, power_w=505.0, power_limit_w=650.0,
        power_management_limit_w=650.0, pcie_generation_current=5, pcie_width_current=16, clock_sm_mhz=1965.0,
        clock_event_reasons=4, encoder_utilization_pct=0.0, decoder_utilization_pct=10.0,
        violation_power_ns=5_066_000_000, nvlinks=links,
    )
    second = GpuSample(
        index=1, memory_used_bytes=18139 * MIB, memory_reserved_bytes=328 * MIB, temperature_c=38.0,
        memory_temperature_c=40.0, power_w=96.0, power_limit_w=700.0, pcie_generation_current=1,
        pcie_width_current=16, clock_sm_mhz=345.0, clock_event_reasons=1,
        nvlinks=tuple(NvLinkSample(link, True, 0, 0, 0, 0) for link in range(4)),
    )
    mig = GpuUsage(1, infos[1].uuid, mig_enabled=True, instances=(
        MigInstance(1, "MIG-a", 1, 0, "3g.40gb", memory_used_bytes=18100 * MIB, memory_total_bytes=40192 * MIB),
        MigInstance(1, "MIG-b", 5, 0, "2g.20gb", memory_used_bytes=13 * MIB, memory_total_bytes=20096 * MIB),
    ))
    usages = [DeviceUsage(GpuUsage(0, infos[0].uuid, mig_enabled=False)), DeviceUsage(mig)]
    return infos, [first, second], usages


def _checks(infos: list[GpuInfo], samples: list[GpuSample], usages: list[DeviceUsage]) -> list[Check]:
    return build_checks(infos, samples, usages, SmiOutput(
        nvsmi.parse_query_csv(_read("query_gpu.csv"), list(CSV_FIELDS)),
        nvsmi.parse_smi_xml(_read("q_x_two_h100.xml")),
        nvsmi.parse_nvlink_speeds(_read("nvlink_s.txt")),
        nvsmi.parse_nvlink_errors(_read("nvlink_e.txt")),
    ))


def test_readings_that_agree_make_a_table_without_failures() -> None:
    checks = _checks(*_as_the_fixtures_say())
    table = format_table(checks)
    assert not [check for check in checks if check.ok is False], table
    verdicts = {(check.gpu, check.reading): check.verdict for check in checks}
    assert verdicts["0", "enforced.power.limit"] == "ok"
    assert verdicts["0", "nvlink: link speed [GB/s]"] == "ok"
    assert verdicts["0", "nvlink: active links"] == "ok"
    assert verdicts["0", "nvlink: Replay Errors"] == "ok"
    assert verdicts["0", "sw_power_cap [us]"] == "shown"
    assert verdicts["1", "utilization.gpu"] == "n/a in nvidia-smi"
    assert verdicts["1 MIG 1.0", "fb_memory_usage/used"] == "ok"
    assert verdicts["1 MIG 5.0", "fb_memory_usage/total"] == "ok"
    assert verdicts["0", "temperature/gpu_temp_max_mem_threshold"] == "ok"
    assert verdicts["1", "nvlink: CRC Errors"] == "ok"
    assert len(table.splitlines()) == len(checks) + 2
    by_reading = {(check.gpu, check.reading): check for check in checks}
    assert by_reading["0", "memory.used"].difference == pytest.approx(-23.0)


def test_a_difference_beyond_its_tolerance_fails_and_a_missing_reading_too() -> None:
    infos, samples, usages = _as_the_fixtures_say()
    samples[0] = replace(samples[0], power_limit_w=700.0, memory_used_bytes=None)
    infos[1] = replace(infos[1], pcie_width=8)
    failed = {(check.gpu, check.reading): check for check in _checks(infos, samples, usages) if check.ok is False}
    assert set(failed) == {
        ("0", "enforced.power.limit"), ("0", "power: current (enforced) limit"), ("0", "memory.used"),
        ("1", "pcie.link.width.max"), ("1", "pci: max link width"),
    }
    assert failed["0", "enforced.power.limit"].difference == pytest.approx(50.0)
    assert failed["0", "memory.used"].verdict == "MISSING in nvdash"
    assert "MISMATCH" in format_table(list(failed.values()))


def test_a_reading_nvdash_does_not_have_yet_is_not_a_failure() -> None:
    infos, samples, usages = _as_the_fixtures_say()
    samples[0] = replace(samples[0], encoder_utilization_pct=None, power_management_limit_w=None)
    checks = {(check.gpu, check.reading): check for check in _checks(infos, samples, usages)}
    assert checks["0", "utilization.encoder"].ok is None
    assert checks["0", "utilization.encoder"].verdict == "not yet in nvdash"
    assert checks["0", "power.limit"].ok is None
