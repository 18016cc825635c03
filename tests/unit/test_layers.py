"""The layers contract (``[tool.importlinter]`` in pyproject.toml): nvdash's imports go down, never up.

Runs import-linter's own command on the package, so that an upward import fails the tests as it fails CI, with
the offending imports listed; and on a copy given one upward import, so that the contract is known to catch one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = """
import sys
from importlinter.cli import lint_imports_command
sys.argv = ["lint-imports", sys.argv[1], "--no-cache"]
lint_imports_command()
"""


def _lint(package_root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the nvdash under ``package_root``, with this repository's contract."""
    environ = {**os.environ, "PYTHONPATH": str(package_root)}
    return subprocess.run([sys.executable, "-c", LINT, str(ROOT / "pyproject.toml")], cwd=package_root,
                          env=environ, capture_output=True, text=True, timeout=120, check=False)


def _broken(output: str) -> str:
    """The contract's verdict and the imports that break it (import-linter's report, less its banner)."""
    start = output.find("Broken contracts")
    return output[start:] if start >= 0 else output[-4000:]


def test_every_import_goes_down_the_layers() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, f"the layers contract is broken:\n{_broken(result.stdout + result.stderr)}"
    assert " 0 broken." in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "nvdash", tmp_path / "nvdash", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    store = tmp_path / "nvdash" / "store.py"
    store.write_text(store.read_text(encoding="utf-8") + "\nfrom nvdash.commands import common  # noqa\n",
                     encoding="utf-8")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nvdash.store is not allowed to import nvdash.commands" in result.stdout
    assert "nvdash.store -> nvdash.commands.common" in result.stdout
