"""``GET <base_url>api/nvdash/kernels``: this server's kernels and each local kernel's process tree now.

Answers the kernels file's JSON (:func:`nvdash.sampling.jupyter_kernels.to_json`, built afresh) with, on each
kernel, ``descendants``: the process ids below a local kernel now (nearest kernel only), ``null`` for a kernel
that is not on this machine. Jupyter authenticates the request (token or login cookie) and authorizes it as a read
of the ``kernels`` resource; anything else is refused before a kernel is looked at.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from nvdash.jupyter.processes import kernel_descendants, process_parents
from nvdash.sampling.jupyter_kernels import JupyterKernels, to_json

ROUTE = "api/nvdash/kernels"
AUTH_RESOURCE = "kernels"


def kernels_document(kernels: JupyterKernels, descendants: dict[int, list[int]]) -> dict[str, Any]:
    """The API's answer: ``to_json(kernels)`` with each kernel's ``descendants``."""
    document = to_json(kernels)
    for entry, kernel in zip(document["kernels"], kernels.kernels, strict=True):
        entry["descendants"] = descendants.get(kernel.pid, []) if kernel.local and kernel.pid is not None else None
    return document


class KernelsHandler(APIHandler):
    """The kernels of this server, for a user Jupyter lets read its kernels."""

    auth_resource = AUTH_RESOURCE

    def initialize(self, build: Callable[[], Awaitable[JupyterKernels]]) -> None:
        self._build = build

    @web.authenticated
    @authorized
    async def get(self) -> None:
        kernels = await self._build()
        pids = [kernel.pid for kernel in kernels.kernels if kernel.local and kernel.pid is not None]
        parents = await asyncio.get_running_loop().run_in_executor(None, process_parents) if pids else {}
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(kernels_document(kernels, kernel_descendants(pids, parents))))
