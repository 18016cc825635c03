"""``/api/snapshot.json`` and the XID path on a real server, plus shutdown with a hung NVML call."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvdash.sampling.fake.profiles import PROFILES
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot
from nvdash.server.snapshot import snapshot_json
from nvdash.store import Store
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


def test_link_maxima_are_named_as_maxima_beside_the_current_link() -> None:
    """NVML's maximum link generation and width are ``*_max``; the older names stay as aliases with the same value."""
    profile = PROFILES["dgx-h100"]
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.25"]) as server:
        doc = wait_for(lambda: get_json(server.url + "/api/snapshot.json"),
                       lambda d: all(g["pcie_width_current"] is not None for g in d["gpus"]))
        for gpu in doc["gpus"]:
            assert gpu["pcie_generation_max"] == profile.pcie_generation == 5
            assert gpu["pcie_width_max"] == profile.pcie_width == 16
            assert gpu["pcie_generation"] == gpu["pcie_generation_max"]
            assert gpu["pcie_width"] == gpu["pcie_width_max"]
            assert gpu["power_enforced_limit_w"] == gpu["power_limit_w"] == profile.power_limit_w
            assert gpu["nvlink_data_max_bytes_per_s"] == gpu["nvlink_max_bytes_per_s"]
            assert gpu["nvlink_link_data_bytes_per_s"] == gpu["nvlink_link_bytes_per_s"]
        # The profile's GPU 3 trained to 8 lanes: the current width is below the maximum, not the same figure.
        assert doc["gpus"][3]["pcie_width_current"] == 8
        assert doc["gpus"][3]["pcie_width_max"] == 16
        assert doc["deprecated_aliases"]["pcie_width"] == "pcie_width_max"
        assert doc["deprecated_aliases"]["power_limit_w"] == "power_enforced_limit_w"
        info = get_json(server.url + "/info.json")
        for gpu in info["gpus"]:
            assert (gpu["pcie_generation_max"], gpu["pcie_width_max"]) == (5, 16)
            assert (gpu["pcie_generation"], gpu["pcie_width"]) == (5, 16)
            assert gpu["nvlink_data_max_bytes_per_s"] == gpu["nvlink_max_bytes_per_s"]
        assert info["deprecated_aliases"] == {"pcie_generation": "pcie_generation_max",
                                              "pcie_width": "pcie_width_max",
                                              "nvlink_max_bytes_per_s": "nvlink_data_max_bytes_per_s"}
        _status, body, _headers = http_get(server.url + "/")
        assert body.count(" links, ") == 8
        assert body.count(" data rate per direction") == 8, "the index says which NVLink maximum it shows"


H100_LINKS = 18
H100_DATA_PER_LINK = 25e9
"""NVLink 4: 25 GB/s of data per link and direction."""
H100_SIGNALLING_PER_LINK = 26.5625e9
"""2 lanes x 106.25 Gb/s per link and direction, as ``nvidia-smi nvlink -s`` shows it (26.562 GB/s)."""


def _h100_inventory() -> Inventory:
    info = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-0", memory_total_bytes=80 * 2**30,
                   pcie_generation=5, pcie_width=16, pcie_max_bytes_per_s=63e9, nvlink_links=H100_LINKS,
                   nvlink_max_bytes_per_s=H100_LINKS * H100_DATA_PER_LINK,
                   nvlink_link_bytes_per_s=H100_DATA_PER_LINK,
                   nvlink_link_signalling_bytes_per_s=H100_SIGNALLING_PER_LINK,
                   nvlink_signalling_max_bytes_per_s=H100_LINKS * H100_SIGNALLING_PER_LINK)
    return Inventory(host=HostInfo("node", 8, 2**36), gpus=(info,))


def test_the_readings_this_release_adds_are_served_with_their_values() -> None:
    """Each new reading reaches the JSON unchanged, and the two NVLink maxima and two power limits stay apart."""
    sample = GpuSample(
        0, power_w=350.0, power_limit_w=600.0, power_management_limit_w=700.0,
        encoder_utilization_pct=12.0, decoder_utilization_pct=34.0,
        gpm_fp64_active_pct=1.5, gpm_fp32_active_pct=22.5, gpm_fp16_active_pct=3.25,
        violation_power_ns=1_000_000_001, violation_thermal_ns=2_000_000_002, violation_sync_boost_ns=3,
        violation_board_limit_ns=4, violation_low_utilization_ns=5, violation_reliability_ns=6,
        nvlink_crc_flit_errors=7, nvlink_crc_data_errors=8, nvlink_replay_errors=9, nvlink_recovery_errors=10,
        pcie_generation_current=4, pcie_width_current=8)
    store = Store(_h100_inventory())
    store.append(Snapshot(1000.0, (sample,), HostSample()))
    (gpu,) = snapshot_json(store, now=lambda: 1000.5)["gpus"]
    assert (gpu["power_enforced_limit_w"], gpu["power_limit_w"], gpu["power_management_limit_w"]) == (
        600.0, 600.0, 700.0)
    assert (gpu["encoder_utilization_pct"], gpu["decoder_utilization_pct"]) == (12.0, 34.0)
    assert (gpu["gpm_fp64_active_pct"], gpu["gpm_fp32_active_pct"], gpu["gpm_fp16_active_pct"]) == (1.5, 22.5, 3.25)
    assert [gpu[f"violation_{name}_ns"] for name in (
        "power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")] == [
        1_000_000_001, 2_000_000_002, 3, 4, 5, 6]
    assert [gpu[f"nvlink_{name}_errors"] for name in ("crc_flit", "crc_data", "replay", "recovery")] == [7, 8, 9, 10]
    assert gpu["nvlink_data_max_bytes_per_s"] == gpu["nvlink_max_bytes_per_s"] == 450e9
    assert gpu["nvlink_signalling_max_bytes_per_s"] == pytest.approx(478.125e9)
    assert gpu["nvlink_link_data_bytes_per_s"] == gpu["nvlink_link_bytes_per_s"] == 25e9
    assert gpu["nvlink_link_signalling_bytes_per_s"] == 26.5625e9
    assert (gpu["pcie_generation_max"], gpu["pcie_generation_current"]) == (5, 4)
    assert (gpu["pcie_width_max"], gpu["pcie_width_current"]) == (16, 8)


def test_before_the_first_reading_the_new_fields_are_null() -> None:
    (gpu,) = snapshot_json(Store(_h100_inventory()), now=lambda: 0.0)["gpus"]
    assert gpu["reading"] is False
    assert gpu["power_enforced_limit_w"] is None
    assert gpu["violation_power_ns"] is None
    assert gpu["pcie_width_max"] == 16, "a maximum is the GPU's, known before any reading"


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
