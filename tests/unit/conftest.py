"""Fixtures shared by the unit tests: the real pynvml over the fake NVML library, a thread pool for history loads."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary, Profile
from nvdash.sampling.nvml_source import NvmlSource, install_library

START = 1_700_000_000.0


class FakeClock:
    """A clock that moves only when told to (safe to move from another thread)."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def at(self, seconds_after_start: float) -> None:
        self.now = START + seconds_after_start


Install = Callable[..., FakeNvmlLibrary]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def install(clock: FakeClock) -> Iterator[Install]:
    """Install a fake under the real pynvml (one at a time); always restores pynvml's own library."""
    restores: list[Callable[[], None]] = []

    def make(profile: str | Profile = "dgx-h100", *, init: bool = True, **kwargs: Any) -> FakeNvmlLibrary:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("latency_scale", 0.0)
        fake = FakeNvmlLibrary(profile, **kwargs)
        restores.append(install_library(pynvml, fake))
        if init:
            pynvml.nvmlInit()
        return fake

    yield make
    for restore in reversed(restores):
        restore()


def open_source(
    profile: str, clock: FakeClock, latency_scale: float = 0.0, **source_args: Any
) -> Iterator[tuple[NvmlSource, FakeNvmlLibrary]]:
    """An (unopened) NVML source over a fake of ``profile`` (seed 1); closes both afterwards."""
    fake = FakeNvmlLibrary(profile, seed=1, clock=clock, latency_scale=latency_scale)
    restore = install_library(pynvml, fake)
    source = NvmlSource(pynvml, **source_args)
    try:
        yield source, fake
    finally:
        source.close()
        restore()


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    """A one-thread pool, where pages run their history queries."""
    with ThreadPoolExecutor(1) as pool:
        yield pool


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound by this test (so nothing else can take it), never listening."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]
