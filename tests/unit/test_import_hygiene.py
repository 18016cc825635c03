"""Importing nvdash does no work: no pynvml, no psutil, no threads; layers stay apart."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys, threading
import {module}
loaded = sorted(m for m in ("pynvml", "psutil", "bokeh", "grpc", "google.protobuf") if m in sys.modules)
print(",".join(loaded), threading.active_count())
"""


def _loaded(module: str) -> tuple[set[str], int]:
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(module=module)], capture_output=True, text=True, check=True, timeout=60
    )
    names, _, threads = result.stdout.strip().rpartition(" ")
    return {name for name in names.split(",") if name}, int(threads)


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("nvdash", {"pynvml", "psutil", "bokeh", "grpc", "google.protobuf"}),
        ("nvdash.cli", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.store", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.records", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.sampler", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.nvml_source", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.host_source", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.fake", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.xid_watcher", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.kubelet", {"pynvml", "psutil", "bokeh", "grpc", "google.protobuf"}),
        ("nvdash.sampling.usage", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.host_processes", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.sampling.cgroups", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.server.usage_json", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.health", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.server.snapshot", {"pynvml", "psutil", "bokeh"}),
        ("nvdash.apps", {"pynvml", "psutil"}),
        # Bokeh's server itself imports psutil (for its memory log); nvdash's own modules do not.
        ("nvdash.server.app", {"pynvml"}),
    ],
)
def test_import_loads_no_hardware_library_and_starts_no_thread(module: str, forbidden: set[str]) -> None:
    loaded, threads = _loaded(module)
    assert not loaded & forbidden, f"importing {module} loaded {loaded & forbidden}"
    assert threads == 1


def test_only_one_module_imports_pynvml_and_one_imports_psutil() -> None:
    from pathlib import Path

    import nvdash

    root = Path(nvdash.__file__).parent
    importers: dict[str, list[str]] = {"pynvml": [], "psutil": []}
    for path in root.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            for name, found in importers.items():
                if stripped.startswith((f"import {name}", f"from {name} ")):
                    found.append(str(path.relative_to(root)))
    assert importers["pynvml"] == ["sampling/nvml_source.py"]
    assert importers["psutil"] == ["sampling/host_source.py"]
