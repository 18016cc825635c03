"""The pod view of /Cluster-Pods in a real chromium, over a real Prometheus backfilled with a week of pods' shares:
filter by GPU type, see the pod over its quota flagged, choose a pod, read its 7-day timeline, and reopen the same
view from the URL."""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from tests.browser.chromium import artifact, chromium, open_page
from tests.browser.test_cluster_pages import ROWS_JS, TABLES_JS
from tests.conftest import NvdashServer, nvdash_server, wait_for
from tests.prometheus_backfill import PODS, backfilled_prometheus, expected

pytestmark = pytest.mark.browser

WEEK_S = 7 * 86_400.0
INFER = next(index for index, pod in enumerate(PODS) if pod.pod == "infer")


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NvdashServer, float]]:
    now = time.time()
    with backfilled_prometheus(tmp_path_factory.mktemp("backfill"), now) as url, \
            nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url]) as server:
        yield server, now


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def _pod_table(page: Page) -> dict[str, list[object]]:
    tables = page.evaluate(TABLES_JS)
    return dict(tables[0]) if tables else {}


def _address(page: Page) -> str:
    return str(page.evaluate("window.location.href"))


def _timeline(page: Page) -> dict[str, list[float]] | None:
    found = page.evaluate(ROWS_JS, "sm_gpus")
    return None if found is None else {key: [float(v) for v in values] for key, values in found.items()}


def _check_week(timeline: dict[str, list[float]], now: float) -> None:
    """The drawn points cover the last 7 days in 30-minute steps and hold the backfilled sums exactly."""
    times = [value / 1000.0 for value in timeline["time"]]
    assert 336 <= len(times) <= 338
    assert times[-1] - times[0] >= WEEK_S - 3600.0
    assert times[0] <= now - WEEK_S + 1800.0
    checked = 0
    for start, sm, memory in zip(times, timeline["sm_gpus"], timeline["memory_bytes"], strict=True):
        want_sm, want_memory = expected(INFER, start, start + 1800.0, now)
        if math.isnan(want_sm):
            assert math.isnan(sm)
            continue
        assert sm == pytest.approx(want_sm, abs=1e-9)
        assert memory == pytest.approx(want_memory, rel=1e-12)
        checked += 1
    # Three series summed: the server on two GPUs and its sidecar, 0.05 + 0.15 + 0.25 GPU at least.
    assert checked >= 330
    assert min(value for value in timeline["sm_gpus"] if not math.isnan(value)) >= 0.45


def test_the_pod_view_filters_by_gpu_type_and_draws_a_pods_week_from_prometheus(
        view: tuple[NvdashServer, float], browser: Browser, tmp_path: Path) -> None:
    server, now = view
    page, errors = open_page(browser, server.url + "/Cluster-Pods?range=7d", 1400, 1300)
    try:
        page.get_by_text("6 pods hold 7 GPU devices on 3 nodes").wait_for(timeout=60_000)
        table = wait_for(lambda: _pod_table(page), lambda found: len(found.get("pod", [])) == 7, timeout_s=60.0)
        # The quota finding flags its pod, and only it, in a column of its own.
        flags = dict(zip(table["pod"], table["flags"], strict=True))
        assert flags.pop("vjob") == "\u2691 memory over quota"
        assert set(flags.values()) == {""}
        assert dict(zip(table["pod"], table["quota"], strict=True))["vjob"] == "30 % · 4.0 GiB"
        flagged = page.locator(".slick-row", has_text="\u2691 memory over quota")
        flagged.wait_for(timeout=30_000)
        assert flagged.count() == 1
        assert "vjob" in flagged.inner_text()
        # MPS apart from time-slicing: only the two MPS pods.
        page.locator("select").nth(0).select_option(label="MPS")
        table = wait_for(lambda: _pod_table(page), lambda found: sorted(set(found.get("pod", []))) == [
            "infer", "ranker"], timeout_s=30.0)
        assert set(table["kind"]) == {"MPS"}
        pods = page.locator("select").nth(2)
        wait_for(lambda: pods.locator("option").all_text_contents(),
                 lambda labels: labels == ["every pod", "serving/infer", "serving/ranker"], timeout_s=30.0)
        # Choosing a pod picks its namespace, and all three land in the URL.
        pods.select_option(label="serving/infer")
        # The address as the browser has it now (Playwright's page.url follows replaceState only between calls).
        wait_for(lambda: urllib.parse.parse_qs(urllib.parse.urlparse(_address(page)).query),
                 lambda query: query == {"range": ["7d"], "kind": ["mps"], "namespace": ["serving"],
                                         "pod": ["infer"]}, timeout_s=30.0)
        timeline = wait_for(lambda: _timeline(page), lambda found: found is not None and len(found["time"]) > 300,
                            timeout_s=60.0)
        assert timeline is not None
        _check_week(timeline, now)
        page.get_by_text("last 7 d · 30 min buckets", exact=True).wait_for(timeout=30_000)
        shot = artifact("cluster-pod-view.png")
        page.screenshot(path=str(shot), full_page=True)
        # The bookmark reopens the same view.
        bookmark = _address(page)
        page.goto(bookmark)
        wait_for(lambda: [page.locator("select").nth(n).input_value() for n in range(3)],
                 lambda values: values == ["MPS", "serving", "infer"], timeout_s=60.0)
        again = wait_for(lambda: _timeline(page), lambda found: found is not None and len(found["time"]) > 300,
                         timeout_s=60.0)
        assert again is not None
        _check_week(again, now)
        assert _address(page) == bookmark
    finally:
        page.close()
    assert errors == []
