"""``nvdash.live`` sits below the dashboards and the server: it imports neither, and importing it loads nothing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nvdash.live

ABOVE = ("nvdash.apps", "nvdash.server", "nvdash.commands", "nvdash.cli")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_live_imports_nothing_above_it() -> None:
    package = Path(nvdash.live.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) >= 10
    upward = {
        f"{path.name}: {name}"
        for path in modules
        for name in _imports(path)
        if any(name == above or name.startswith(above + ".") for above in ABOVE)
    }
    assert not upward, f"nvdash.live imports a layer above it: {sorted(upward)}"


def test_importing_the_package_loads_no_bokeh_server_and_no_hardware_library() -> None:
    """The dashboards import nvdash.live's modules; Bokeh's server (which imports psutil) loads only with install."""
    code = ("import sys, nvdash.live; "
            "print(sorted(m for m in ('bokeh', 'bokeh.server.server', 'psutil', 'pynvml', 'tornado') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"
