"""The simulation profiles are listed once (the profiles module); the CLI offers exactly those, and each one builds."""

from __future__ import annotations

import re

import pytest

from nvdash.sampling.fake.profiles import PROFILES, profile_names
from nvdash.sampling.hardware import open_hardware
from nvdash.server.options import _serve_parser


def _offered_in_help() -> list[str]:
    text = " ".join(_serve_parser().format_help().split())
    found = re.search(r"--simulate PROFILE .*?profiles: (.*?) --seed", text)
    assert found is not None, text
    return found.group(1).split(", ")


def test_the_cli_offers_exactly_the_profiles_the_simulation_has() -> None:
    assert _offered_in_help() == profile_names() == sorted(PROFILES)
    assert "hgx-h100-hpc" in _offered_in_help()


@pytest.mark.parametrize("name", profile_names())
def test_every_profile_builds_and_reads(name: str) -> None:
    hardware = open_hardware(name, seed=1)
    try:
        profile = PROFILES[name]
        assert hardware.inventory.simulated == name
        assert len(hardware.inventory.gpus) == profile.gpu_count
        if hardware.gpus is not None:
            samples = hardware.gpus.read(30.0)
            assert [sample.index for sample in samples] == list(range(profile.gpu_count))
            assert [sample.error for sample in samples if sample.error is not None] == []
    finally:
        hardware.close()
