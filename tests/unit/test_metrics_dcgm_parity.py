"""``/metrics`` against dcgm-exporter and DCGM themselves: which limit each power family is, the XID ``err_msg``
strings, the default counters file's types and help texts, and the families issue 22 adds, in DCGM's units.

Expected values are written from the definitions, never from nvdash's code: DCGM's ``dcgm_fields.h`` (field
meanings and units), dcgm-exporter's ``etc/default-counters.csv`` and ``internal/pkg/collector/xid_errors.go``
(4.5.3-4.8.2), NVML's ``nvmlViolationTime_t`` (``violationTime`` in ns).
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.metrics.collector import ExportOptions, StoreCollector, unknown_fields
from nvdash.metrics.counters import Counter, default_counters, parse_counters
from nvdash.metrics.exposition import text_format
from nvdash.metrics.xid_names import xid_err_msg
from nvdash.sampling.records import GpuEvent, GpuSample, HostSample, NvLinkSample, Snapshot
from nvdash.store import Store
from tests.unit.test_apps_health import INVENTORY

Found = dict[str, list[tuple[dict[str, str], float]]]


def scrape(samples: tuple[GpuSample, ...], counters: list[Counter], events: list[GpuEvent] | None = None) -> Found:
    store = Store(INVENTORY, capacity=4)
    store.append(Snapshot(1000.0, samples, HostSample()))
    if events:
        store.add_events(events)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, counters, ExportOptions(hostname="n1")))
    text = text_format(registry.collect()).decode()
    return {family.name: [(sample.labels, sample.value) for sample in family.samples] for family in parse_text(text)}


def values(found: Found, name: str) -> list[float]:
    return [value for _, value in found[name]]


# --- 1. Power limits ------------------------------------------------------------------------------------------


def test_power_mgmt_limit_is_the_requested_limit_and_the_enforced_one_has_its_own_name() -> None:
    # dcgm_fields.h: POWER_MGMT_LIMIT (160) is "Current Power limit for the device", the management limit that was
    # set; ENFORCED_POWER_LIMIT (164) is the "Effective power limit that the driver enforces after taking into
    # account all limiters", so it can be lower (here a 300 W board cap under a 350 W management limit).
    sample = GpuSample(0, power_limit_w=300.0, power_management_limit_w=350.0)
    found = scrape((sample,), default_counters())
    assert values(found, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == [350.0]
    assert values(found, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == [300.0]


def test_power_limit_help_texts() -> None:
    helps = {counter.name: counter.help for counter in default_counters()}
    assert helps["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == "Current power limit for the device (in W)."
    assert helps["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"] == (
        "Effective power limit that the driver enforces after taking into account all limiters (in W).")


# --- 2. XID err_msg in dcgm-exporter's words -------------------------------------------------------------------

DCGM_EXPORTER_XID_TEXT = {
    # From dcgm-exporter's xidErrCodeToText (internal/pkg/collector/xid_errors.go) and unknownErr (gpu_collector.go).
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    48: "Double Bit ECC Error",
    79: "GPU has fallen off the bus",
    172: "Uncorrectable SRAM Error",
    173: "Unknown Error",
    999: "Unknown Error",
    -1: "Unknown Error",
}


@pytest.mark.parametrize(("code", "text"), sorted(DCGM_EXPORTER_XID_TEXT.items()))
def test_xid_err_msg_is_dcgm_exporters_text(code: int, text: str) -> None:
    assert xid_err_msg(code) == text


@pytest.mark.parametrize("code", [48, 79, 31, 13, 999])
def test_the_xid_series_carries_dcgm_exporters_err_msg(code: int) -> None:
    found = scrape((GpuSample(0),), parse_counters("DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error."),
                   [GpuEvent(990.0, 0, "xid", f"Xid {code}", "critical", code)])
    ((labels, value),) = found["DCGM_FI_DEV_XID_ERRORS"]
    assert value == code
    assert (labels["err_code"], labels["err_msg"]) == (str(code), DCGM_EXPORTER_XID_TEXT[code])


# --- 3. The default counters file against dcgm-exporter's ------------------------------------------------------

DCGM_EXPORTER_DEFAULTS = """
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL,      gauge, Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).
DCGM_FI_DEV_XID_ERRORS,              gauge,   Value of the last XID error encountered.
DCGM_FI_DEV_POWER_VIOLATION,       counter, Throttling duration due to power constraints (in ns).
DCGM_FI_DEV_THERMAL_VIOLATION,     counter, Throttling duration due to thermal constraints (in ns).
DCGM_FI_DEV_SYNC_BOOST_VIOLATION,  counter, Throttling duration due to sync-boost constraints (in ns).
DCGM_FI_DEV_BOARD_LIMIT_VIOLATION, counter, Throttling duration due to board limit constraints (in ns).
DCGM_FI_DEV_LOW_UTIL_VIOLATION,    counter, Throttling duration due to low utilization (in ns).
DCGM_FI_DEV_RELIABILITY_VIOLATION, counter, Throttling duration due to reliability constraints (in ns).
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED, gauge, Framebuffer memory reserved (in MiB).
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Total number of single-bit persistent ECC errors.
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, counter, Total number of double-bit persistent ECC errors.
DCGM_FI_DEV_RETIRED_SBE,     counter, Total number of retired pages due to single-bit errors.
DCGM_FI_DEV_RETIRED_DBE,     counter, Total number of retired pages due to double-bit errors.
DCGM_FI_DEV_RETIRED_PENDING, counter, Total number of pages pending retirement.
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,   counter, Total number of NVLink retries.
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, counter, Total number of NVLink recovery errors.
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, Total number of NVLink bandwidth counters for all lanes.
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION,        label, Driver Version
DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_SM_ACTIVE,          gauge, The ratio of cycles an SM has at least 1 warp assigned.
DCGM_FI_PROF_SM_OCCUPANCY,       gauge, The ratio of number of warps resident on an SM.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE,        gauge, Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PIPE_FP64_ACTIVE,   gauge, Ratio of cycles the fp64 pipes are active.
DCGM_FI_PROF_PIPE_FP32_ACTIVE,   gauge, Ratio of cycles the fp32 pipes are active.
DCGM_FI_PROF_PIPE_FP16_ACTIVE,   gauge, Ratio of cycles the fp16 pipes are active.
""" + (
    "DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus - including both protocol"
    " headers and data payloads - in bytes per second.\n"
    "DCGM_FI_PROF_PCIE_RX_BYTES,      gauge, The rate of data received over the PCIe bus - including both protocol"
    " headers and data payloads - in bytes per second.\n")
"""dcgm-exporter 4.5.3-4.8.2's etc/default-counters.csv, its active and its commented-out rows (uncommented)."""


def test_every_family_both_default_files_have_has_dcgm_exporters_type_and_help() -> None:
    theirs = {counter.name: counter for counter in parse_counters(DCGM_EXPORTER_DEFAULTS)}
    ours = default_counters()
    shared = [counter for counter in ours if counter.name in theirs]
    assert len(shared) >= 35
    assert [(c.name, c.kind, c.help) for c in shared] == [
        (c.name, theirs[c.name].kind, theirs[c.name].help) for c in shared]
    kinds = {counter.name: counter.kind for counter in ours}
    assert kinds["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == "counter"


def test_the_defaults_export_what_operators_asked_for() -> None:
    names = {counter.name for counter in default_counters()}
    asked = {
        "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION", "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    }
    assert asked <= names
    # dcgm-exporter ships the retired-page rows commented out: so does nvdash.
    assert not {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"} & names
    assert unknown_fields(default_counters()) == []


# --- 4. The new families, in DCGM's units ----------------------------------------------------------------------

NEW_ROWS = parse_counters(DCGM_EXPORTER_DEFAULTS + """
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, counter, x
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L3, counter, x
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L3, counter, x
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L17, counter, x
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, counter, x
""")

READINGS = GpuSample(
    0, encoder_utilization_pct=37.0, decoder_utilization_pct=12.0,
    gpm_fp64_active_pct=25.0, gpm_fp32_active_pct=62.5, gpm_fp16_active_pct=5.0,
    violation_power_ns=2_500_000_000, violation_thermal_ns=7, violation_sync_boost_ns=0,
    violation_board_limit_ns=123_456_789_012, violation_low_utilization_ns=1_000, violation_reliability_ns=42,
    nvlink_crc_flit_errors=5, nvlink_crc_data_errors=2, nvlink_replay_errors=11, nvlink_recovery_errors=1,
    nvlinks=(NvLinkSample(0, active=True, crc_flit_errors=4, crc_data_errors=2, replay_errors=0, recovery_errors=1),
             NvLinkSample(3, active=True, crc_flit_errors=1, crc_data_errors=None, replay_errors=11,
                          recovery_errors=0)),
    retired_pages_pending=True,
)


def test_encoder_and_decoder_utilization_are_percent() -> None:
    found = scrape((READINGS,), NEW_ROWS)
    assert values(found, "DCGM_FI_DEV_ENC_UTIL") == [37.0]  # DCGM 206: Encoder Utilization, %
    assert values(found, "DCGM_FI_DEV_DEC_UTIL") == [12.0]


def test_fp_pipe_activity_is_a_ratio_like_the_other_profiling_fields() -> None:
    found = scrape((READINGS,), NEW_ROWS)
    assert values(found, "DCGM_FI_PROF_PIPE_FP64_ACTIVE") == [0.25]
    assert values(found, "DCGM_FI_PROF_PIPE_FP32_ACTIVE") == [0.625]
    assert values(found, "DCGM_FI_PROF_PIPE_FP16_ACTIVE") == [0.05]


def test_violation_times_are_nanoseconds_as_dcgm_reports_them() -> None:
    # dcgm_fields.h: "Power Violation time in ns" (field 240, read from NVML_FI_DEV_PERF_POLICY_POWER, whose
    # violationTime NVML gives in ns): the value passes through unchanged, 2.5 s = 2_500_000_000.
    found = scrape((READINGS,), NEW_ROWS)
    assert values(found, "DCGM_FI_DEV_POWER_VIOLATION") == [2_500_000_000]
    assert values(found, "DCGM_FI_DEV_THERMAL_VIOLATION") == [7]
    assert values(found, "DCGM_FI_DEV_SYNC_BOOST_VIOLATION") == [0]
    assert values(found, "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION") == [123_456_789_012]
    assert values(found, "DCGM_FI_DEV_LOW_UTIL_VIOLATION") == [1_000]
    assert values(found, "DCGM_FI_DEV_RELIABILITY_VIOLATION") == [42]


def test_nvlink_error_counters_in_total_and_per_link() -> None:
    found = scrape((READINGS,), NEW_ROWS)
    assert values(found, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") == [5]
    assert values(found, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL") == [2]
    assert values(found, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL") == [11]
    assert values(found, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL") == [1]
    assert values(found, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0") == [4]
    assert values(found, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L3") == [1]
    assert values(found, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0") == [1]
    # Link 3 did not answer its data CRC counter, and the GPU has no link 17: no series, not a zero.
    assert found.get("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L3", []) == []
    assert found.get("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L17", []) == []
    # Per-link families are one name per link, as DCGM names them; no link label.
    assert all("link" not in labels for labels, _ in found["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0"])


def test_a_gpu_without_the_readings_has_no_series() -> None:
    found = scrape((GpuSample(0, utilization_pct=10.0),), NEW_ROWS)
    for name in ("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_DEV_POWER_VIOLATION",
                 "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0"):
        assert found.get(name, []) == [], name
    assert values(found, "DCGM_FI_DEV_GPU_UTIL") == [10.0]


def test_retired_pending_is_exported_as_dcgm_exporter_types_it() -> None:
    found = scrape((READINGS,), NEW_ROWS)
    assert values(found, "DCGM_FI_DEV_RETIRED_PENDING") == [1.0]  # NVML's pending flag: 1 = pages await retirement
    kinds = {counter.name: counter.kind for counter in NEW_ROWS}
    assert kinds["DCGM_FI_DEV_RETIRED_PENDING"] == "counter"
