"""``nvdash replay FILE``: serve a recording (the settings name it; NVML is not touched)."""

from __future__ import annotations

from nvdash.commands.serve import run_serve
from nvdash.settings import Settings


def run_replay(settings: Settings) -> int:
    """Serve the history file ``settings.replay`` names, as :func:`~nvdash.commands.serve.run_serve` does."""
    if settings.replay is None:
        raise ValueError("replay settings name no recording")
    return run_serve(settings)
