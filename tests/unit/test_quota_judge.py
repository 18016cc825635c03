"""Quota findings over time: compute above the quota only when sustained, a quota unused only after a stated time,
and every surface reading the store's judge."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from nvdash.health.quota_judge import SUSTAIN_READINGS, UNUSED_AFTER_S, QuotaJudge, store_findings, watch
from nvdash.health.quotas import QuotaFinding
from nvdash.metrics.collector import ExportOptions, StoreCollector
from nvdash.metrics.counters import default_counters
from nvdash.metrics.exposition import text_format
from nvdash.metrics.quota_families import FINDING_FAMILY as FINDING
from nvdash.sampling.records import HostSample, Snapshot
from nvdash.sampling.usage_records import GpuProcess, Grant, Usage
from nvdash.server.usage_json import processes_json
from nvdash.store import Store
from tests.unit.test_apps_processes import INVENTORY
from tests.unit.test_quotas import GPU0, GPUS, hami, proc


def metric_samples(store: Store, family: str) -> list[tuple[dict[str, str], float]]:
    """``family``'s samples as a scrape of ``store`` gives them (pods on)."""
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, default_counters(), ExportOptions(hostname="node-a", pods=True)))
    text = text_format(registry.collect()).decode()
    return [(sample.labels, sample.value) for parsed in text_string_to_metric_families(text)
            if parsed.name == family for sample in parsed.samples]


def reading(time_s: float, sm: float | None, grants: list[Grant] | None = None,
            processes: list[GpuProcess] | None = None) -> Usage:
    busy = [proc(1, GPU0, "busy", 10, sm=sm)] if sm is not None else []
    return Usage(time_s=time_s, gpus=GPUS, processes=tuple(busy if processes is None else processes),
                 grants=tuple([hami("busy", GPU0, None, core=30.0)] if grants is None else grants))


def kinds(found: tuple[QuotaFinding, ...]) -> list[str]:
    return [f.kind for f in found]


def test_compute_above_the_quota_holds_only_when_sustained_over_three_readings() -> None:
    assert SUSTAIN_READINGS == 3
    judge = QuotaJudge()
    sms = [80.0, 20.0, 80.0, 80.0, 80.0, 90.0, 20.0, 80.0]
    answers = [judge.judge(reading(2.0 * i, sm)) for i, sm in enumerate(sms)]
    held = ["compute_over_quota"]
    assert [kinds(a) for a in answers] == [[], [], [], [], held, held, held, held]
    assert answers[4][0].used == 80.0
    assert answers[5][0].text == ("ml/busy/main keeps 90 % of GPU 0's SM time busy, above its HAMi core quota of "
                                  "30 % (+5 tolerated), for 3 readings or more")
    assert answers[6][0].used == 90.0, "one dip: the last reading above the quota still holds"


def test_a_held_compute_finding_ends_after_three_readings_in_a_row_below() -> None:
    judge = QuotaJudge()
    sms = [80.0, 80.0, 80.0, 20.0, 20.0, 80.0, 20.0, 20.0, 20.0, 80.0]
    answers = [kinds(judge.judge(reading(2.0 * i, sm))) for i, sm in enumerate(sms)]
    held = ["compute_over_quota"]
    assert answers == [[], [], held, held, held, held, held, held, [], []]


def test_a_quota_is_unused_after_ten_minutes_without_a_process_not_nine() -> None:
    assert UNUSED_AFTER_S == 600.0
    idle = [hami("idle", GPU0, 1000)]
    judge = QuotaJudge()
    assert judge.judge(reading(1000.0, None, idle, [])) == ()
    assert judge.judge(reading(1000.0 + 9 * 60, None, idle, [])) == ()
    found = judge.judge(reading(1000.0 + 11 * 60, None, idle, []))
    assert kinds(found) == ["quota_unused"]
    assert found[0].text == "ml/idle/main holds a HAMi quota (1000 MiB) on GPU 0 but runs no process on it for 11 min"
    # A process of the pod restarts the wait, counted from its last reading.
    used = [proc(2, GPU0, "idle", 100)]
    assert judge.judge(reading(2000.0, None, idle, used)) == ()
    assert judge.judge(reading(2000.0 + 9 * 60, None, idle, [])) == ()
    assert kinds(judge.judge(reading(2000.0 + 10 * 60, None, idle, []))) == ["quota_unused"]


def test_a_grant_that_goes_away_and_comes_back_waits_again() -> None:
    idle = [hami("idle", GPU0, 1000)]
    judge = QuotaJudge()
    judge.judge(reading(0.0, None, idle, []))
    judge.judge(reading(300.0, None, [], []))
    assert judge.judge(reading(700.0, None, idle, [])) == ()
    assert kinds(judge.judge(reading(1300.0, None, idle, []))) == ["quota_unused"]


def test_a_reading_is_judged_once_and_an_older_one_only_on_what_needs_no_history() -> None:
    judge = QuotaJudge(sustain_readings=2)
    first, second = reading(1.0, 80.0), reading(2.0, 80.0)
    assert judge.judge(first) == ()
    assert kinds(judge.judge(second)) == ["compute_over_quota"]
    assert kinds(judge.judge(second)) == ["compute_over_quota"], "the same reading, the same answer"
    assert judge.judge(reading(1.5, 80.0)) == ()


def test_the_stores_judge_is_what_processes_json_says() -> None:
    store = Store(INVENTORY, capacity=10)
    watch(store)
    for i in range(SUSTAIN_READINGS):
        store.append(Snapshot(float(i), (), HostSample(), usage=reading(float(i), 80.0)))
        found = store_findings(store, store.latest())
        assert kinds(found) == (["compute_over_quota"] if i == SUSTAIN_READINGS - 1 else [])
        assert [f["kind"] for f in processes_json(store)["quota_findings"]] == kinds(found)
        assert [labels["finding"] for labels, _value in metric_samples(store, FINDING)] == kinds(found)
    bare = Store(INVENTORY, capacity=10)
    bare.append(Snapshot(0.0, (), HostSample(), usage=reading(0.0, 80.0)))
    assert kinds(store_findings(bare, bare.latest())) == ["compute_over_quota"], "no judge: one reading's"
