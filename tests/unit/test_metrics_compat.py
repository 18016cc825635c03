"""``--metrics-compat``: dcgm-exporter 4.8's names by default, 4.9's on request (renamed families in DCGM 4.7's
units, the ``hostname`` and ``DCGM_FI_SYSTEM_DRIVER_VERSION`` labels).

Expected names and conversions are dcgm-exporter 4.9.0's release notes and DCGM's field names: clocks MHz -> Hz,
energy mJ -> J, utilization % -> ratio, framebuffer MiB -> bytes, NVLink 1000 KiB/s -> bytes per second.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.metrics.collector import ExportOptions, StoreCollector
from nvdash.metrics.compat import NAMINGS, RENAMES_4_9, naming
from nvdash.metrics.counters import default_counters
from nvdash.metrics.exposition import text_format
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, Snapshot
from nvdash.server.options import UsageError, parse_settings
from nvdash.store import Store
from tests.unit.test_apps_health import INVENTORY

MiB = 1024 * 1024
GiB = 1024 * MiB
Found = dict[str, list[tuple[dict[str, str], float]]]


def store() -> Store:
    store = Store(INVENTORY, capacity=4)
    gpu = GpuSample(0, utilization_pct=87.0, memory_utilization_pct=41.0, encoder_utilization_pct=12.0,
                    decoder_utilization_pct=3.0, memory_used_bytes=30 * GiB, memory_total_bytes=80 * GiB,
                    memory_reserved_bytes=512 * MiB, clock_sm_mhz=1410.0, clock_memory_mhz=2619.0,
                    energy_mj=123_456_789, temperature_c=61.0, power_w=412.5, pcie_replay_count=3,
                    nvlink_tx_bytes_per_s=1.2e11, nvlink_rx_bytes_per_s=1.1e11, gpm_graphics_active_pct=93.0,
                    violation_power_ns=2_500_000_000)
    store.append(Snapshot(1000.0, (gpu,), HostSample()))
    store.add_events([GpuEvent(990.0, 0, "xid", "Xid 48", "critical", 48)])
    return store


def scrape_text(options: ExportOptions, openmetrics: bool = False) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store(), default_counters(), options, openmetrics=openmetrics))
    if openmetrics:
        return openmetrics_latest(registry).decode()
    return text_format(registry.collect()).decode()


def families(text: str) -> Found:
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in parse_text(text)}


def value(found: Found, name: str) -> float:
    ((_, number),) = found[name]
    return number


def test_the_default_naming_is_dcgm_exporter_4_8s_and_unchanged() -> None:
    plain = scrape_text(ExportOptions(hostname="n1"))
    assert scrape_text(ExportOptions(hostname="n1", naming=naming("4.8"))) == plain
    found = families(plain)
    assert value(found, "DCGM_FI_DEV_SM_CLOCK") == 1410.0
    labels = found["DCGM_FI_DEV_GPU_UTIL"][0][0]
    assert labels["Hostname"] == "n1"
    assert labels["DCGM_FI_DRIVER_VERSION"] == "550.54"
    assert "hostname" not in labels
    assert not set(found) & {rename.name for rename in RENAMES_4_9.values()}


def test_4_9_naming_renames_the_families_and_converts_their_units() -> None:
    found = families(scrape_text(ExportOptions(hostname="n1", naming=naming("4.9"))))
    assert value(found, "DCGM_FI_DEV_SM_CLOCK_HERTZ") == 1_410_000_000  # 1410 MHz
    assert value(found, "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ") == 2_619_000_000
    assert value(found, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL") == 123_456.789  # 123,456,789 mJ
    assert value(found, "DCGM_FI_DEV_GPU_UTIL_RATIO") == 0.87  # 87 %
    assert value(found, "DCGM_FI_DEV_MEMORY_UTIL_RATIO") == 0.41
    assert value(found, "DCGM_FI_DEV_ENC_UTIL_RATIO") == 0.12
    assert value(found, "DCGM_FI_DEV_DEC_UTIL_RATIO") == 0.03
    assert value(found, "DCGM_FI_DEV_FB_USED_BYTES") == 30 * GiB
    assert value(found, "DCGM_FI_DEV_FB_RESERVED_BYTES") == 512 * MiB
    assert value(found, "DCGM_FI_DEV_FB_FREE_BYTES") == 80 * GiB - 30 * GiB - 512 * MiB
    assert value(found, "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND") == 1.2e11 + 1.1e11
    # Same unit, new name.
    assert value(found, "DCGM_FI_DEV_GPU_TEMP_CELSIUS") == 61.0
    assert value(found, "DCGM_FI_DEV_BOARD_POWER_WATTS") == 412.5
    assert value(found, "DCGM_FI_DEV_PCIE_REPLAY_TOTAL") == 3
    assert value(found, "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO") == 0.93
    ((xid_labels, xid),) = found["DCGM_FI_DEV_XID_ERROR"]
    assert (xid, xid_labels["err_code"], xid_labels["err_msg"]) == (48, "48", "Double Bit ECC Error")
    # Families 4.9 does not rename keep their names and units.
    assert value(found, "DCGM_FI_DEV_POWER_VIOLATION") == 2_500_000_000
    assert not set(found) & set(RENAMES_4_9)
    # Labels: hostname, and the driver version under DCGM's new name, on every series.
    for name, samples in found.items():
        for labels, _ in samples:
            assert "Hostname" not in labels, name
            assert labels["hostname"] == "n1", name
            assert labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] == "550.54", name


def test_4_9_help_texts_name_the_new_units() -> None:
    text = scrape_text(ExportOptions(hostname="n1", naming=naming("4.9")))
    assert "# HELP DCGM_FI_DEV_SM_CLOCK_HERTZ SM clock frequency (in Hz).\n" in text
    assert "# HELP DCGM_FI_DEV_FB_USED_BYTES Framebuffer memory used (in bytes).\n" in text
    assert "# HELP DCGM_FI_DEV_GPU_UTIL_RATIO GPU utilization (ratio, 0 to 1).\n" in text
    assert "# HELP DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL Total energy consumption since boot (in J).\n" in text
    assert "# TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL counter\n" in text


def test_4_9_naming_in_openmetrics() -> None:
    text = scrape_text(ExportOptions(hostname="n1", naming=naming("4.9")), openmetrics=True)
    parsed = {family.name: family for family in parse_openmetrics(text)}
    assert parsed["DCGM_FI_DEV_GPU_UTIL_RATIO"].samples[0].value == 0.87
    assert parsed["DCGM_FI_DEV_GPU_UTIL_RATIO"].samples[0].labels["hostname"] == "n1"


def test_the_live_timestamps_carry_the_namings_host_label() -> None:
    options = ExportOptions(hostname="n1", naming=naming("4.9"), stale_after_s=1e12)
    found = families(scrape_text(options))
    assert found["nvdash_last_sample_timestamp_seconds"] == [({"hostname": "n1"}, 1000.0)]


def test_the_choices_and_a_wrong_one() -> None:
    assert sorted(NAMINGS) == ["4.8", "4.9"]
    with pytest.raises(ValueError, match=r"unknown dcgm-exporter naming '5.0'; choose from 4.8, 4.9"):
        naming("5.0")


def test_the_command_line_flag() -> None:
    assert parse_settings([], {}).metrics_compat == "4.8"
    assert parse_settings(["--metrics-compat", "4.9"], {}).metrics_compat == "4.9"
    with pytest.raises(UsageError) as info:
        parse_settings(["--metrics-compat", "5"], {})
    assert str(info.value) == "argument --metrics-compat: invalid choice: '5' (choose from '4.8', '4.9')"
