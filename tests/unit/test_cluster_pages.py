"""The cluster pages when Prometheus does not answer: they build, say so, and keep asking.

The pages over a real Prometheus are tested in ``tests/browser/test_cluster_pages.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from bokeh.document import Document
from bokeh.models.widgets import Div, Select

from nvdash.apps import APPS, AppSpec, Requirement
from nvdash.apps.cluster_view import POLL_MS
from nvdash.cluster import open_cluster
from tests.unit.test_apps import make_ctx


def texts(doc: Document) -> list[str]:
    return [str(model.text) for model in doc.models if isinstance(model, Div)]


@pytest.mark.parametrize("spec", [spec for spec in APPS
                                  if spec.requires in (Requirement.PROMETHEUS, Requirement.POD_HISTORY)
                                  and spec.route != "/Cluster-Accounting"],  # asks on demand, not the poller
                         ids=lambda spec: spec.route)
def test_cluster_pages_say_prometheus_is_down_and_poll_it(spec: AppSpec, closed_port: int) -> None:
    cluster = open_cluster(f"http://127.0.0.1:{closed_port}", timeout_s=1.0)
    try:
        ctx = replace(make_ctx(rows=()), cluster=cluster)
        doc = Document()
        spec.build(doc, ctx)
        assert doc.title == spec.title
        assert any("waiting for its first answer" in text for text in texts(doc))
        cluster.poller.refresh()  # what the poller's thread does
        (poll,) = [callback for callback in doc.session_callbacks if getattr(callback, "period", None) == POLL_MS]
        poll.callback()
        (status,) = [text for text in texts(doc) if "Prometheus" in text][:1]
        assert "Prometheus down or slow:" in status
        assert "Connection refused" in status
        assert "retrying every 5 s" in status
        if spec.route == "/Cluster-Nodes":
            select = next(model for model in doc.models if isinstance(model, Select))
            assert select.options == ["(no node yet)"]
    finally:
        cluster.close()
