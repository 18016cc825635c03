"""``/GPU-Processes`` in a real chromium shows a time-sliced GPU's shares: a row per pod (``namespace/pod/container``)
and the ``unattributed`` rest, from a real server whose pods are real processes in kubelet-named cgroups."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from tests.browser.chromium import ARTIFACTS, chromium, open_page, wait_until_drawn
from tests.conftest import get_json, wait_for
from tests.server.kubelet_pods import sleeping
from tests.server.test_shares_e2e import CONTAINER, NAMESPACE, PODS, timesliced_server

ROWS = """
() => {
  const rows = [];
  const visit = (root) => {
    for (const row of root.querySelectorAll(".slick-row")) {
      rows.push([...row.querySelectorAll(".slick-cell")].map((cell) => cell.textContent.trim()));
    }
    for (const el of root.querySelectorAll("*")) if (el.shadowRoot) visit(el.shadowRoot);
  };
  visit(document.body);
  return rows;
}
"""
"""The cells of every data-table row in the page and its shadow roots (Bokeh draws its tables in shadow DOM)."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def test_the_processes_page_shows_each_pods_share_and_the_unattributed_rest(
    browser: Browser, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with sleeping(len(PODS)) as children, timesliced_server(tmp_path, tmp_path_factory, children) as server:
        page, errors = open_page(browser, server.url + "/GPU-Processes", height=1600)
        try:
            wait_until_drawn(page)
            wanted = {f"{NAMESPACE}/{name}/{CONTAINER}" for name in PODS} | {"unattributed"}

            def gpu0_owners() -> set[str]:
                rows: list[list[str]] = page.evaluate(ROWS)
                return {cell for row in rows if "GPU 0" in row for cell in row if cell in wanted}

            try:
                wait_for(gpu0_owners, lambda found: found == wanted, timeout_s=60.0)
            except AssertionError as failure:
                # What the page and the server showed, for the CI log and test-artifacts/.
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "share-table-failure.png"), full_page=True)
                document = get_json(server.url + "/api/processes.json")
                shares = {key: document[key] for key in ("shares", "gpus", "time_s")}
                rows = page.evaluate(ROWS)
                log = server.output()[-4000:]
                raise AssertionError(f"{failure}; rows {rows}; errors {errors}; shares {shares}; server log {log}") \
                    from None
            assert errors == []
        finally:
            page.close()
