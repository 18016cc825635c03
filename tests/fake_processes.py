"""Test helper: write the simulated GPUs' process file (``NVDASH_FAKE_PROCESS_FILE``) the way a test should, whole
or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_process_file(path: str | os.PathLike[str], items: list[str]) -> None:
    """Replace the process file at ``path`` with ``items`` (one a line, e.g. ``process:0:4301:0.3:2048``): written to
    a temporary file in the same folder, then renamed over it, so a reader sees the old items or the new, never
    half a file."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write("".join(f"{item}\n" for item in items))
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
