"""The health answer's sweep count and the simulated library's call counts describe the same moment."""

from __future__ import annotations

from types import SimpleNamespace

from nvdash.sampling.records import HostInfo, HostSample, Inventory
from nvdash.sampling.sampler import Sampler
from nvdash.server.app import Runtime, health
from nvdash.store import Store


class Host:
    def read(self) -> HostSample:
        return HostSample(cpu_pct=1.0)


def test_a_sweep_ending_while_the_counts_are_read_is_in_both_or_neither() -> None:
    store = Store(Inventory(host=HostInfo("h", 1, 1)), capacity=10)
    sampler = Sampler(store, Host(), None, interval_s=0.1)
    calls = {"nvmlDeviceGetUtilizationRates": 0}
    ended_once = False

    def counts() -> dict[str, int]:
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
    runtime = Runtime(store=store, sampler=sampler, fake_nvml_call_counts=counts)
    handler = SimpleNamespace(get_query_argument=lambda name, default: default, current_user="x",
                              application=SimpleNamespace(settings={}))
    answer = health(runtime, handler, lambda: None, [])  # type: ignore[arg-type]
    assert answer["sampler"]["sweeps"] == 2
    assert answer["fake_nvml_call_counts"] == {"nvmlDeviceGetUtilizationRates": 2}
