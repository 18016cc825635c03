"""GPU time lost to the power cap and to thermal slowdown, accounted per owner from NVML's violation counters.

Expected values follow NVML's definition: ``violationTime`` is the cumulative time (ns, since the driver loaded) the
clocks were held below the requested clocks by a policy; an owner's share is the violation time in the intervals it
held the GPU over the GPU time it held (10 intervals of 1 s with the counter rising 0.14 s each: 14 %).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from nvdash.accounting.accountant import Accountant
from nvdash.accounting.attribution import Owner, Share
from nvdash.accounting.ledger import Ledger, Tally
from nvdash.accounting.report import AccountingBook, Report, make_report, report_csv, report_json, report_table
from nvdash.accounting.summary import summarize
from nvdash.apps.accounting_table import totals_html
from nvdash.history.ranges import TimeRange
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from nvdash.sampling.usage_records import Usage

NS = 1_000_000_000
T0 = 1_790_000_000.0 - 1_790_000_000.0 % 3600.0  # the start of an hour
POD_A = Owner("pod", "ml/a", "unknown", "ml")
POD_B = Owner("pod", "ml/b", "unknown", "ml")


class Names:
    def user(self, uid: int) -> str | None:
        return {1000: "alice"}.get(uid)

    def group_of(self, user: str) -> str | None:
        return "physics" if user == "alice" else None


def gpu(power_ns: int | None, thermal_ns: int | None = 0, *, lost: bool = False) -> GpuSample:
    if lost:
        return GpuSample(index=0, lost=True)
    return GpuSample(index=0, utilization_pct=100.0, memory_used_bytes=1 << 30, energy_mj=0,
                     violation_power_ns=power_ns, violation_thermal_ns=thermal_ns)


def snapshot(time_s: float, sample: GpuSample) -> Snapshot:
    return Snapshot(time_s=time_s, gpus=(sample,), host=HostSample(), usage=Usage(time_s=T0))


def job_4242(tmp_path: Path) -> Accountant:
    """An accountant whose job-mapping directory gives GPU 0 to Slurm job 4242 (alice)."""
    (tmp_path / "0").write_text("4242 1000\n")
    return Accountant({0: "GPU-a"}, job_mapping_dir=tmp_path, names=Names())


def cell(table: str, column: str) -> str:
    """The first row's cell under ``column`` of ``nvdash report``'s aligned table."""
    header, first = table.splitlines()[1:3]
    start = header.index(column)
    return first[start:].split("  ")[0].strip()


def report_of(accountant: Accountant, by: str = "job") -> Report:
    return make_report(AccountingBook(accountant, clock=lambda: T0 + 3000), TimeRange(T0, T0 + 3000, "1h"), by)


def test_a_job_loses_the_share_of_its_gpu_time_the_counters_rose_by(tmp_path: Path) -> None:
    accountant = job_4242(tmp_path)
    start_power, start_thermal = 7 * NS, 3 * NS  # counted since the driver loaded, before the job
    for second in range(11):  # 10 intervals of 1 s: power +0.14 s, thermal +0.03 s each
        accountant.step(snapshot(T0 + second, gpu(start_power + second * 140_000_000,
                                                  start_thermal + second * 30_000_000)))
    [row] = summarize(accountant.tallies(), "job")
    assert row.key == "4242"
    assert row.total.allocated_s == pytest.approx(10.0)
    assert row.total.power_cap_s == pytest.approx(1.4)
    assert row.total.power_cap_pct == pytest.approx(14.0)
    assert row.total.thermal_s == pytest.approx(0.3)
    assert row.total.thermal_pct == pytest.approx(3.0)
    [user] = summarize(accountant.tallies(), "user")
    assert (user.key, user.total.power_cap_pct) == ("alice", pytest.approx(14.0))

    report = report_of(accountant)
    [data] = report_json(report)["rows"]
    assert (data["power_cap_s"], data["power_cap_known_s"], data["power_cap_pct"]) == (1.4, 10.0, 14.0)
    assert (data["thermal_s"], data["thermal_known_s"], data["thermal_pct"]) == (0.3, 10.0, 3.0)
    [line] = list(csv.DictReader(io.StringIO(report_csv(report))))
    assert (line["power_cap_s"], line["power_cap_pct"], line["thermal_s"], line["thermal_pct"]) == (
        "1.4", "14.0", "0.3", "3.0")
    text = report_table(report)
    assert (cell(text, "POWER-CAP%"), cell(text, "THERMAL%")) == ("14.0", "3.0")
    assert "job 4242 lost 14.0 % of its GPU time to the power cap (1.4 of 10.0 GPU-seconds)" in text
    assert "thermal slowdown" not in text, "3 % is under the 5 % threshold: no sentence"


def test_the_sentence_names_hours_and_each_policy_at_or_over_five_percent() -> None:
    hour = 3600.0
    tallies = [(Owner("slurm", "4242", "alice", "physics"), 0,
                Tally(start_s=T0, end_s=T0 + hour, allocated_s=hour, power_cap_s=0.14 * hour, power_cap_known_s=hour,
                      thermal_s=0.05 * hour, thermal_known_s=hour)),
               (Owner("pod", "ml/a", "unknown", "ml"), 1,
                Tally(start_s=T0, end_s=T0 + hour, allocated_s=hour, power_cap_s=0.049 * hour,
                      power_cap_known_s=hour, thermal_known_s=0.0))]
    text = report_table(Report(TimeRange(T0, T0 + hour, "1h"), "job", summarize(tallies, "job"), "history"))
    notes = [line for line in text.splitlines() if " lost " in line and not line.startswith("total:")]
    assert notes == ["job 4242 lost 14.0 % of its GPU time to the power cap (0.14 of 1.00 GPU-hours)",
                     "job 4242 lost 5.0 % of its GPU time to thermal slowdown (0.05 of 1.00 GPU-hours)"]
    by_user = report_table(Report(TimeRange(T0, T0 + hour, "1h"), "user", summarize(tallies, "user"), "history"))
    assert "user alice lost 14.0 % of its GPU time to the power cap" in by_user


def test_counters_going_back_are_not_attributed_and_a_jump_is_clamped_to_the_interval() -> None:
    ledger = Ledger()
    share = Share(0, "GPU-a", 1.0, POD_A, None, 100.0, None)
    ledger.step(0.0, [gpu(50 * NS, 50 * NS)], [])
    ledger.step(1.0, [gpu(50 * NS + 200_000_000, 50 * NS)], [share])  # 0.2 s of 1 s
    ledger.step(2.0, [gpu(100_000_000, 0)], [share])  # the driver reloaded: both counters restarted
    ledger.step(3.0, [gpu(300_000_000, 5 * NS)], [share])  # +0.2 s; thermal +5 s in a 1 s interval: clamped to 1 s
    tally = ledger.tallies[(POD_A, 0, 0.0)]
    assert tally.allocated_s == pytest.approx(3.0)
    assert (tally.power_cap_s, tally.power_cap_known_s) == pytest.approx((0.4, 2.0)), "the reload's interval: none"
    assert tally.power_cap_pct == pytest.approx(20.0)
    assert (tally.thermal_s, tally.thermal_known_s) == pytest.approx((1.0, 2.0))
    assert tally.thermal_pct == pytest.approx(50.0)


def test_an_unknown_counter_makes_the_share_unknown_never_zero(tmp_path: Path) -> None:
    accountant = job_4242(tmp_path)
    for second in range(4):
        accountant.step(snapshot(T0 + second, gpu(None, None)))
    [row] = summarize(accountant.tallies(), "job")
    assert row.total.allocated_s == pytest.approx(3.0)
    assert (row.total.power_cap_pct, row.total.thermal_pct) == (None, None)
    [data] = report_json(report_of(accountant))["rows"]
    for policy in ("power_cap", "thermal"):
        assert (data[f"{policy}_s"], data[f"{policy}_known_s"], data[f"{policy}_pct"]) == (None, 0.0, None)
    [line] = list(csv.DictReader(io.StringIO(report_csv(report_of(accountant)))))
    assert (line["power_cap_pct"], line["thermal_pct"]) == ("", "")
    text = report_table(report_of(accountant))
    assert (cell(text, "POWER-CAP%"), cell(text, "THERMAL%")) == ("-", "-")
    assert json.loads(json.dumps(report_json(report_of(accountant))))["rows"][0]["power_cap_pct"] is None


def test_a_lost_reading_leaves_both_neighbouring_intervals_unknown() -> None:
    ledger = Ledger()
    share = Share(0, "GPU-a", 1.0, POD_A, None, 100.0, None)
    ledger.step(0.0, [gpu(0)], [])
    ledger.step(1.0, [gpu(100_000_000)], [share])
    ledger.step(2.0, [gpu(None, lost=True)], [])
    ledger.step(3.0, [gpu(900_000_000)], [share])  # not compared across the lost reading
    ledger.step(4.0, [gpu(1_000_000_000)], [share])
    tally = ledger.tallies[(POD_A, 0, 0.0)]
    assert tally.allocated_s == pytest.approx(3.0)
    assert (tally.power_cap_s, tally.power_cap_known_s) == pytest.approx((0.2, 2.0))
    assert tally.power_cap_pct == pytest.approx(10.0)


def test_pods_time_slicing_a_gpu_each_lose_the_gpus_share_and_its_seconds_count_once() -> None:
    ledger = Ledger()
    shares = [Share(0, "GPU-a", 0.5, POD_A, None, 100.0, None, allocated=True),
              Share(0, "GPU-a", 0.5, POD_B, None, 100.0, None, allocated=True)]
    ledger.step(0.0, [gpu(0, 0)], [])
    for second in range(1, 11):  # the device-wide counter, the same for both pods: +0.14 s per second
        ledger.step(float(second), [gpu(second * 140_000_000, 0)], shares)
    a, b = ledger.tallies[(POD_A, 0, 0.0)], ledger.tallies[(POD_B, 0, 0.0)]
    assert (a.power_cap_pct, b.power_cap_pct) == pytest.approx((14.0, 14.0))
    assert a.power_cap_s + b.power_cap_s == pytest.approx(1.4), "the GPU's 1.4 s, counted once"
    [namespace] = summarize([(POD_A, 0, a), (POD_B, 0, b)], "namespace")
    assert (namespace.total.power_cap_s, namespace.total.power_cap_pct) == pytest.approx((1.4, 14.0))


def test_mig_instances_take_their_part_of_the_whole_gpus_violation_time() -> None:
    ledger = Ledger()
    shares = [Share(0, "MIG-3g", 3 / 7, POD_A, None, 100.0, None), Share(0, "MIG-1g", 1 / 7, POD_B, None, 50.0, None)]
    ledger.step(0.0, [gpu(0, 0)], [])
    ledger.step(1.0, [gpu(700_000_000, 0)], shares)  # 0.7 s of the GPU's 1 s
    a, b = ledger.tallies[(POD_A, 0, 0.0)], ledger.tallies[(POD_B, 0, 0.0)]
    assert (a.power_cap_s, b.power_cap_s) == pytest.approx((0.3, 0.1))
    assert (a.power_cap_pct, b.power_cap_pct) == pytest.approx((70.0, 70.0))
    assert (a.thermal_pct, b.thermal_pct) == pytest.approx((0.0, 0.0)), "read and not rising: 0, not unknown"


def test_the_range_totals_add_the_seconds_lost_over_the_seconds_read_and_say_unknown_when_none_was() -> None:
    """The range's share lost is the rows' lost seconds summed over the rows' known seconds summed (11 %), not the
    mean of the rows' shares (9.5 %) nor a share of all allocated seconds (9.9 %)."""
    hour = 3600.0
    capped = Tally(start_s=T0, end_s=T0 + hour, allocated_s=hour, power_cap_s=504.0, power_cap_known_s=hour,
                   thermal_s=180.0, thermal_known_s=hour)  # 14 % and 5 %
    half = Tally(start_s=T0, end_s=T0 + hour, allocated_s=1800.0, power_cap_s=90.0, power_cap_known_s=1800.0)
    unread = Tally(start_s=T0, end_s=T0 + hour, allocated_s=600.0)  # no counter read: counts in no share
    tallies = [(Owner("slurm", "4242", "alice", "physics"), 0, capped), (POD_A, 1, half),
               (Owner("user", "bob", "bob", "bob"), 2, unread)]
    report = Report(TimeRange(T0, T0 + hour, "1h"), "job", summarize(tallies, "job"), "history")
    summed = report_json(report)["totals"]
    assert summed["gpu_hours"] == pytest.approx(6000 / hour)
    assert (summed["power_cap_s"], summed["power_cap_known_s"], summed["power_cap_pct"]) == (594.0, 5400.0, 11.0)
    assert (summed["thermal_s"], summed["thermal_known_s"], summed["thermal_pct"]) == (180.0, 3600.0, 5.0)
    total_line = next(line for line in report_table(report).splitlines() if line.startswith("total:"))
    assert total_line == ("total: 1.67 GPU-hours, 0.00 busy, 0.00 wasted, 0.000 kWh; lost to throttling: "
                          "power cap 11.0 % (0.17 of 1.50 GPU-hours), thermal 5.0 % (0.05 of 1.00 GPU-hours)")
    assert totals_html(report) == (
        "<b>Range totals:</b> 1.667 GPU-hours · 0.000 busy · 0.000 wasted · 0.000 kWh (* energy counted over part of"
        " the time only)<br>Lost to throttling: power cap 11.0 % (0.17 of 1.50 GPU-hours) · thermal 5.0 % (0.05 of"
        " 1.00 GPU-hours)")

    read_none = Report(TimeRange(T0, T0 + hour, "1h"), "job", summarize(tallies[2:], "job"), "history")
    summed = json.loads(json.dumps(report_json(read_none)))["totals"]
    assert (summed["power_cap_s"], summed["power_cap_known_s"], summed["power_cap_pct"]) == (None, 0.0, None)
    assert (summed["thermal_s"], summed["thermal_known_s"], summed["thermal_pct"]) == (None, 0.0, None)
    total_line = next(line for line in report_table(read_none).splitlines() if line.startswith("total:"))
    assert total_line.endswith(" kWh; lost to throttling: power cap -, thermal -")
    assert totals_html(read_none).endswith("<br>Lost to throttling: power cap - · thermal -")
    nothing = Report(TimeRange(T0, T0 + hour, "1h"), "job", [], "history")
    assert report_json(nothing)["totals"]["power_cap_pct"] is None, "an empty range: unknown, not 0"


def test_range_totals_of_counters_read_that_never_rose_are_zero_not_unknown() -> None:
    calm = Tally(start_s=T0, end_s=T0 + 10, allocated_s=10.0, power_cap_known_s=10.0, thermal_known_s=10.0)
    report = Report(TimeRange(T0, T0 + 10, "1h"), "job", summarize([(POD_A, 0, calm)], "job"), "history")
    summed = report_json(report)["totals"]
    assert (summed["power_cap_s"], summed["power_cap_pct"], summed["thermal_s"], summed["thermal_pct"]) == (
        0.0, 0.0, 0.0, 0.0)
    assert "lost to throttling: power cap 0.0 % (0.0 of 10.0 GPU-seconds), thermal 0.0 % (0.0 of 10.0 GPU-seconds)" \
        in report_table(report)


def test_gpu_time_under_an_hour_is_written_in_seconds_so_the_share_can_be_checked_against_it() -> None:
    """19.5 s of 291.6 s is 6.7 %; in hours to two decimals it would read 0.01 of 0.08 (12.5 %)."""
    short = Tally(start_s=T0, end_s=T0 + 300, allocated_s=291.6, power_cap_s=19.5, power_cap_known_s=291.6)
    report = Report(TimeRange(T0, T0 + 300, "1h"), "job", summarize([(POD_A, 0, short)], "job"), "history")
    assert totals_html(report).endswith(": power cap 6.7 % (19.5 of 291.6 GPU-seconds) · thermal -")
    assert "pod ml/a lost 6.7 % of its GPU time to the power cap (19.5 of 291.6 GPU-seconds)" in report_table(report)
