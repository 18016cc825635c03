"""Jupyter authorizers for tests, loaded by a real Jupyter with ``--ServerApp.authorizer_class``."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.authorizer import Authorizer


class NoKernels(Authorizer):
    """Lets the user do everything but touch kernels (a JupyterHub role without the kernels scope)."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "kernels"
