"""nvdash's readings of real GPUs against nvidia-smi on the same machine."""

from __future__ import annotations

import csv
import subprocess
import time
from collections.abc import Iterator

import pytest

from nvdash.sampling.hardware import Hardware, open_hardware
from nvdash.sampling.nvml_source import PCIE_LANE_BYTES_PER_S
from tests.conftest import get_json, nvdash_server

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


@pytest.fixture(scope="module")
def hardware() -> Iterator[Hardware]:
    opened = open_hardware(None)
    try:
        yield opened
    finally:
        opened.close()


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
    time.sleep(0.5)
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
        time.sleep(1.5)
        health = server.health()
        assert health["sampler"]["errors"] == 0
        assert health["nvml_calls"] > 0
