"""nvidia-smi ``--query-gpu`` CSV: the lines are written as nvidia-smi writes them, and its logs read back.

The expected text is nvidia-smi's own layout (header units in brackets, kept under ``nounits``; ``", "`` between
values; ``YYYY/MM/DD HH:MM:SS.mmm`` local timestamps; ``45 %``, ``1234 MiB``, ``70.50 W``, ``1980 MHz``, ``P0``,
``0x0000000000000001``; ``[N/A]`` for unknown values), not whatever the module happens to produce.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from nvdash.history.nvsmi_csv import SUPPORTED_FIELDS, LogRow, format_header, format_row, parse_csv
from nvdash.sampling.records import GpuInfo

MIB = 1 << 20
UTC = timezone.utc


def utc(iso: str) -> float:
    """Epoch seconds of a UTC wall-clock time written in ISO 8601."""
    return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def gpu(index: int = 0, name: str = "NVIDIA H100 80GB HBM3", uuid: str = "GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b",
        bus: str = "00000000:18:00.0", total: int | None = 81559 * MIB) -> GpuInfo:
    return GpuInfo(index=index, name=name, uuid=uuid, memory_total_bytes=total, pcie_generation=5, pcie_width=16,
                   pcie_max_bytes_per_s=None, nvlink_links=0, nvlink_max_bytes_per_s=None, pci_bus_id=bus)


# Two H100s logged by `nvidia-smi --query-gpu=... --format=csv -l 1`: the header once, then a line per GPU per round.
LOOP_LOG = """\
timestamp, index, name, uuid, pci.bus_id, driver_version, pstate, temperature.gpu, utilization.gpu [%], \
memory.total [MiB], memory.used [MiB], power.draw [W], clocks.current.sm [MHz], clocks_event_reasons.active
2024/01/15 10:23:45.123, 0, NVIDIA H100 80GB HBM3, GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b, 00000000:18:00.0, \
550.54.15, P0, 45, 97 %, 81559 MiB, 70123 MiB, 512.34 W, 1980 MHz, 0x0000000000000000
2024/01/15 10:23:45.131, 1, NVIDIA H100 80GB HBM3, GPU-9a0c44f1-2b3e-4d5f-8a6b-7c8d9e0f1a2b, 00000000:2A:00.0, \
550.54.15, P0, 39, 0 %, 81559 MiB, 4 MiB, 70.50 W, 1980 MHz, 0x0000000000000001
2024/01/15 10:23:46.140, 0, NVIDIA H100 80GB HBM3, GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b, 00000000:18:00.0, \
550.54.15, P0, 46, 100 %, 81559 MiB, 70125 MiB, 689.07 W, 1755 MHz, 0x0000000000000004
2024/01/15 10:23:46.148, 1, NVIDIA H100 80GB HBM3, GPU-9a0c44f1-2b3e-4d5f-8a6b-7c8d9e0f1a2b, 00000000:2A:00.0, \
550.54.15, P0, 39, 0 %, 81559 MiB, 4 MiB, 70.12 W, 1980 MHz, 0x0000000000000001
"""


def test_a_loop_log_with_units_reads_into_raw_columns() -> None:
    log = parse_csv(LOOP_LOG.splitlines(keepends=True), tz=UTC)

    assert log.errors == []
    assert log.ignored_fields == []
    assert log.fields == ["timestamp", "index", "name", "uuid", "pci.bus_id", "driver_version", "pstate",
                          "temperature.gpu", "utilization.gpu", "memory.total", "memory.used", "power.draw",
                          "clocks.current.sm", "clocks_event_reasons.active"]
    assert [(row.index, row.line) for row in log.rows] == [(0, 2), (1, 3), (0, 4), (1, 5)]
    first, second, third = log.rows[0], log.rows[1], log.rows[2]
    assert first.time_s == pytest.approx(utc("2024-01-15T10:23:45.123"), abs=1e-6)
    assert third.time_s == pytest.approx(utc("2024-01-15T10:23:46.140"), abs=1e-6)
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.uuid == "GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert first.driver_version == "550.54.15"
    assert first.values == {
        "pstate": 0, "temperature_c": 45.0, "utilization_pct": 97.0, "memory_total_bytes": 81559 * MIB,
        "memory_used_bytes": 70123 * MIB, "power_w": 512.34, "clock_sm_mhz": 1980.0, "clock_event_reasons": 0,
    }
    assert isinstance(first.values["memory_used_bytes"], int)
    assert isinstance(first.values["pstate"], int)
    assert second.values["power_w"] == 70.5
    assert second.values["clock_event_reasons"] == 0x1
    assert third.values["clock_event_reasons"] == 0x4  # SW power cap
    assert third.values["clock_sm_mhz"] == 1755.0


def test_nounits_values_under_the_header_nvidia_smi_prints_with_units() -> None:
    # `--format=csv,nounits`: the header keeps its units, the values lose theirs; P0 and the mask stay as they are.
    text = [
        "timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W], clocks.current.sm [MHz], "
        "pstate, clocks_event_reasons.active",
        "2024/01/15 10:23:45.123, 0, 97, 70123, 512.34, 1980, P0, 0x0000000000000000",
    ]
    (row,) = parse_csv(text, tz=UTC).rows
    assert row.values == {"utilization_pct": 97.0, "memory_used_bytes": 70123 * MIB, "power_w": 512.34,
                          "clock_sm_mhz": 1980.0, "pstate": 0, "clock_event_reasons": 0}


def test_a_header_without_units_and_values_with_or_without_them() -> None:
    text = [
        "timestamp,index,utilization.gpu,memory.used,power.draw",
        "2024/01/15 10:23:45.123,0,97,70123,512.34",
        "2024/01/15 10:23:45.131,1,45 %,1234 MiB,70.50 W",
    ]
    log = parse_csv(text, tz=UTC)
    assert log.errors == []
    assert [row.values for row in log.rows] == [
        {"utilization_pct": 97.0, "memory_used_bytes": 70123 * MIB, "power_w": 512.34},
        {"utilization_pct": 45.0, "memory_used_bytes": 1234 * MIB, "power_w": 70.5},
    ]


def test_a_log_without_a_header_is_refused_with_one_clear_error() -> None:
    # `--format=csv,noheader`: nothing says which column is which.
    text = ["2024/01/15 10:23:45.123, 0, 97 %, 70123 MiB", "2024/01/15 10:23:45.131, 1, 0 %, 4 MiB"]
    with pytest.raises(ValueError, match="no nvidia-smi header"):
        parse_csv(text)
    with pytest.raises(ValueError, match="no nvidia-smi header"):
        parse_csv([])


def test_repeated_headers_blank_lines_crlf_and_a_bom() -> None:
    # Two runs appended to one file: the second header changes the fields. Windows line ends, a BOM up front.
    text = (
        "\ufefftimestamp, index, utilization.gpu [%], power.draw [W]\r\n"
        "2024/01/15 10:23:45.123, 0, 97 %, 512.34 W\r\n"
        "\r\n"
        "2024/01/15 10:23:46.140, 0, 100 %, 689.07 W\r\n"
        "timestamp, uuid, fan.speed [%], utilization.gpu [%], encoder.stats.sessionCount\r\n"
        "2024/01/15 11:00:00.000, GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b, 30 %, 12 %, 0\r\n"
        "   \r\n"
    )
    log = parse_csv(text.splitlines(keepends=True), tz=UTC)
    assert log.errors == []
    assert [row.line for row in log.rows] == [2, 4, 6]
    assert log.rows[0].values == {"utilization_pct": 97.0, "power_w": 512.34}
    assert log.rows[2].index is None
    assert log.rows[2].uuid == "GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b"
    assert log.rows[2].values == {"fan_speed_pct": 30.0, "utilization_pct": 12.0}
    assert log.fields == ["timestamp", "index", "utilization.gpu", "power.draw", "uuid", "fan.speed",
                          "encoder.stats.sessionCount"]
    assert log.ignored_fields == ["encoder.stats.sessionCount"]


def test_any_subset_of_fields_in_any_order_and_the_aliases_in_headers() -> None:
    text = [
        "clocks.current.memory [MHz], pci.bus_id, power.draw [W], timestamp, clocks.sm [MHz], gpu_name",
        "2619 MHz, 00000000:2A:00.0, 70.50 W, 2024/01/15 10:23:45.131, 1980 MHz, NVIDIA H100 80GB HBM3",
    ]
    log = parse_csv(text, tz=UTC)
    (row,) = log.rows
    assert log.fields == ["clocks.current.memory", "pci.bus_id", "power.draw", "timestamp", "clocks.current.sm",
                          "name"]
    assert row.time_s == pytest.approx(utc("2024-01-15T10:23:45.131"), abs=1e-6)
    assert (row.index, row.uuid, row.pci_bus_id, row.name) == (None, None, "00000000:2A:00.0",
                                                               "NVIDIA H100 80GB HBM3")
    assert row.values == {"clock_memory_mhz": 2619.0, "power_w": 70.5, "clock_sm_mhz": 1980.0}


def test_every_unknown_value_spelling_reads_as_none() -> None:
    text = [
        "timestamp, index, fan.speed [%], power.draw [W], temperature.memory, "
        "ecc.errors.uncorrected.volatile.total, clocks.current.sm [MHz], pstate",
        "2024/01/15 10:23:45.123, 0, [N/A], [Not Supported], [Unknown Error], N/A, [GPU requires reset], "
        "[Insufficient Permissions]",
    ]
    (row,) = parse_csv(text, tz=UTC).rows
    assert row.values == {"fan_speed_pct": None, "power_w": None, "memory_temperature_c": None,
                          "ecc_uncorrected_volatile": None, "clock_sm_mhz": None, "pstate": None}


def test_bad_lines_are_reported_with_their_numbers_and_the_good_ones_kept() -> None:
    text = [
        "2024/01/15 10:23:44.000, 0, 5 %, 1 MiB",                        # 1: before any header
        "timestamp, index, utilization.gpu [%], memory.used [MiB]",        # 2
        "2024/01/15 10:23:45.123, 0, 97 %, 70123 MiB",                   # 3: good
        "2024/01/15 10:23:45.131, 1, 0 %",                               # 4: a value short
        "2024/01/15 10:23:46.140, 0, lots %, 70125 MiB",                 # 5: not a number
        "2024/13/45 10:23:46.148, 1, 0 %, 4 MiB",                        # 6: no such date
        "yesterday, 1, 0 %, 4 MiB",                                      # 7: not a timestamp
        "Failed to initialize NVML: Driver/library version mismatch",    # 8: garbage
        "2024/01/15 10:23:47.150, [N/A], 0 %, 4 MiB",                    # 9: no GPU identity
        "2024/01/15 10:23:47.160, 1, 45 W, 4 MiB",                       # 10: wrong unit
        "2024/01/15 10:23:48.160, 1, 1 %, 4 MiB",                        # 11: good
    ]
    log = parse_csv(text, tz=UTC)
    assert [row.line for row in log.rows] == [3, 11]
    assert [number for number, _ in log.errors] == [1, 4, 5, 6, 7, 8, 9, 10]
    reasons = dict(log.errors)
    assert "before the first header" in reasons[1]
    assert "expected 4 values" in reasons[4]
    assert "found 3" in reasons[4]
    assert "utilization.gpu" in reasons[5]
    assert "timestamp" in reasons[6]
    assert "timestamp" in reasons[7]
    assert "identity" in reasons[9]
    assert "utilization.gpu" in reasons[10]
    assert all("\n" not in reason for reason in reasons.values())


def test_a_header_without_a_timestamp_or_an_identity_skips_its_lines_with_one_error() -> None:
    text = [
        "utilization.gpu [%], memory.used [MiB]",
        "97 %, 70123 MiB",
        "0 %, 4 MiB",
        "timestamp, index, utilization.gpu [%]",
        "2024/01/15 10:23:45.123, 0, 97 %",
    ]
    log = parse_csv(text, tz=UTC)
    assert [row.line for row in log.rows] == [5]
    assert len(log.errors) == 1
    number, reason = log.errors[0]
    assert number == 1
    assert "timestamp" in reason
    assert "2 line(s) skipped" in reason


def test_fields_nvdash_does_not_keep_or_derives_are_not_imported() -> None:
    # The A100 line as nvidia-smi 545 logged it; pcie.link.gen.max is not kept, and memory.free is derived on
    # export, so not imported. utilization.memory is kept: the share of time memory was read or written.
    text = [
        "timestamp, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, "
        "temperature.gpu, utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.free [MiB], "
        "memory.used [MiB]",
        "2024/06/01 11:27:05.177, NVIDIA A100-SXM4-40GB, 00000000:3B:00.0, 545.23.08, P0, 4, 4, 44, 0 %, 0 %, "
        "40960 MiB, 40333 MiB, 4 MiB",
    ]
    log = parse_csv(text, tz=UTC)
    (row,) = log.rows
    assert log.ignored_fields == ["pcie.link.gen.max"]
    assert "memory.free" in log.fields
    assert row.values == {"pstate": 0, "pcie_generation_current": 4, "temperature_c": 44.0, "utilization_pct": 0.0,
                          "memory_utilization_pct": 0.0, "memory_total_bytes": 40960 * MIB,
                          "memory_used_bytes": 4 * MIB}


def test_the_enforced_and_the_requested_limit_stay_apart_and_old_field_names_read() -> None:
    # nvidia-smi: enforced.power.limit is the ceiling the power manager applies (the lowest of the limiters),
    # power.limit the software (management) limit that was set; a board cap can hold the first below the second.
    both = ["timestamp, index, power.limit [W], enforced.power.limit [W]",
            "2024/01/15 10:23:45.123, 0, 700.00 W, 400.00 W"]
    only_software = ["timestamp, index, power.limit [W]", "2024/01/15 10:23:45.123, 0, 700.00 W"]
    assert parse_csv(both, tz=UTC).rows[0].values == {"power_management_limit_w": 700.0, "power_limit_w": 400.0}
    assert parse_csv(only_software, tz=UTC).rows[0].values == {"power_management_limit_w": 700.0}

    # Drivers before 530 name the mask clocks_throttle_reasons; a link width may carry nvidia-smi -q's "x".
    old = ["timestamp, index, clocks_throttle_reasons.active, pcie.link.width.current, retired_pages.sbe",
           "2022/04/02 09:00:00.000, 0, 0x00000000000001FF, 16x, 0"]
    log = parse_csv(old, tz=UTC)
    assert log.fields == ["timestamp", "index", "clocks_event_reasons.active", "pcie.link.width.current",
                          "retired_pages.single_bit_ecc.count"]
    assert log.rows[0].values == {"clock_event_reasons": 0x1FF, "pcie_width_current": 16, "retired_pages_sbe": 0}


def test_timestamps_are_local_time_unless_a_zone_is_given() -> None:
    text = ["timestamp, index", "2024/01/15 10:23:45.123, 0"]
    assert parse_csv(text).rows[0].time_s == pytest.approx(
        datetime(2024, 1, 15, 10, 23, 45, 123000).timestamp(), abs=1e-6)
    five_behind = timezone(timedelta(hours=-5))
    assert parse_csv(text, tz=five_behind).rows[0].time_s == pytest.approx(
        utc("2024-01-15T15:23:45.123"), abs=1e-6)


# ------------------------------------------------------------------------------------------------------ writing


A100_FIELDS = ["timestamp", "name", "pci.bus_id", "driver_version", "pstate", "pcie.link.gen.current",
               "temperature.gpu", "utilization.gpu", "memory.total", "memory.free", "memory.used"]
A100 = gpu(name="NVIDIA A100-SXM4-40GB", uuid="GPU-faae5314-b87e-87c0-400b-b7cfb9e7b310", bus="00000000:3B:00.0",
           total=40960 * MIB)
A100_VALUES = {"pstate": 0, "pcie_generation_current": 4, "temperature_c": 44.0, "utilization_pct": 0.0,
               "memory_total_bytes": 40960 * MIB, "memory_used_bytes": 4 * MIB + 100 * 1024,
               "memory_reserved_bytes": 623 * MIB + 500 * 1024}


def test_the_header_is_the_one_nvidia_smi_prints() -> None:
    fields = ["timestamp", "index", "gpu_name", "utilization.gpu", "memory.used", "power.draw", "clocks.sm",
              "clocks.gr", "temperature.gpu", "pstate", "clocks_throttle_reasons.active"]
    assert format_header(fields) == (
        "timestamp, index, name, utilization.gpu [%], memory.used [MiB], power.draw [W], clocks.current.sm [MHz], "
        "clocks.current.graphics [MHz], temperature.gpu, pstate, clocks_event_reasons.active")
    assert format_header(fields, units=False) == (
        "timestamp, index, name, utilization.gpu, memory.used, power.draw, clocks.current.sm, "
        "clocks.current.graphics, temperature.gpu, pstate, clocks_event_reasons.active")
    assert format_header(A100_FIELDS) == (
        "timestamp, name, pci.bus_id, driver_version, pstate, pcie.link.gen.current, temperature.gpu, "
        "utilization.gpu [%], memory.total [MiB], memory.free [MiB], memory.used [MiB]")


def test_a_row_matches_the_line_nvidia_smi_logged() -> None:
    time_s = utc("2024-06-01T11:27:05.177")
    line = format_row(A100_FIELDS, time_s, A100, A100_VALUES, "545.23.08", tz=UTC)
    # Free is what total leaves after reserved and used: 40333 MiB as nvidia-smi printed it.
    assert line == ("2024/06/01 11:27:05.177, NVIDIA A100-SXM4-40GB, 00000000:3B:00.0, 545.23.08, P0, 4, 44, 0 %, "
                    "40960 MiB, 40333 MiB, 4 MiB")
    nounits = format_row(A100_FIELDS, time_s, A100, A100_VALUES, "545.23.08", units=False, tz=UTC)
    assert nounits == ("2024/06/01 11:27:05.177, NVIDIA A100-SXM4-40GB, 00000000:3B:00.0, 545.23.08, P0, 4, 44, 0, "
                       "40960, 40333, 4")


def test_watts_two_decimals_the_mask_in_hex_and_unknowns_as_na() -> None:
    fields = ["timestamp", "index", "uuid", "power.draw", "enforced.power.limit", "clocks.sm", "clocks.mem",
              "fan.speed", "temperature.memory", "clocks_event_reasons.active",
              "ecc.errors.uncorrected.volatile.total", "memory.free", "driver_version"]
    values = {"power_w": 70.5, "power_limit_w": 700.0, "clock_sm_mhz": 1980.0, "clock_memory_mhz": 2619.0,
              "fan_speed_pct": None, "memory_temperature_c": 35.0, "clock_event_reasons": 0x1FF,
              "ecc_uncorrected_volatile": 0}
    line = format_row(fields, utc("2024-01-15T10:23:45.123"), gpu(), values, None, tz=UTC)
    # memory.free needs memory.used, which this row lacks; the driver version is unknown.
    assert line == ("2024/01/15 10:23:45.123, 0, GPU-5117a0e2-6d1c-4a7e-9b0f-3c2d1e0f9a8b, 70.50 W, 700.00 W, "
                    "1980 MHz, 2619 MHz, [N/A], 35, 0x00000000000001FF, 0, [N/A], [N/A]")


def test_free_memory_without_a_reserved_figure_is_total_minus_used() -> None:
    values = {"memory_used_bytes": 1234 * MIB}
    line = format_row(["memory.total", "memory.free", "memory.used"], 0.0, gpu(), values, None)
    assert line == "81559 MiB, 80325 MiB, 1234 MiB"  # total from the GPU's inventory


def test_timestamps_round_to_the_nearest_millisecond() -> None:
    base = utc("2024-01-15T10:23:45.000")
    assert format_row(["timestamp"], base + 0.9996, gpu(), {}, None, tz=UTC) == "2024/01/15 10:23:46.000"
    assert format_row(["timestamp"], base + 0.0004, gpu(), {}, None, tz=UTC) == "2024/01/15 10:23:45.000"
    assert format_row(["timestamp"], base + 0.5, gpu(), {}, None, tz=timezone(timedelta(hours=1))) == (
        "2024/01/15 11:23:45.500")


def test_an_unknown_field_names_the_supported_ones_on_one_line() -> None:
    with pytest.raises(ValueError, match=r"'encoder\.stats\.sessionCount'") as caught:
        format_header(["timestamp", "encoder.stats.sessionCount"])
    message = str(caught.value)
    assert "\n" not in message
    assert "memory.used" in message
    assert "clocks_event_reasons.active" in message
    with pytest.raises(ValueError, match="bogus"):
        format_row(["bogus"], 0.0, gpu(), {}, None)


# ------------------------------------------------------------------------------------------------- round trip


def _info_of(row: LogRow) -> GpuInfo:
    return gpu(index=row.index or 0, name=row.name or "", uuid=row.uuid or "", bus=row.pci_bus_id or "", total=None)


@pytest.mark.parametrize("units", [True, False])
@pytest.mark.parametrize("tz", [None, UTC, timezone(timedelta(hours=-5, minutes=-30))])
def test_export_import_export_is_byte_identical(units: bool, tz: timezone | None) -> None:
    fields = list(SUPPORTED_FIELDS)
    values = {
        "utilization_pct": 97.0, "memory_total_bytes": 81559 * MIB, "memory_reserved_bytes": 522 * MIB + 12345,
        "memory_used_bytes": 70123 * MIB + 999, "temperature_c": 45.0, "memory_temperature_c": None,
        "fan_speed_pct": None, "power_w": 512.34, "power_limit_w": 700.0, "pstate": 0,
        "clock_graphics_mhz": 1980.0, "clock_sm_mhz": 1980.0, "clock_memory_mhz": 2619.0, "clock_video_mhz": 1545.0,
        "clock_event_reasons": 0x4, "pcie_generation_current": 5, "pcie_width_current": 16,
        "ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0, "ecc_corrected_aggregate": 12,
        "ecc_uncorrected_aggregate": None, "retired_pages_sbe": 0, "retired_pages_dbe": 0,
    }
    times = [1705314225.1234, 1705314226.9996, 1705314227.5]
    first = [format_header(fields, units=units)] + [
        format_row(fields, t, gpu(index=i), values, "550.54.15", units=units, tz=tz) for i, t in enumerate(times)]

    log = parse_csv(first, tz=tz)
    assert log.errors == []
    assert log.fields == fields
    again = [format_header(log.fields, units=units)] + [
        format_row(log.fields, row.time_s, _info_of(row), row.values, row.driver_version, units=units, tz=tz)
        for row in log.rows]
    assert again == first


def test_a_log_nvidia_smi_wrote_exports_back_unchanged() -> None:
    lines = LOOP_LOG.splitlines()
    log = parse_csv(lines)
    again = [format_header(log.fields)] + [
        format_row(log.fields, row.time_s, _info_of(row), row.values, row.driver_version) for row in log.rows]
    assert again == lines
