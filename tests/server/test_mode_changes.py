"""A GPU that changes under a running server (MIG turned off, a driver reload, PCIe counters that wrap), through the
fault text form a server takes (``NVDASH_FAKE_FAULTS``).

Every reading is read back from the server's history (raw rows: one per sweep), so none is missed between two
polls. A fault's time counts from the simulated library's creation, which comes after this test launched the
server: a row stamped before launch + T was read before the fault.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvdash.sampling.fake import FakeNvmlLibrary
from tests.conftest import free_port, get_json, http_get, nvdash_env, nvdash_server, wait_for

FAST = ["--interval", "0.25", "--process-interval", "0.5"]
MIG_OFF_AT_S = 12.0
RELOAD_AT_S = 10.0
MARGIN_S = 1.0
"""A row stamped this long before a fault's time was surely read before it (a sweep's reads take < interval)."""


@dataclass(frozen=True)
class Row:
    """One recorded reading of one GPU."""

    time_s: float
    value: float | None


def _series(url: str, metric: str, gpu: int) -> list[Row]:
    """Every recorded reading of ``metric`` on ``gpu`` in the last 10 minutes, oldest first (raw resolution: each
    bucket's ``max`` is the largest reading in it); empty before the history has any."""
    status, body, _ = http_get(f"{url}/api/history.json?metric={metric}&range=10m&gpu={gpu}")
    assert status == 200, body[:300]
    doc: dict[str, Any] = json.loads(body)
    assert doc["resolution"] == "raw"
    return [Row(t, value) for series in doc["series"] for t, value in zip(series["time_s"], series["max"], strict=True)]


@dataclass(frozen=True)
class Reading:
    """A row that holds a value."""

    time_s: float
    value: float


def _recorded(rows: list[Row]) -> list[Reading]:
    return [Reading(row.time_s, row.value) for row in rows if row.value is not None and math.isfinite(row.value)]


def test_mig_turned_off_gives_the_gpu_its_utilization_and_one_reprobe(tmp_path: Path) -> None:
    """nvidia-smi shows a MIG-mode GPU's utilization as N/A (NVML: NOT_SUPPORTED); with MIG off it has a value."""
    launched = time.time()
    env = {"NVDASH_FAKE_FAULTS": f"mig:0:off@{MIG_OFF_AT_S}"}
    args = ["--simulate", "a100-mig", *FAST, "--history", str(tmp_path / "h.sqlite")]
    with nvdash_server(args, env=env) as server:
        snapshot = wait_for(lambda: get_json(server.url + "/api/snapshot.json"),
                            lambda doc: doc["gpus"][0]["utilization_pct"] is not None, timeout_s=90.0)
        assert 0 <= snapshot["gpus"][0]["utilization_pct"] <= 100
        before = launched + MIG_OFF_AT_S - MARGIN_S
        other = wait_for(lambda: _series(server.url, "utilization_pct", 1),
                         lambda rows: any(row.time_s < before for row in _recorded(rows)), timeout_s=30.0)
        assert any(row.time_s < before for row in _recorded(other)), "the sampler read before the fault"
        mig_gpu = wait_for(lambda: _series(server.url, "utilization_pct", 0), _recorded, timeout_s=30.0)
        assert [row for row in _recorded(mig_gpu) if row.time_s < before] == [], "a value while MIG was on"
        assert all(0 <= row.value <= 100 for row in _recorded(mig_gpu))
        sampler = server.health()["sampler"]
        assert sampler["relearned"] == 1
        last = sampler["last_relearn"]
        assert (last["gpu"], last["reason"]) == (0, "MIG mode changed")
        assert launched + MIG_OFF_AT_S <= last["at"] <= time.time()


def _falls(rows: list[Reading]) -> list[int]:
    """Indices (into ``rows``) of the readings below the one before."""
    return [i for i in range(1, len(rows)) if rows[i].value < rows[i - 1].value]


def test_a_driver_reload_restarts_the_energy_count_and_the_pcie_rates_recover(tmp_path: Path) -> None:
    """``nvmlDeviceGetTotalEnergyConsumption`` counts "since the driver was last reloaded"; the PCIe byte counters
    start over too. The rate across the restart is left out, never a huge one, and counting goes on."""
    launched = time.time()
    env = {"NVDASH_FAKE_FAULTS": f"driver_reload@{RELOAD_AT_S}"}
    args = ["--simulate", "dgx-h100", *FAST, "--history", str(tmp_path / "h.sqlite")]
    with nvdash_server(args, env=env) as server:
        gpus = get_json(server.url + "/info.json")["gpus"]
        health = wait_for(server.health, lambda doc: doc["sampler"]["relearned"] >= len(gpus), timeout_s=90.0)
        gpu = 0
        maximum = gpus[gpu]["pcie_max_bytes_per_s"]

        def reload_seen() -> tuple[list[Reading], list[Row]]:
            return (_recorded(_series(server.url, "energy_mj", gpu)),
                    _series(server.url, "pcie_rx_bytes_per_s", gpu))

        def recovered(found: tuple[list[Reading], list[Row]]) -> bool:
            energy, rates = found
            falls = _falls(energy)
            return len(falls) == 1 and len(_recorded([row for row in rates if row.time_s > energy[falls[0]].time_s
                                                      ])) >= 3

        energy, rates = wait_for(reload_seen, recovered, timeout_s=60.0)
        (fall,) = _falls(energy)
        assert energy[fall].time_s >= launched + RELOAD_AT_S, "not before the reload"
        assert energy[fall].value < energy[fall - 1].value / 10, "counting anew from zero"
        after = [row for row in rates if row.time_s > energy[fall].time_s]
        assert _recorded(after[:4]), "the rate is back within a few readings"
        assert all(0 <= row.value <= maximum for row in _recorded(rates)), "no rate above the link's maximum"
        assert _recorded([row for row in rates if row.time_s < energy[fall - 1].time_s]), "rates before the reload"
        sampler = server.health()["sampler"]
        assert sampler["relearned"] == len(gpus) == health["sampler"]["relearned"], "each GPU once"
        assert sampler["last_relearn"]["reason"] == "energy counter went backwards"
        assert launched + RELOAD_AT_S <= sampler["last_relearn"]["at"] <= time.time()


def _first_wraps(gpu: int, series: str, bits: int, count: int) -> float:
    """Seconds after start by which the fake's ``series`` counter, counting from 0 at start modulo ``2**bits``, has
    wrapped ``count`` times: the bytes the simulated workload (seed 0, the server's) moved, by its own integral."""
    workload = FakeNvmlLibrary("dgx-h100", seed=0, latency_scale=0.0).workload
    t = 0.0
    while workload.transferred_bytes(gpu, series, t) - workload.transferred_bytes(gpu, series, 0.0) < count << bits:
        t += 0.1
        assert t < 600, "the workload never moves that much"
    return t


def test_pcie_rates_stay_within_the_link_across_32_bit_wraps(tmp_path: Path) -> None:
    """nvml.h: the PCIe byte counters "can be wrapped"; a 32-bit counter passes zero every 4 GiB."""
    gpu, wraps = 0, 3
    wrapped_by_s = _first_wraps(gpu, "pcie_rx", 32, wraps)
    env = {"NVDASH_FAKE_FAULTS": "pcie_wrap:32@0"}
    args = ["--simulate", "dgx-h100", *FAST, "--history", str(tmp_path / "h.sqlite")]
    with nvdash_server(args, env=env) as server:
        maximum = get_json(server.url + "/info.json")["gpus"][gpu]["pcie_max_bytes_per_s"]

        def rows() -> list[Row]:
            return _series(server.url, "pcie_rx_bytes_per_s", gpu)

        def past_the_wraps(found: list[Row]) -> bool:
            # the library was created before the first sweep: a row this long after the first is past the wraps
            recorded = _recorded(found)
            return bool(recorded) and recorded[-1].time_s > found[0].time_s + wrapped_by_s + 1.0

        found = wait_for(rows, past_the_wraps, timeout_s=90.0)
        recorded = _recorded(found)
        assert all(0 <= row.value <= maximum for row in recorded), "no rate above the link's maximum"
        after = [row for row in recorded if row.time_s > found[0].time_s + wrapped_by_s]
        assert after, "rates go on after the counter wrapped"
        tx = _recorded(_series(server.url, "pcie_tx_bytes_per_s", gpu))
        assert tx
        assert all(0 <= row.value <= maximum for row in tx)
        assert server.health()["sampler"]["relearned"] == 0, "a wrap is no driver reload"


def test_a_mig_fault_on_a_profile_without_mig_stops_the_server_with_one_line() -> None:
    command = [sys.executable, "-m", "nvdash", "--simulate", "t4", "--port", str(free_port()), "--no-history"]
    done = subprocess.run(command, env=nvdash_env({"NVDASH_FAKE_FAULTS": "driver_reload@5;mig:0:off@3"}),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("nvdash: error: bad NVML fault 'mig:0:off@3': profile 't4' has GPUs without MIG "
                               "support; expected ITEM[;ITEM...]")
