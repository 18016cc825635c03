"""The Bokeh dashboards: one module per route, each reading only the shared store.

Importing this package loads Bokeh but neither pynvml nor psutil, and starts nothing.
"""

from nvdash.apps.context import AppContext
from nvdash.apps.registry import (
    APPS,
    AppSpec,
    Requirement,
    available_apps,
    reads_prometheus,
    unavailable_reason,
)

__all__ = ["APPS", "AppContext", "AppSpec", "Requirement", "available_apps", "reads_prometheus",
           "unavailable_reason"]
