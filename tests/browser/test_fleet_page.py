"""/Cluster-Fleet in a real chromium behind ``--prefix``, over the real Prometheus of the fleet server test: the
worst node first, and its link opens that node's page under the prefix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.browser.chromium import artifact, chromium, open_page
from tests.conftest import wait_for
from tests.server.test_cluster_fleet import PREFIX, Fleet, fleet

pytestmark = pytest.mark.browser
__all__ = ["fleet"]

NODES_JS = """
() => {
  for (const model of Bokeh.documents[0]._all_models.values()) {
    if (model.type === "DataTable" && model.source.data.link !== undefined) return Array.from(model.source.data.node);
  }
  return [];
}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


def test_the_fleet_page_lists_the_worst_first_and_links_to_the_node(fleet: Fleet, browser: Browser) -> None:
    page, errors = open_page(browser, fleet.central.url + "/Cluster-Fleet", 1500, 700)
    try:
        page.get_by_text("4 nodes, 8 GPUs").wait_for(timeout=60_000)
        wait_for(lambda: page.evaluate(NODES_JS), lambda nodes: nodes == ["node-c", "node-b", "node-d", "node-a"],
                 timeout_s=60.0)
        page.get_by_text("nodes with fewer GPUs than a day ago").wait_for(timeout=60_000)
        page.screenshot(path=str(artifact("cluster-fleet.png")), full_page=True)
        page.get_by_role("link", name="node-c").click()
        wait_for(lambda: page.url, lambda url: url.endswith(f"{PREFIX}/Cluster-Nodes?node=node-c"), timeout_s=30.0)
        page.get_by_text("4 nodes, 8 GPUs").wait_for(timeout=60_000)
        wait_for(page.locator("select").first.input_value, lambda value: value == "node-c", timeout_s=60.0)
    finally:
        page.close()
    assert errors == []
