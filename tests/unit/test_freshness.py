"""Staleness: when a part counts as stuck, how the time is written, and one report of several."""

from __future__ import annotations

import time

from nvdash.freshness import Stale, banner_text, is_stale, iso_time, merge, stale_since


def test_a_part_is_stale_after_three_of_its_rounds_without_one_and_five_seconds() -> None:
    assert not is_stale(6.0, 2.0)
    assert is_stale(6.01, 2.0)
    assert not is_stale(5.0, 0.5), "a few late sweeps on a busy machine are not a stuck sampler"
    assert is_stale(5.01, 0.5)
    assert stale_since(100.0, 106.0, 2.0) is None
    assert stale_since(100.0, 106.1, 2.0) == 100.0
    assert stale_since(None, 1e9, 0.5) is None  # nothing read yet: nothing frozen on show


def test_times_are_written_in_utc_and_the_servers_local_time() -> None:
    assert iso_time(0.0) == "1970-01-01T00:00:00Z"
    assert iso_time(1_795_761_826.9) == "2026-11-27T06:43:46Z"
    at = 1_795_761_826.0
    assert banner_text(at) == f"no new readings since {time.strftime('%H:%M:%S', time.localtime(at))}"


def test_merge_names_each_part_once_with_its_earliest_time() -> None:
    sampler = [Stale("sampler", 100.0), Stale("processes", 90.0)]
    threads = [Stale("sampler", 99.0), Stale("history-writer", 50.0)]
    assert merge(sampler, threads) == [Stale("history-writer", 50.0), Stale("processes", 90.0),
                                       Stale("sampler", 99.0)]
    assert merge([], []) == []
