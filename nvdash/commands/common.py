"""What the history commands share: the history file they work on, by the command line's rule."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nvdash.history.database import default_path
from nvdash.server.options import ENV_HISTORY, UsageError, history_path


def history_file(value: str | None, environ: Mapping[str, str]) -> Path:
    """The history file an export, import or report uses (``--history``, ``$NVDASH_HISTORY`` or the per-user
    default); raises :class:`UsageError` when ``$NVDASH_HISTORY`` turns history off."""
    enabled, path = history_path(value, environ)
    if not enabled:
        raise UsageError(f"${ENV_HISTORY} turns history off; name a file with --history")
    return Path(path).expanduser() if path else default_path()
