"""``/api/snapshot.json`` and the XID path on a real server, plus shutdown with a hung NVML call."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, get_json, http_get, nvdash_env, nvdash_server, wait_for


def test_snapshot_has_every_gpu_with_units_in_names() -> None:
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25"]) as server:
        url = server.url + "/api/snapshot.json"
        doc = wait_for(lambda: get_json(url), lambda d: d["gpus"][0].get("power_w") is not None
                        and d["gpus"][0].get("pcie_rx_bytes_per_s") is not None)
        assert doc["hostname"]
        assert doc["simulated"] == "dgx-h100"
        assert len(doc["gpus"]) == 8
        gpu = doc["gpus"][0]
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"
        assert gpu["uuid"].startswith("GPU-")
        assert 0 < gpu["memory_used_bytes"] <= gpu["memory_total_bytes"]
        assert gpu["memory_reserved_bytes"] > 0
        assert 0 < gpu["power_w"] <= gpu["power_limit_w"]
        assert 0 < gpu["temperature_c"] < gpu["temperature_slowdown_c"] < gpu["temperature_shutdown_c"]
        assert 0 < gpu["clock_sm_mhz"] <= gpu["clock_sm_max_mhz"]
        assert gpu["energy_mj"] > 0
        assert gpu["nvlink_version"] == "4.0"
        assert isinstance(gpu["clock_event_reason_names"], list)
        assert gpu["health"]["status"] in ("ok", "warning", "critical")
        assert doc["host"]["cpu_count"] >= 1
        assert doc["topology"][0][0] == "X"
        assert len(doc["topology"]) == 8


def test_unsupported_readings_are_null_not_zero() -> None:
    with nvdash_server(["--simulate", "t4", "--interval", "0.25"]) as server:
        url = server.url + "/api/snapshot.json"
        doc = wait_for(lambda: get_json(url), lambda d: d["gpus"][0].get("utilization_pct") is not None)
        (gpu,) = doc["gpus"]
        assert gpu["power_w"] is None, "the T4 profile reports no power"
        assert gpu["nvlink_tx_bytes_per_s"] is None
        assert gpu["gpm_sm_active_pct"] is None
        assert gpu["gpm_supported"] is False
        assert gpu["memory_temperature_c"] is None, "GDDR6 reports no memory temperature"


def test_an_xid_reaches_the_snapshot_and_health() -> None:
    env = {"NVDASH_FAKE_FAULTS": "xid:79:5@2;lose:5@2"}
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25"], env=env) as server:
        url = server.url + "/api/snapshot.json"
        doc = wait_for(lambda: get_json(url), lambda d: any(e["code"] == 79 for e in d["events"])
                        and d["gpus"][5]["lost"])
        event = next(e for e in doc["events"] if e["code"] == 79)
        assert (event["kind"], event["gpu"]) == ("xid", 5)
        assert "bus" in event["meaning"].lower()
        assert event["action"]
        health = doc["gpus"][5]["health"]
        assert health["status"] == "critical"
        assert any("XID 79" in reason["text"] for reason in health["reasons"])
        assert all(doc["gpus"][i]["utilization_pct"] is not None for i in range(8) if i != 5)
        assert get_json(server.url + "/health")["xid_events"] == "watching"


SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)


def _pending_signals(pid: int) -> int:
    """The signals sent to ``pid`` and not yet handled (``/proc``): the stack dump is written once SIGUSR1 is not."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
              if ":" in line)
    return int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)


def test_a_hung_nvml_call_neither_stalls_the_sweeps_nor_the_shutdown() -> None:
    port = free_port()
    env = nvdash_env({"NVDASH_FAKE_FAULTS": "slow:nvmlDeviceGetUtilizationRates:3600:2@1"})
    command = [sys.executable, "-m", "nvdash", "--port", str(port), "--simulate", "dgx-h100", "--interval", "0.25"]
    # Ctrl+C as in a terminal: a process started in the background of a shell without job control (as a CI runner
    # may start the suite) inherits SIGINT ignored, and so would nvdash.
    # A handler (unlike "ignore") is reset to the default in the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    url = f"http://127.0.0.1:{port}"
    try:

        def health() -> Any:
            try:
                return get_json(url + "/health")
            except (OSError, AssertionError):
                return None

        first = wait_for(health, lambda h: h is not None and h["sampler"]["sweeps"] > 12)
        doc = get_json(url + "/api/snapshot.json")
        assert doc["gpus"][2]["utilization_pct"] is None, "GPU 2's read hangs"
        assert doc["gpus"][3]["utilization_pct"] is not None
        wait_for(health, lambda h: h["sampler"]["sweeps"] > first["sampler"]["sweeps"] + 8)
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)  # nvdash prints its threads' stacks
            wait_for(lambda: _pending_signals(process.pid), lambda pending: not pending & SIGUSR1_BIT, timeout_s=10)
            process.kill()
            output, _ = process.communicate(timeout=10)
            pytest.fail(f"nvdash did not exit within 20 s of Ctrl+C while an NVML call hung; it printed:\n{output}")
        assert process.returncode == 0, output
        assert "Traceback" not in output, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_index_shows_each_gpus_health() -> None:
    with nvdash_server(["--simulate", "a100-pcie-2", "--interval", "0.25"]) as server:
        wait_for(lambda: get_json(server.url + "/api/snapshot.json"),
                  lambda d: d["gpus"][0]["utilization_pct"] is not None)
        status, body, _ = http_get(server.url + "/")
        assert status == 200
        assert body.count('class="health ') == 2
