"""A recording's inventory: what a file from another version holds is read, what a damaged or crafted one holds
is refused with one line, never carried into the pages with the wrong type."""

from __future__ import annotations

import json

import pytest

from nvdash.history import inventory_json
from nvdash.sampling.fake.profiles import PROFILES
from nvdash.sampling.hardware import open_hardware


def _inventory_text() -> str:
    hardware = open_hardware("dgx-h100", seed=0)
    try:
        return inventory_json.dumps(hardware.inventory)
    finally:
        hardware.close()


def test_an_inventory_reads_back_as_written() -> None:
    assert "dgx-h100" in PROFILES
    text = _inventory_text()
    inventory = inventory_json.loads(text)
    assert inventory_json.dumps(inventory) == text
    assert len(inventory.gpus) == 8
    assert inventory.gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_fields_of_another_version_are_left_out_or_defaulted() -> None:
    data = json.loads(_inventory_text())
    data["future_field"] = {"x": 1}
    data["gpus"][0]["future_gpu_field"] = 3
    del data["gpus"][0]["fan_count"]
    inventory = inventory_json.loads(json.dumps(data))
    assert inventory.gpus[0].fan_count is None


def test_an_older_recording_of_an_h100_gets_nvlinks_data_rate_as_its_maximum() -> None:
    """Before the data and signalling rates were apart, the link rate was the driver's speed field where it answered
    (H100: 26,562 MB/s, the signalling rate). NVIDIA's figure for H100 NVLink 4: 25 GB/s per link and direction."""
    data = json.loads(_inventory_text())
    for gpu in data["gpus"]:
        for name in ("nvlink_link_signalling_bytes_per_s", "nvlink_signalling_max_bytes_per_s"):
            del gpu[name]
        gpu["nvlink_link_bytes_per_s"] = 26562e6
        gpu["nvlink_max_bytes_per_s"] = 18 * 26562e6
        gpu["nvlink_speed_from_driver"] = True
    gpu = inventory_json.loads(json.dumps(data)).gpus[0]
    assert (gpu.nvlink_link_bytes_per_s, gpu.nvlink_max_bytes_per_s) == (25e9, 18 * 25e9)
    assert (gpu.nvlink_link_signalling_bytes_per_s, gpu.nvlink_signalling_max_bytes_per_s) == (26562e6, 18 * 26562e6)
    current = inventory_json.loads(_inventory_text()).gpus[0]
    assert current.nvlink_max_bytes_per_s == 18 * 25e9, "a recording of this version is read as written"


@pytest.mark.parametrize(("path", "value", "message"), [
    (("topology",), None, "Inventory.topology is null"),
    (("topology",), [1], "Inventory.topology is [1]"),
    (("host",), "x", "HostInfo is not an object"),
    (("host", "hostname"), ["<b>"], "HostInfo.hostname is"),
    (("host", "cpu_count"), "8", "HostInfo.cpu_count is \"8\""),
    (("gpus", 0), 1, "GpuInfo is not an object"),
    (("gpus", 0, "name"), {"a": 1}, "GpuInfo.name is"),
    (("gpus", 0, "memory_total_bytes"), 1.5, "GpuInfo.memory_total_bytes is 1.5"),
    (("gpus", 0, "nvlink_active_links"), [0, "1"], "GpuInfo.nvlink_active_links is"),
    (("gpus", 0, "nvlink_to_switch"), 1, "GpuInfo.nvlink_to_switch is 1"),
    (("driver_version",), 550, "Inventory.driver_version is 550"),
])
def test_a_value_of_the_wrong_type_is_refused_in_one_line(path: tuple[str | int, ...], value: object,
                                                         message: str) -> None:
    data = json.loads(_inventory_text())
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match="not an nvdash inventory") as caught:
        inventory_json.loads(json.dumps(data))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_non_finite_number_is_refused() -> None:
    data = json.loads(_inventory_text())
    text = json.dumps(data).replace('"power_default_limit_w": 700.0', '"power_default_limit_w": 1e999', 1)
    assert "1e999" in text
    with pytest.raises(ValueError, match="power_default_limit_w"):
        inventory_json.loads(text)
