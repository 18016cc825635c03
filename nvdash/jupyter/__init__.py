"""nvdash's Jupyter server extension: tells the nvdash this server started about the server's own kernels.

Enabled by ``pip install`` (``etc/jupyter/jupyter_server_config.d/nvdash.json``). On load it writes the kernels
file (:mod:`nvdash.sampling.jupyter_kernels`) in Jupyter's runtime folder, keeps it current while the server runs
(:mod:`nvdash.jupyter.keeper`) and removes it at exit, and serves the same, with each kernel's process tree, at
``GET <base_url>api/nvdash/kernels`` (:mod:`nvdash.jupyter.handlers`) behind Jupyter's login.

The file's path is :func:`~nvdash.sampling.jupyter_kernels.kernels_file_path` of Jupyter's runtime folder
(``jupyter_core.paths.jupyter_runtime_dir()``) and this process's id: the jupyter-server-proxy entry point, run in
the same process, hands nvdash the same path. jupyter_server calls a shutdown hook only for ``ExtensionApp``
extensions, so the file is removed at interpreter exit (Jupyter's own stop, by SIGTERM, SIGINT or the shutdown
API, ends that way); a Jupyter killed outright leaves it, and the nvdash it started goes with it.
"""

from __future__ import annotations

import atexit
import functools
import os
import time
from typing import Any

EXTENSION = "nvdash.jupyter"


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The extension's entry point for jupyter_server: this module's :func:`_load_jupyter_server_extension`."""
    return [{"module": EXTENSION}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Write the kernels file, keep it current, and add the kernels API to ``serverapp``."""
    from jupyter_core.paths import jupyter_runtime_dir  # noqa: PLC0415 - nothing imported until Jupyter loads it
    from jupyter_server.utils import url_path_join  # noqa: PLC0415

    from nvdash.jupyter.handlers import ROUTE, KernelsHandler  # noqa: PLC0415
    from nvdash.jupyter.keeper import KernelsFileKeeper  # noqa: PLC0415
    from nvdash.jupyter.tree import build_kernels, server_record  # noqa: PLC0415

    server = server_record(os.getpid(), serverapp.base_url)
    build = functools.partial(build_kernels, server, serverapp.kernel_manager, serverapp.session_manager)
    keeper = KernelsFileKeeper(jupyter_runtime_dir(), server, build, serverapp.log, time.time)
    try:
        keeper.write_initial()
    except OSError as error:
        serverapp.log.warning("nvdash | cannot write the kernels file %s: %s", keeper.path, error.strerror or error)
    keeper.start()
    atexit.register(keeper.stop)
    pattern = url_path_join(serverapp.base_url, ROUTE)
    serverapp.web_app.add_handlers(".*$", [(pattern, KernelsHandler, {"build": build})])
    serverapp.log.info("nvdash | kernels file %s, API %s", keeper.path, pattern)
