"""An NVLink sum missing some links is shown as partial, not as a silently smaller number."""

from __future__ import annotations

from nvdash.apps import nvlink_throughput
from nvdash.sampling.records import Snapshot
from tests.unit.test_apps import INVENTORY, ROWS, built, gpu, host, make_ctx, tick, values


def test_partial_nvlink_reading_is_labelled_partial() -> None:
    partial_row = Snapshot(1003.0, (
        gpu(0, 99.0, 40, 80, nvlink_tx_bytes_per_s=200e9, nvlink_rx_bytes_per_s=100e9, nvlink_partial=True),
        gpu(1, 1.0, 20, 40, nvlink_tx_bytes_per_s=1e9, nvlink_rx_bytes_per_s=2e9),
        gpu(2, 44.0, 12, 24),
    ), host(50.0, 20))
    ctx = make_ctx(INVENTORY, ROWS)
    doc, source = built(nvlink_throughput.build, ctx)
    assert values(source, "note") == ["", ""]
    ctx.store.append(partial_row)
    tick(doc)
    assert values(source, "note") == ["partial", ""]
    assert values(source, "tx_text")[0] == (
        "200.0 GB/s of 450.0 GB/s data rate (44 %) (partial: some links did not answer)")
    assert values(source, "tx_text")[1] == "1.0 GB/s of 300.0 GB/s data rate (0 %)"
