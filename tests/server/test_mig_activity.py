"""MIG instances' activity (GPM per GPU instance) on a real server: ``/api/processes.json`` and ``/metrics``.

The simulated ``h100-mig`` node: GPU 0 in MIG mode with H100 80GB profiles (3g.40gb GI 2, 2g.20gb GI 3, 1g.10gb GI 9
and GI 10). The fake defines an instance's work as the GPU's job times ``min(1, sum of sm_share)`` of its processes:
GI 2 0.85, GI 3 0.5, GI 9 1.0, GI 10 (no process) 0, so the empty instance reads exactly 0 and the others are busy
whenever the GPU's job is.
"""

from __future__ import annotations

from typing import Any

from tests.conftest import get_json, nvdash_server, wait_for
from tests.server.test_metrics_mig_pods import Families, read

MiB = 1024 * 1024
PROFILES = {2: "3g.40gb", 3: "2g.20gb", 9: "1g.10gb", 10: "1g.10gb"}
MEMORY_MIB = {"3g.40gb": 40448, "2g.20gb": 20096, "1g.10gb": 9984}
"""``nvidia-smi mig -lgip`` on an H100 80GB HBM3: 39.50, 19.62 and 9.75 GiB."""


def _instances(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    gpu = doc["gpus"][0] if doc.get("gpus") else None
    mig = gpu["mig"] if gpu is not None else None
    return {} if mig is None else {i["gpu_instance_id"]: i for i in mig["instances"]}


def _busy(doc: dict[str, Any]) -> bool:
    found = _instances(doc)
    return len(found) == 4 and all(
        i["sm_active_pct"] is not None and (i["sm_active_pct"] > 0) == (gi != 10) for gi, i in found.items()
    )


def _metrics_busy(families: Families) -> bool:
    series = {labels.get("GPU_I_ID"): value for labels, value in families.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE", [])
              if labels["gpu"] == "0"}
    return {"2", "3", "9", "10"} <= set(series) and all(series[gi] > 0 for gi in ("2", "3", "9"))


def test_mig_instances_on_h100_report_their_activity() -> None:
    args = ["--simulate", "h100-mig", "--interval", "0.25", "--process-interval", "0.5", "--no-history"]
    with nvdash_server(args) as server:
        doc = wait_for(lambda: get_json(server.url + "/api/processes.json"), _busy, timeout_s=60.0)
        instances = _instances(doc)
        assert {gi: i["profile"] for gi, i in instances.items()} == PROFILES
        for i in instances.values():
            assert i["memory_total_bytes"] == MEMORY_MIB[i["profile"]] * MiB
            assert 0 <= i["sm_active_pct"] <= 100
            assert 0 <= i["gpm_sm_active_pct"] <= 100
        assert instances[10]["sm_active_pct"] == 0.0  # no process in it: the fake gives it no work
        assert instances[10]["gpm_sm_active_pct"] == 0.0
        assert doc["gpus"][1]["mig"]["instances"] == []

        families = wait_for(lambda: read(server), _metrics_busy, timeout_s=60.0)
        active = {labels["GPU_I_ID"]: (labels, value) for labels, value in families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
                  if labels["gpu"] == "0" and "GPU_I_ID" in labels}
        assert {gi: labels["GPU_I_PROFILE"] for gi, (labels, _) in active.items()} == {
            str(gi): profile for gi, profile in PROFILES.items()}
        assert active["10"][1] == 0.0
        assert all(0 < value <= 1 for gi, (_, value) in active.items() if gi != "10")
        sm = {labels["GPU_I_ID"]: value for labels, value in families["DCGM_FI_PROF_SM_ACTIVE"]
              if labels["gpu"] == "0" and "GPU_I_ID" in labels}
        assert set(sm) == {"2", "3", "9", "10"}
        assert sm["10"] == 0.0
        assert all(0 <= value <= 1 for value in sm.values())
