"""``/metrics``'s parts: the counters file, the collector over a store, and both exposition formats."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.metrics.collector import ExportOptions, StoreCollector, last_xids, unknown_fields
from nvdash.metrics.counters import CountersError, default_counters, parse_counters
from nvdash.metrics.exposition import format_value, text_format
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, Snapshot
from nvdash.store import Store
from tests.unit.test_apps_health import INVENTORY

MiB = 1024 * 1024
GiB = 1024 * MiB
COUNTERS = """
# a dcgm-exporter counters file
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_FB_USED,       gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_FREE,       gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_XID_ERRORS,    gauge, Value of the last XID error encountered.
DCGM_FI_PROF_SM_ACTIVE,    gauge, Ratio of cycles an SM has at least 1 warp assigned.
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status
nvdash_pcie_transmit_bytes_per_second, gauge, PCIe transmit rate (bytes per second).
"""


def store_with_readings() -> Store:
    store = Store(INVENTORY, capacity=10)
    gpus = (
        GpuSample(0, utilization_pct=87.0, memory_used_bytes=30 * GiB, memory_total_bytes=80 * GiB,
                  memory_reserved_bytes=512 * MiB, energy_mj=123_456_789, gpm_sm_active_pct=42.0,
                  pcie_tx_bytes_per_s=1.5e9),
        GpuSample(1, utilization_pct=3.0, memory_used_bytes=GiB, memory_total_bytes=40 * GiB),
        GpuSample(2, lost=True),
    )
    store.append(Snapshot(1000.0, gpus, HostSample()))
    store.add_events([GpuEvent(990.0, 0, "xid", "Xid 13", "warning", 13),
                      GpuEvent(995.0, 0, "xid", "Xid 31", "warning", 31),
                      GpuEvent(996.0, 1, "ecc", "ECC", "warning")])
    return store


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {family.name: [(sample.labels, sample.value) for sample in family.samples] for family in parse_text(text)}


def test_quoted_help_labels_and_untyped_rows_are_read() -> None:
    counters = parse_counters('DCGM_FI_DEV_GPU_UTIL, untyped, "GPU utilization, in %"\n'
                              "DCGM_FI_DRIVER_VERSION, label, Driver Version\n")
    assert [(c.name, c.kind, c.help) for c in counters] == [
        ("DCGM_FI_DEV_GPU_UTIL", "untyped", "GPU utilization, in %"),
        ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version")]
    assert unknown_fields(counters) == []
    assert unknown_fields(parse_counters("DCGM_FI_DEV_SERIAL, label, Serial")) == ["DCGM_FI_DEV_SERIAL"]


def test_counters_file_in_dcgm_exporters_format() -> None:
    counters = parse_counters(COUNTERS)
    assert [(c.name, c.kind) for c in counters][:4] == [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"), ("DCGM_FI_DEV_FB_USED", "gauge"), ("DCGM_FI_DEV_FB_FREE", "gauge"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter")]
    assert counters[0].help == "GPU utilization (in %)."
    assert unknown_fields(counters) == ["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]
    assert unknown_fields(default_counters()) == []


@pytest.mark.parametrize(("text", "message"), [
    ("DCGM_FI_DEV_GPU_UTIL gauge", "counters file:1: expected 3 fields 'NAME, type, help', got 1"),
    ("DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization, in %", "counters file:1: expected 3 fields"),
    ("\n# c\nDCGM_FI_DEV_GPU_UTIL, histogram, x", "counters file:3: type 'histogram' of DCGM_FI_DEV_GPU_UTIL"),
])
def test_bad_counters_lines_are_named(text: str, message: str) -> None:
    with pytest.raises(CountersError) as info:
        parse_counters(text)
    assert message in str(info.value)


def test_the_collector_exports_dcgm_names_units_and_labels() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store_with_readings(), parse_counters(COUNTERS), ExportOptions(hostname="n1")))
    text = text_format(registry.collect()).decode()
    found = families(text)
    labels = {"gpu": "0", "UUID": "GPU-0", "pci_bus_id": "00000000:18:00.0", "device": "nvidia0",
              "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1"}
    assert found["DCGM_FI_DEV_GPU_UTIL"][0] == (labels, 87.0)
    assert [value for _, value in found["DCGM_FI_DEV_GPU_UTIL"]] == [87.0, 3.0]  # the lost GPU has no reading
    assert found["DCGM_FI_DEV_FB_USED"][0][1] == 30 * 1024  # MiB
    assert found["DCGM_FI_DEV_FB_FREE"][0][1] == 80 * 1024 - 30 * 1024 - 512  # total - used - reserved, MiB
    assert found["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0][1] == 123_456_789  # mJ
    assert [value for _, value in found["DCGM_FI_DEV_XID_ERRORS"]] == [31.0, 0.0]  # the newest XID; 0 for none
    xid_labels = [(labels["err_code"], labels["err_msg"]) for labels, _ in found["DCGM_FI_DEV_XID_ERRORS"]]
    assert xid_labels[1] == ("0", "No Error")
    assert xid_labels[0][0] == "31"
    assert xid_labels[0][1] == "GPU memory page fault"  # dcgm-exporter's text for XID 31
    assert found["DCGM_FI_PROF_SM_ACTIVE"] == [(labels, 0.42)]  # a ratio, 0 to 1
    assert found["nvdash_pcie_transmit_bytes_per_second"] == [(labels, 1.5e9)]
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in found
    # A counter's TYPE line names the family itself, as dcgm-exporter writes it.
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "_total{" not in text


def test_openmetrics_parses_and_declares_dcgm_counters_unknown() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store_with_readings(), parse_counters(COUNTERS), ExportOptions(hostname="n1"),
                                     openmetrics=True))
    text = openmetrics_latest(registry).decode()
    assert text.endswith("# EOF\n")
    parsed = {family.name: family for family in parse_openmetrics(text)}
    assert parsed["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "unknown"
    assert parsed["DCGM_FI_DEV_GPU_UTIL"].samples[0].value == 87.0
    assert generate_latest(registry)  # prometheus_client's own writer accepts the families too


def test_the_driver_version_label_row_labels_every_series() -> None:
    registry = CollectorRegistry(auto_describe=False)
    counters = parse_counters("DCGM_FI_DRIVER_VERSION, label, Driver Version\n" + COUNTERS)
    registry.register(StoreCollector(store_with_readings(), counters, ExportOptions(hostname="n1")))
    found = families(text_format(registry.collect()).decode())
    assert "DCGM_FI_DRIVER_VERSION" not in found  # a label, not a family
    assert {labels["DCGM_FI_DRIVER_VERSION"] for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"]} == {"550.54"}


def test_dropped_labels_are_left_off() -> None:
    registry = CollectorRegistry(auto_describe=False)
    options = ExportOptions(hostname="n1", drop_labels=frozenset({"modelName", "pci_bus_id", "Hostname"}))
    registry.register(StoreCollector(store_with_readings(), parse_counters(COUNTERS), options))
    found = families(text_format(registry.collect()).decode())
    assert found["DCGM_FI_DEV_GPU_UTIL"][0][0] == {"gpu": "0", "UUID": "GPU-0", "device": "nvidia0"}


def test_last_xids_are_the_newest_per_gpu() -> None:
    events = [GpuEvent(5.0, 0, "xid", "", code=79), GpuEvent(1.0, 0, "xid", "", code=13),
              GpuEvent(2.0, 1, "xid", "", code=48), GpuEvent(3.0, None, "xid", "", code=62)]
    assert last_xids(events) == {0: 79, 1: 48}


def test_label_values_are_escaped() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store_with_readings(), parse_counters(COUNTERS),
                                     ExportOptions(hostname='a "quoted"\\node')))
    found = families(text_format(registry.collect()).decode())
    assert found["DCGM_FI_DEV_GPU_UTIL"][0][0]["Hostname"] == 'a "quoted"\\node'


def test_values_are_written_as_prometheus_reads_them() -> None:
    assert [format_value(v) for v in (87.0, 0.42, 7.25e9, float("nan"), float("inf"), -float("inf"))] == [
        "87.0", "0.42", "7250000000.0", "NaN", "+Inf", "-Inf"]
    assert float(format_value(123456789.123)) == 123456789.123
