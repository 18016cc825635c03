"""The jupyter-server-proxy entry point: Jupyter starts nvdash on demand under ``<base_url>nvdash/``.

Registered in the ``jupyter_serverproxy_servers`` entry-point group as ``nvdash``. Jupyter authenticates every
request (HTTP and websocket) before proxying it, and checks the browser's Origin against its own host, so the
nvdash process behind it listens on 127.0.0.1 only and is reached only through the proxy.

The websocket origin: the browser's Origin is JupyterLab's (``https://hub.example.org``), a name the nvdash
process cannot know in advance, and jupyter-server-proxy forwards it unchanged. Rather than accept any origin,
the proxy presents nvdash's own address as the Origin of the requests it forwards, which nvdash's default
allow-list (its own addresses) accepts. The browser-facing origin check stays where it belongs, in Jupyter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

NAME = "nvdash"
"""The URL path under Jupyter's base URL, and the entry point's name."""
ENV_START_TIMEOUT = "NVDASH_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 30.0
"""How long Jupyter waits for nvdash to answer (it needs about 2 s; NVML on many GPUs or a cold disk more)."""


def command() -> list[str]:
    """The command line of the proxied server; ``{port}`` and ``{base_url}`` are filled in by the proxy."""
    return [sys.executable, "-m", "nvdash", "--host", "127.0.0.1", "--port", "{port}", "--prefix", "{base_url}" + NAME]


def start_timeout_s(environ: Mapping[str, str]) -> float:
    """``$NVDASH_START_TIMEOUT`` seconds when it is a positive number, else the default."""
    try:
        value = float(environ.get(ENV_START_TIMEOUT, ""))
    except ValueError:
        return DEFAULT_START_TIMEOUT_S
    return value if value > 0 else DEFAULT_START_TIMEOUT_S


def setup() -> dict[str, Any]:
    """The server process description jupyter-server-proxy reads from the entry point.

    ``absolute_url`` keeps the full ``<base_url>nvdash/...`` path on the forwarded requests, matching the
    ``--prefix`` nvdash serves under, so the pages' links, static files and websocket all resolve through the
    proxy. The environment passes through unchanged (``NVDASH_SIMULATE`` selects simulated GPUs). A server
    that does not answer within ``$NVDASH_START_TIMEOUT`` seconds is stopped, and the request fails with 500.
    """
    return {
        "command": command(),
        "absolute_url": True,
        "timeout": start_timeout_s(os.environ),
        "request_headers_override": {"Origin": "http://127.0.0.1:{port}"},
        "exclude_last_activity_patterns": [r".*/" + NAME + r"/health$"],
        "new_browser_tab": False,
        "launcher_entry": {"enabled": False, "title": "GPU Dashboards"},
    }
