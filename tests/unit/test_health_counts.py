"""The simulation's own route: its sweep count and the simulated library's call counts describe the same moment;
the product's runtime holds no test instrumentation and is not changed once built."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.records import HostInfo, HostSample, Inventory
from nvdash.sampling.sampler import Sampler
from nvdash.server.app import Runtime, health
from nvdash.server.simulation_api import ROUTE, simulation_json, simulation_routes
from nvdash.store import Store


class Host:
    def read(self) -> HostSample:
        return HostSample(cpu_pct=1.0)


def _sampler() -> Sampler:
    return Sampler(Store(Inventory(host=HostInfo("h", 1, 1)), capacity=10), Host(), None, interval_s=0.1)


def test_a_sweep_ending_while_the_counts_are_read_is_in_both_or_neither() -> None:
    sampler = _sampler()
    calls = {"nvmlDeviceGetUtilizationRates": 0}
    ended_once = False

    class Library:
        def total_calls(self) -> int:
            return sum(calls.values())

        def call_counts(self) -> dict[str, int]:
            """Reading the counts takes as long as the rest of a sweep: the first reading sees a sweep end."""
            nonlocal ended_once
            answer = dict(calls)
            if not ended_once:
                ended_once = True
                calls["nvmlDeviceGetUtilizationRates"] += 1
                sampler.sample_once()
            return answer

    calls["nvmlDeviceGetUtilizationRates"] += 1
    sampler.sample_once()
    answer = simulation_json(Library(), sampler)
    assert answer["sampler"]["sweeps"] == 2
    assert answer["fake_nvml_call_counts"] == {"nvmlDeviceGetUtilizationRates": 2}
    assert answer["fake_nvml_calls"] == 2


def test_only_the_simulated_library_gets_the_route() -> None:
    fake = FakeNvmlLibrary("t4", latency_scale=0)
    assert [route for route, _, _ in simulation_routes(fake, None)] == [ROUTE]
    assert simulation_routes(None, None) == []
    assert simulation_routes(object(), None) == []


def test_the_runtime_is_complete_when_built_and_health_names_no_simulation_counts() -> None:
    runtime = Runtime(store=Store(Inventory(host=HostInfo("h", 1, 1)), capacity=10), sampler=_sampler())
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.xid_status = "watching"  # type: ignore[misc]
    assert not any(field.name.startswith("fake") for field in dataclasses.fields(Runtime))
    handler = SimpleNamespace(get_query_argument=lambda name, default: default, current_user="x",
                              application=SimpleNamespace(settings={}))
    answer = health(runtime, handler, lambda: None, [])  # type: ignore[arg-type]
    assert answer["sampler"]["sweeps"] == 0
    assert not [key for key in answer if key.startswith("fake")]
