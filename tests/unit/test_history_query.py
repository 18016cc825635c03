"""Reading the history back (resolution, buckets, gaps, GPU filter, host and derived metrics, bad requests) and
the time ranges users write (``6h``, ISO 8601, Unix seconds and milliseconds, ``from``/``to``).

Expected bucket values are computed here from the readings the tests write: a bucket ``[t, t + step)`` of a
query holds the minimum, the arithmetic mean and the maximum of the readings in it.
"""

from __future__ import annotations

import calendar
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from nvdash.history.query import MAX_POINTS, TARGET_POINTS, HistoryResult, Series, SqliteHistory, check_request
from nvdash.history.ranges import RangeError, TimeRange, parse_duration, parse_time, resolve
from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot

MIB = 1 << 20
HOUR = 3600.0
DAY = 86_400.0
T0 = 1_699_999_200.0
"""2023-11-14 22:00:00 UTC: a whole hour (and a multiple of 20 s)."""

Reading = tuple[float, float]
"""(time, value) of one reading of one series."""


def inventory(gpus: int) -> Inventory:
    return Inventory(host=HostInfo(hostname="node1", cpu_count=64, memory_total_bytes=512 << 30), gpus=tuple(
        GpuInfo(index=g, name="NVIDIA A100-SXM4-40GB", uuid=f"GPU-{g}", memory_total_bytes=40960 * MIB,
                pcie_generation=4, pcie_width=16, pcie_max_bytes_per_s=None, nvlink_links=0,
                nvlink_max_bytes_per_s=None) for g in range(gpus)))


def utilization(g: int, i: int) -> float:
    return float((i * 7 + 13 * g) % 101)


def pcie_tx(g: int, i: int) -> float:
    return 1.0e6 * ((i + g) % 5)


def pcie_rx(g: int, i: int) -> float:
    return 2.5e5 * (i % 3)


def cpu(i: int) -> float:
    return 1.5 * (i % 11)


def snapshot(time_s: float, i: int, gpus: int) -> Snapshot:
    return Snapshot(time_s, gpus=tuple(
        GpuSample(index=g, utilization_pct=utilization(g, i), pcie_tx_bytes_per_s=pcie_tx(g, i),
                  pcie_rx_bytes_per_s=pcie_rx(g, i), power_w=100.0 + g) for g in range(gpus)),
        host=HostSample(cpu_pct=cpu(i)))


def write(path: Path, times: Sequence[float], gpus: int, interval_s: float) -> None:
    """Readings ``i`` at ``times[i]``, written with nvdash's writer in one batch."""
    writer = HistoryWriter(path, inventory(gpus), "test", interval_s)
    writer.open()
    try:
        for i, time_s in enumerate(times):
            writer.submit(snapshot(time_s, i, gpus))
        writer.flush()
    finally:
        writer.stop()


def expected(readings: Sequence[Reading], step_s: float) -> tuple[list[float], list[float], list[float], list[float]]:
    """Bucket starts, means, minima and maxima of ``readings`` grouped into ``[k * step, (k + 1) * step)``."""
    groups: dict[float, list[float]] = {}
    for time_s, value in readings:
        groups.setdefault(math.floor(time_s / step_s) * step_s, []).append(value)
    starts = sorted(groups)
    return (starts, [sum(groups[s]) / len(groups[s]) for s in starts], [min(groups[s]) for s in starts],
            [max(groups[s]) for s in starts])


def assert_series(series: Series, readings: Sequence[Reading], step_s: float) -> None:
    starts, means, minima, maxima = expected(readings, step_s)
    assert series.time_s.tolist() == starts
    assert series.mean.tolist() == pytest.approx(means, rel=1e-12)
    assert series.minimum.tolist() == minima
    assert series.maximum.tolist() == maxima


def readings_of(times: Sequence[float], value: Callable[[int], float]) -> list[Reading]:
    return [(time_s, value(i)) for i, time_s in enumerate(times)]


def utilization_of(g: int) -> Callable[[int], float]:
    return lambda i: utilization(g, i)


def pcie_of(g: int) -> Callable[[int], float]:
    return lambda i: pcie_tx(g, i) + pcie_rx(g, i)


# ------------------------------------------------------------------------------------------------ fixtures

HALF_HOUR_TIMES = [T0 + 0.5 * i for i in range(3600)]
SIX_HOUR_TIMES = [T0 + 2.0 * i for i in range(10_800)]
WEEK_TIMES = [T0 + 60.0 * i for i in range(10_080)]


@pytest.fixture(scope="module")
def half_hour(tmp_path_factory: pytest.TempPathFactory) -> SqliteHistory:
    """Two GPUs read every 0.5 s for 30 minutes."""
    path = tmp_path_factory.mktemp("half-hour") / "history.sqlite"
    write(path, HALF_HOUR_TIMES, gpus=2, interval_s=0.5)
    return SqliteHistory(path)


@pytest.fixture(scope="module")
def six_hours(tmp_path_factory: pytest.TempPathFactory) -> SqliteHistory:
    """One GPU read every 2 s for 6 hours."""
    path = tmp_path_factory.mktemp("six-hours") / "history.sqlite"
    write(path, SIX_HOUR_TIMES, gpus=1, interval_s=2.0)
    return SqliteHistory(path)


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> SqliteHistory:
    """One GPU read every minute for 7 days."""
    path = tmp_path_factory.mktemp("week") / "history.sqlite"
    write(path, WEEK_TIMES, gpus=1, interval_s=60.0)
    return SqliteHistory(path)


# ------------------------------------------------------------------------------------------------ resolution


def test_a_30_minute_range_reads_the_raw_readings(half_hour: SqliteHistory) -> None:
    result = half_hour.query(["utilization_pct"], T0, T0 + 1800)

    assert result.resolution == "raw"
    assert result.step_s == pytest.approx(1800 / TARGET_POINTS)
    for g in (0, 1):
        series = result.series["utilization_pct"][g]
        assert TARGET_POINTS * 0.9 <= len(series.time_s) <= TARGET_POINTS + 1
        assert not any(math.isnan(value) for value in series.mean.tolist())
        values = [utilization(g, i) for i in range(len(HALF_HOUR_TIMES))]
        assert float(series.minimum.min()) == min(values)
        assert float(series.maximum.max()) == max(values)
        assert float(series.mean.mean()) == pytest.approx(sum(values) / len(values), rel=0.01)


def test_raw_buckets_hold_the_min_mean_and_max_of_their_readings(half_hour: SqliteHistory) -> None:
    result = half_hour.query(["utilization_pct"], T0, T0 + 1800, step_s=1.0)

    assert result.resolution == "raw"
    assert result.step_s == 1.0
    for g in (0, 1):
        assert_series(result.series["utilization_pct"][g],
                      readings_of(HALF_HOUR_TIMES, utilization_of(g)), 1.0)


def test_a_6_hour_range_reads_the_10_s_tier(six_hours: SqliteHistory) -> None:
    result = six_hours.query(["utilization_pct", "pcie_bytes_per_s"], T0, T0 + 6 * HOUR)

    assert result.resolution == "10s"
    # 6 h / TARGET_POINTS = 21.6 s, down to whole 10 s buckets.
    assert result.step_s == 20.0
    series = result.series["utilization_pct"][0]
    assert len(series.time_s) <= 2 * TARGET_POINTS
    assert_series(series, readings_of(SIX_HOUR_TIMES, utilization_of(0)), result.step_s)
    assert_series(result.series["pcie_bytes_per_s"][0],
                  readings_of(SIX_HOUR_TIMES, pcie_of(0)), result.step_s)


def test_a_7_day_range_reads_the_10_min_tier(week: SqliteHistory) -> None:
    result = week.query(["utilization_pct"], T0, T0 + 7 * DAY)

    assert result.resolution == "10m"
    # 7 d / TARGET_POINTS = 604.8 s, down to whole 10 min buckets: 1,008 buckets.
    assert result.step_s == 600.0
    series = result.series["utilization_pct"][0]
    assert len(series.time_s) == 7 * DAY / 600 + 1 or len(series.time_s) == 7 * DAY / 600
    assert_series(series, readings_of(WEEK_TIMES, utilization_of(0)), result.step_s)


def test_a_silence_becomes_a_gap_between_two_points(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    times = [T0 + 0.5 * i for i in range(1200)] + [T0 + 1200 + 0.5 * i for i in range(1200)]  # nothing for 10 min
    write(path, times, gpus=1, interval_s=0.5)

    result = SqliteHistory(path).query(["utilization_pct", "host_cpu_pct"], T0, T0 + 1800)

    for series in (result.series["utilization_pct"][0], result.series["host_cpu_pct"][None]):
        gaps = [k for k, value in enumerate(series.mean.tolist()) if math.isnan(value)]
        assert len(gaps) == 1
        k = gaps[0]
        assert math.isnan(series.minimum[k])
        assert math.isnan(series.maximum[k])
        before, at, after = series.time_s[k - 1], series.time_s[k], series.time_s[k + 1]
        assert T0 + 600 - result.step_s <= before < T0 + 600
        assert T0 + 1200 - result.step_s <= after <= T0 + 1200
        assert before < at < after
        assert all(series.time_s[j] < series.time_s[j + 1] for j in range(len(series.time_s) - 1))


# ------------------------------------------------------------------------------------------------ selection


def test_the_gpu_filter_returns_only_the_gpus_asked_for(half_hour: SqliteHistory) -> None:
    both = half_hour.query(["utilization_pct"], T0, T0 + 1800, step_s=1.0)
    second = half_hour.query(["utilization_pct"], T0, T0 + 1800, gpus=[1], step_s=1.0)

    assert set(both.series["utilization_pct"]) == {0, 1}
    assert set(second.series["utilization_pct"]) == {1}
    assert second.series["utilization_pct"][1].mean.tolist() == both.series["utilization_pct"][1].mean.tolist()
    assert half_hour.query(["utilization_pct"], T0, T0 + 1800, gpus=[7]).series == {"utilization_pct": {}}


def test_host_metrics_have_one_series_keyed_none(half_hour: SqliteHistory) -> None:
    result = half_hour.query(["host_cpu_pct", "utilization_pct"], T0, T0 + 1800, gpus=[0], step_s=1.0)

    assert list(result.series) == ["host_cpu_pct", "utilization_pct"]
    assert list(result.series["host_cpu_pct"]) == [None]
    assert_series(result.series["host_cpu_pct"][None], readings_of(HALF_HOUR_TIMES, cpu), 1.0)
    assert list(result.series["utilization_pct"]) == [0]


def test_pcie_bytes_per_s_is_tx_plus_rx(half_hour: SqliteHistory) -> None:
    result = half_hour.query(["pcie_bytes_per_s"], T0, T0 + 1800, step_s=1.0)

    for g in (0, 1):
        assert_series(result.series["pcie_bytes_per_s"][g],
                      readings_of(HALF_HOUR_TIMES, pcie_of(g)), 1.0)


def test_a_range_without_readings_has_no_series(half_hour: SqliteHistory) -> None:
    result = half_hour.query(["utilization_pct", "host_cpu_pct"], T0 - 7 * DAY, T0 - 6 * DAY)

    assert result.series == {"utilization_pct": {}, "host_cpu_pct": {}}


def test_extent_is_the_oldest_and_newest_reading(half_hour: SqliteHistory, tmp_path: Path) -> None:
    assert half_hour.extent() == (T0, T0 + 1799.5)

    empty = tmp_path / "empty.sqlite"
    write(empty, [], gpus=1, interval_s=1.0)
    assert SqliteHistory(empty).extent() is None


# ------------------------------------------------------------------------------------------------ bad requests


Request = tuple[list[str], float, float, float | None]
"""Metrics, start, end and step of a query."""


@pytest.mark.parametrize(("request_", "words"), [
    ((["gpu_util"], T0, T0 + HOUR, None), "unknown metric 'gpu_util'"),
    ((["utilization_pct", "host_gpu_pct"], T0, T0 + HOUR, None), "unknown metric 'host_gpu_pct'"),
    (([], T0, T0 + HOUR, None), "at least one metric"),
    ((["utilization_pct"], T0 + HOUR, T0, None), "start must be before its end"),
    ((["utilization_pct"], T0, T0, None), "start must be before its end"),
    ((["utilization_pct"], T0, math.inf, None), "start must be before its end"),
    ((["utilization_pct"], T0, T0 + HOUR, 0.0), "positive"),
    ((["utilization_pct"], T0, T0 + HOUR, -5.0), "positive"),
    ((["utilization_pct"], T0, T0 + HOUR, math.nan), "positive"),
    ((["utilization_pct"], T0, T0 + 7 * DAY, 1.0), f"more than {MAX_POINTS} points"),
])
def test_a_bad_request_is_a_one_line_value_error(half_hour: SqliteHistory, request_: Request, words: str) -> None:
    metrics, start_s, end_s, step_s = request_
    for ask in (lambda: check_request(metrics, start_s, end_s, step_s),
                lambda: half_hour.query(metrics, start_s, end_s, step_s=step_s)):
        with pytest.raises(ValueError, match=re.escape(words)) as refused:
            ask()
        assert "\n" not in str(refused.value)


def test_a_step_giving_exactly_the_most_points_is_accepted(half_hour: SqliteHistory) -> None:
    result: HistoryResult = half_hour.query(["utilization_pct"], T0, T0 + MAX_POINTS * 0.5, step_s=0.5)

    assert result.resolution == "raw"
    assert len(result.series["utilization_pct"][0].time_s) == len(HALF_HOUR_TIMES)


# ------------------------------------------------------------------------------------------------ ranges


def utc(text: str) -> float:
    """Epoch seconds of a UTC wall-clock time written ``YYYY-MM-DD HH:MM``."""
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M")))


@pytest.fixture
def india_time() -> Iterator[None]:
    """Local time 5 h 30 min ahead of UTC (a POSIX zone string: no time zone database needed)."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "IST-5:30"
    time.tzset()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
        time.tzset()


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("30m", 1800.0), ("1h", 3600.0), ("6h", 21_600.0), ("7d", 604_800.0), ("2w", 1_209_600.0),
    ("1.5h", 5400.0), (" 12h ", 43_200.0), ("24 h", 86_400.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "6", "h", "0h", "0.0d", "-1h", "6x", "6 hours", "1e3s", "six hours"])
def test_parse_duration_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(RangeError) as refused:
        parse_duration(text)
    assert isinstance(refused.value, ValueError)
    assert "\n" not in str(refused.value)


def test_parse_duration_allows_only_the_units_given() -> None:
    assert parse_duration("2d", units="mhd") == 2 * DAY
    with pytest.raises(RangeError):
        parse_duration("30s", units="mhd")


@pytest.mark.parametrize(("text", "seconds"), [
    ("2026-11-21T08:00:00Z", utc("2026-11-21 08:00")),
    ("2026-11-21T08:00:00.250Z", utc("2026-11-21 08:00") + 0.25),
    ("2026-11-21 08:00:00Z", utc("2026-11-21 08:00")),
    ("2026-11-21T08:00:00+02:00", utc("2026-11-21 06:00")),
    ("2026-11-21T08:00-05:00", utc("2026-11-21 13:00")),
    ("1732272442", 1_732_272_442.0),
    ("1732272442.5", 1_732_272_442.5),
    (" 1732272442 ", 1_732_272_442.0),
    ("1732272442123", 1_732_272_442.123),
])
def test_parse_time(text: str, seconds: float) -> None:
    assert parse_time(text) == pytest.approx(seconds, abs=1e-6)


@pytest.mark.usefixtures("india_time")
def test_parse_time_reads_a_time_without_zone_as_local_time() -> None:
    assert parse_time("2026-11-21T08:00:00") == utc("2026-11-21 02:30")
    assert parse_time("2026-11-21 08:00") == utc("2026-11-21 02:30")
    assert parse_time("2026-11-21T08:00:00Z") == utc("2026-11-21 08:00")


@pytest.mark.parametrize("text", ["", "yesterday", "2026-13-01T00:00:00", "nan", "inf", "21/11/2026 08:00"])
def test_parse_time_refuses_what_is_not_a_time(text: str) -> None:
    with pytest.raises(RangeError) as refused:
        parse_time(text)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("text", ["-5", "1e18", "1e15", "0001-01-01", "0001-01-01T00:00:00+14:00",
                                  "9999-12-31T23:59:59-14:00"])
def test_parse_time_refuses_a_time_before_1970_or_after_9999(text: str) -> None:
    with pytest.raises(RangeError, match="out of range"):
        parse_time(text)


NOW = utc("2026-11-22 12:00")


def test_resolve_a_preset_ends_now() -> None:
    assert resolve({"range": "6h"}, NOW) == TimeRange(NOW - 6 * HOUR, NOW, "6h")
    assert resolve({"range": "7d"}, NOW) == TimeRange(NOW - 7 * DAY, NOW, "7d")
    assert resolve({}, NOW, default="30m") == TimeRange(NOW - 1800, NOW, "30m")
    chosen = resolve({"range": "2d"}, NOW)
    assert chosen is not None
    assert chosen.seconds == 2 * DAY


def test_resolve_live_is_none() -> None:
    assert resolve({}, NOW) is None
    assert resolve({"range": "live"}, NOW) is None
    assert resolve({"range": "Live"}, NOW, default="6h") is None


def test_resolve_from_and_to() -> None:
    assert resolve({"from": "2026-11-21T22:00:00Z", "to": "2026-11-22T06:00:00Z"}, NOW) == TimeRange(
        utc("2026-11-21 22:00"), utc("2026-11-22 06:00"), "custom")
    assert resolve({"from": "1795300000", "to": "1795300600000"}, NOW) == TimeRange(
        1_795_300_000.0, 1_795_300_600.0, "custom")
    assert resolve({"from": "2026-11-22T10:00:00Z"}, NOW) == TimeRange(utc("2026-11-22 10:00"), NOW, "custom")
    assert resolve({"range": "custom", "from": "2026-11-22T10:00:00Z"}, NOW, default="6h") == TimeRange(
        utc("2026-11-22 10:00"), NOW, "custom")


@pytest.mark.parametrize(("arguments", "words"), [
    ({"from": "2026-11-22T06:00:00Z", "to": "2026-11-21T22:00:00Z"}, "from is after to"),
    ({"from": "2026-11-22T06:00:00Z", "to": "2026-11-22T06:00:00Z"}, "same moment"),
    ({"from": "2026-11-23T00:00:00Z"}, "from is after to"),
    ({"to": "2026-11-22T06:00:00Z"}, "to= needs from="),
    ({"range": "6h", "from": "2026-11-22T06:00:00Z"}, "not both"),
    ({"range": "fortnight"}, "not a duration"),
    ({"from": "last tuesday"}, "not a time"),
])
def test_resolve_refuses_a_bad_range(arguments: dict[str, str], words: str) -> None:
    with pytest.raises(RangeError) as refused:
        resolve(arguments, NOW)
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)
