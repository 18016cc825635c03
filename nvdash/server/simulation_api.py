"""``/api/simulation.json``, served under ``--simulate`` only: what the simulated NVML library was asked.

The simulated library counts every call into it, per entry point; tests and benchmarks compare those counts with
the sampler's sweeps (how many NVML calls a sweep costs, whatever the number of viewers). Nothing of it is part of
a real deployment's runtime: the route exists only where the library is the simulated one.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tornado.web import RequestHandler

from nvdash.sampling.sampler import Sampler
from nvdash.server.app import sampler_json
from nvdash.server.pages import JsonHandler

ROUTE = r"/api/simulation\.json"
CONSISTENT_TRIES = 5


@runtime_checkable
class CountingLibrary(Protocol):
    """The simulated NVML library's own counts of the calls made into it."""

    def total_calls(self) -> int:
        """All calls so far."""
        ...

    def call_counts(self) -> dict[str, int]:
        """Calls so far per entry point."""
        ...


def simulation_json(library: CountingLibrary, sampler: Sampler | None) -> dict[str, Any]:
    """The sampler's numbers and the library's call counts as of one moment between two sweeps' ends.

    The sampler runs in its own thread; the counts are read between two equal readings of its sweep count (tried a
    few times), so a sweep that ended while they were read is not counted in one and missed in the other.
    """
    for _ in range(CONSISTENT_TRIES):
        before = sampler_json(sampler)
        counts = {"fake_nvml_calls": library.total_calls(), "fake_nvml_call_counts": library.call_counts()}
        after = sampler_json(sampler)
        if before is None or after is None or after["sweeps"] == before["sweeps"]:
            break
    return {"sampler": before, **counts}


Route = tuple[str, type[RequestHandler], dict[str, Any]]


def simulation_routes(library: object, sampler: Sampler | None) -> list[Route]:
    """The route to add to the server when ``library`` is the simulated one (none otherwise)."""
    if not isinstance(library, CountingLibrary):
        return []
    return [(ROUTE, JsonHandler, {"produce": lambda _h: simulation_json(library, sampler)})]
