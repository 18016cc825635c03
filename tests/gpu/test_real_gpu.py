"""nvdash's readings of real GPUs against nvidia-smi on the same machine."""

from __future__ import annotations

import csv
import subprocess
import time

import pytest

from nvdash.sampling.hardware import Hardware
from nvdash.sampling.nvml_source import PCIE_LANE_BYTES_PER_S
from tests.conftest import get_json, nvdash_server, wait_for

pytestmark = pytest.mark.gpu

FIELDS = (
    "index,name,uuid,memory.total,memory.used,utilization.gpu,pcie.link.gen.max,pcie.link.width.max,temperature.gpu"
)
MIB = 2**20


def smi() -> list[dict[str, str]]:
    """One dict per GPU from ``nvidia-smi --query-gpu``."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    names = FIELDS.split(",")
    return [dict(zip(names, (cell.strip() for cell in row), strict=True)) for row in csv.reader(out.splitlines())]


def test_inventory_matches_nvidia_smi(hardware: Hardware) -> None:
    rows = smi()
    gpus = hardware.inventory.gpus
    assert hardware.inventory.nvml_error is None
    assert len(gpus) == len(rows)
    for gpu, row in zip(gpus, rows, strict=True):
        assert gpu.index == int(row["index"])
        assert gpu.name == row["name"]
        assert gpu.uuid == row["uuid"]
        assert gpu.memory_total_bytes is not None
        assert abs(gpu.memory_total_bytes / MIB - float(row["memory.total"])) <= 1
        if row["pcie.link.gen.max"].isdigit():
            assert gpu.pcie_generation == int(row["pcie.link.gen.max"])
            assert gpu.pcie_width == int(row["pcie.link.width.max"])
            assert gpu.pcie_max_bytes_per_s == pytest.approx(
                PCIE_LANE_BYTES_PER_S[int(row["pcie.link.gen.max"])] * int(row["pcie.link.width.max"])
            )


def test_samples_match_nvidia_smi(hardware: Hardware) -> None:
    assert hardware.gpus is not None
    hardware.gpus.read(5.0)
    time.sleep(0.5)  # not a wait for anything: the rates of the second read span half a second of counters
    samples = hardware.gpus.read(5.0)
    rows = smi()
    for sample, row in zip(samples, rows, strict=True):
        assert not sample.lost
        assert sample.memory_used_bytes is not None
        # Other processes may allocate between the two reads; a small drift is allowed.
        assert abs(sample.memory_used_bytes / MIB - float(row["memory.used"])) <= 64
        assert sample.utilization_pct is not None
        assert 0 <= sample.utilization_pct <= 100
        assert abs(sample.utilization_pct - float(row["utilization.gpu"])) <= 30
        if row["temperature.gpu"].isdigit():
            assert sample.temperature_c is not None
            assert abs(sample.temperature_c - float(row["temperature.gpu"])) <= 5
        for rate in (sample.pcie_tx_bytes_per_s, sample.pcie_rx_bytes_per_s):
            assert rate is None or rate >= 0


def test_server_serves_the_real_gpus() -> None:
    with nvdash_server([]) as server:
        info = get_json(server.url + "/info.json")
        assert info["simulated"] is None
        assert [gpu["name"] for gpu in info["gpus"]] == [row["name"] for row in smi()]
        index = get_json(server.url + "/index.json")
        assert "/GPU-Utilization" in index
        health = wait_for(server.health, lambda health: health["sampler"]["sweeps"] >= 2)
        assert health["sampler"]["errors"] == 0
        assert health["nvml_calls"] > 0


HEALTH_FIELDS = (
    "temperature.gpu,power.draw,enforced.power.limit,power.default_limit,clocks.sm,clocks.mem,clocks.max.sm,"
    "clocks.max.mem,pcie.link.gen.current,pcie.link.width.current,pstate,ecc.mode.current,memory.used,"
    "memory.reserved,utilization.gpu"
)
NVLINK_PUBLISHED = {
    # Per GPU, all links, one direction: A100 SXM 600 GB/s and H100 SXM 900 GB/s bidirectional, B200 1.8 TB/s.
    "A100-SXM": (12, 300e9),
    "H100 80GB HBM3": (18, 450e9),
    "H100 SXM": (18, 450e9),
    "H200": (18, 450e9),
    "B200": (18, 900e9),
}


def smi_query(fields: str) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=FIELDS``, one dict per GPU (unsupported cells read ``[N/A]``)."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    names = fields.split(",")
    return [dict(zip(names, (cell.strip() for cell in row), strict=True)) for row in csv.reader(out.splitlines())]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def test_health_readings_match_nvidia_smi(hardware: Hardware) -> None:
    """Tolerances: temperature 5 C and power 20 % + 15 W (both move between the two reads), SM and memory
    clocks 25 % (they follow load), maxima and limits exact to the unit nvidia-smi prints, link state exact."""
    assert hardware.gpus is not None
    samples = hardware.gpus.read(5.0)  # none of these readings is a rate: one read is enough
    rows = smi_query(HEALTH_FIELDS)
    for info, sample, row in zip(hardware.inventory.gpus, samples, rows, strict=True):
        if (temperature := _number(row["temperature.gpu"])) is not None:
            assert sample.temperature_c is not None
            assert abs(sample.temperature_c - temperature) <= 5
        if (power := _number(row["power.draw"])) is not None:
            assert sample.power_w is not None
            assert abs(sample.power_w - power) <= 0.2 * power + 15
        if (limit := _number(row["enforced.power.limit"])) is not None:
            assert sample.power_limit_w == pytest.approx(limit, abs=1)
        if (default := _number(row["power.default_limit"])) is not None:
            assert info.power_default_limit_w == pytest.approx(default, abs=1)
        if (sm_max := _number(row["clocks.max.sm"])) is not None:
            assert info.clock_sm_max_mhz == sm_max
        if (mem_max := _number(row["clocks.max.mem"])) is not None:
            assert info.clock_memory_max_mhz == mem_max
        if (sm := _number(row["clocks.sm"])) is not None:
            assert sample.clock_sm_mhz is not None
            assert abs(sample.clock_sm_mhz - sm) <= 0.25 * max(sm, 300)
        if (gen := _number(row["pcie.link.gen.current"])) is not None:
            assert sample.pcie_generation_current == gen
            assert sample.pcie_width_current == _number(row["pcie.link.width.current"])
        if row["pstate"].startswith("P"):
            assert sample.pstate is not None
            assert abs(sample.pstate - int(row["pstate"][1:])) <= 2
        if row["ecc.mode.current"] in ("Enabled", "Disabled"):
            assert info.ecc_enabled is (row["ecc.mode.current"] == "Enabled")
        if (reserved := _number(row["memory.reserved"])) is not None:
            assert sample.memory_reserved_bytes is not None
            assert abs(sample.memory_reserved_bytes / MIB - reserved) <= 1
        assert sample.memory_used_bytes is not None
        assert abs(sample.memory_used_bytes / MIB - float(row["memory.used"])) <= 64, "v2 'used', as nvidia-smi"


def test_nvlink_maximum_matches_the_published_figure(hardware: Hardware) -> None:
    checked = 0
    for gpu in hardware.inventory.gpus:
        match = next((value for key, value in NVLINK_PUBLISHED.items() if key in gpu.name), None)
        if match is None or not gpu.has_nvlink:
            continue
        links, per_direction = match
        assert gpu.nvlink_links == links
        assert gpu.nvlink_max_bytes_per_s is not None
        assert gpu.nvlink_max_bytes_per_s == pytest.approx(per_direction), "the data rate, not the signalling rate"
        if gpu.nvlink_signalling_max_bytes_per_s is not None:
            assert per_direction < gpu.nvlink_signalling_max_bytes_per_s <= per_direction * 1.1
        checked += 1
    if not checked:
        pytest.skip("no GPU here with NVLink and a published figure in the table")
