"""nvdash: live NVIDIA GPU and host dashboards served by one Bokeh server.

Importing this package has no side effects: it does not load NVML, start threads or touch files.
"""

__version__ = "0.1.0"
