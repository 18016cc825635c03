"""The readings of issue 22 reach ``/api/snapshot.json`` of a simulated server: limits, video engines, throttle time."""

from __future__ import annotations

from typing import Any

from tests.conftest import get_json, nvdash_server, wait_for

CAPPED_GPU = 2
"""dgx-a100's GPU capped out of band at 300 W below its 400 W management limit (the profile's scenario)."""


def _gpu(doc: Any, index: int) -> Any:
    return next(gpu for gpu in doc["gpus"] if gpu["index"] == index)


def test_snapshot_carries_limits_video_and_violation_time() -> None:
    with nvdash_server(["--simulate", "dgx-a100", "--interval", "0.25"]) as server:
        url = server.url + "/api/snapshot.json"
        first = wait_for(lambda: get_json(url), lambda d: _gpu(d, CAPPED_GPU).get("violation_power_ns") is not None)
        capped = _gpu(first, CAPPED_GPU)
        assert (capped["power_limit_w"], capped["power_management_limit_w"]) == (300.0, 400.0)
        assert (_gpu(first, 0)["power_limit_w"], _gpu(first, 0)["power_management_limit_w"]) == (400.0, 400.0)
        assert capped["encoder_utilization_pct"] is None, "A100 has no NVENC"
        assert capped["decoder_utilization_pct"] == 0.0, "it has NVDEC, idle in this job"
        assert capped["violation_reliability_ns"] is None, "not counted before Hopper"
        assert capped["gpm_fp64_active_pct"] is None, "GPM is Hopper and later"
        assert capped["nvlink_crc_flit_errors"] == 0
        before = capped["violation_power_ns"]
        later = wait_for(lambda: get_json(url), lambda d: _gpu(d, CAPPED_GPU)["violation_power_ns"] > before)
        assert _gpu(later, CAPPED_GPU)["violation_power_ns"] > before, "held at the cap: the counter runs"
