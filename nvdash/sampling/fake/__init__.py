"""A fake libnvidia-ml for ``--simulate PROFILE``: the real pynvml runs on top of it, unchanged.

Install it with ``nvdash.sampling.nvml_source.install_library(pynvml, FakeNvmlLibrary("dgx-h100"))``.
This package never imports pynvml; it defines the few NVML constants it needs itself.
"""

from .library import FakeNvmlLibrary
from .profiles import PROFILES, Profile, profile_names

__all__ = ["PROFILES", "FakeNvmlLibrary", "Profile", "profile_names"]
