"""``nvdash [serve]``: run the server with the settings the command line gave."""

from __future__ import annotations

import sys

from nvdash.settings import Settings


def run_serve(settings: Settings) -> int:
    """Serve until stopped; a server that cannot start is one line on stderr and status 1. (The server's
    modules are imported only here: the other commands start faster without them.)"""
    from nvdash.server.run import StartupError, serve  # noqa: PLC0415

    try:
        return serve(settings)
    except StartupError as error:
        print(f"nvdash: error: {error}", file=sys.stderr)
        return 1
