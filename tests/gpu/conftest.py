"""The real-GPU tests run only where an NVIDIA driver answers; everywhere else they are skipped."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from nvdash.sampling.hardware import Hardware, open_hardware


def _driver_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    return result.returncode == 0 and "GPU 0" in result.stdout


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _driver_present():
        return
    skip = pytest.mark.skip(reason="no NVIDIA driver on this machine (nvidia-smi absent or failing)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def hardware() -> Iterator[Hardware]:
    """The real GPUs through nvdash's hardware layer, opened once per module."""
    opened = open_hardware(None)
    try:
        yield opened
    finally:
        opened.close()
