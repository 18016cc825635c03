"""The server's settings, built by the command line (or the Jupyter proxy) and read by the server."""

from __future__ import annotations

from dataclasses import dataclass

from nvdash.store import DEFAULT_CAPACITY


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``python -m nvdash`` can be told."""

    host: str = "127.0.0.1"
    port: int = 8000
    interval_s: float = 0.5
    simulate: str | None = None
    seed: int = 0
    allow_websocket_origin: tuple[str, ...] = ()
    prefix: str = ""
    history: int = DEFAULT_CAPACITY
    faults: str | None = None
    """Fault injection for the simulated GPUs (tests and demos), e.g. ``lose:3@10``."""
