"""Offline checks of the container image's recipe (``deploy/image/Containerfile``) and of the script that builds it
(``scripts/build-image.sh``): what the image runs, as whom, and that its command line is one nvdash accepts; the
script's help, its one-line errors and shellcheck. The build itself (debootstrap, buildah: minutes) is a documented
benchmark, not a test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nvdash.server.options import ENV_HISTORY, ENV_TOKEN, parse_settings

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "image" / "Containerfile"
SCRIPT = ROOT / "scripts" / "build-image.sh"
PYPROJECT_TEXT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
NONROOT = "65532"
BASH = shutil.which("bash") or "/bin/bash"


def _project(key: str) -> str:
    """A string of pyproject.toml's [project] table (tomllib is not in Python 3.10, which nvdash supports)."""
    table = PYPROJECT_TEXT.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    found = re.search(rf'^{key} = "([^"]*)"$', table, re.MULTILINE)
    assert found is not None, key
    return found.group(1)


def _extras() -> set[str]:
    """The names of pyproject.toml's optional dependencies."""
    table = PYPROJECT_TEXT.split("\n[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+) = \[", table, re.MULTILINE))


def _instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions (keyword in upper case, arguments), continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in CONTAINERFILE.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, "the Containerfile ends inside a continued line"
    return instructions


def _only(keyword: str) -> str:
    found = [arguments for name, arguments in _instructions() if name == keyword]
    assert len(found) == 1, f"{keyword}: {found}"
    return found[0]


def _assignments(arguments: str) -> dict[str, str]:
    """``NAME=value`` pairs of an ENV or LABEL (values possibly double-quoted)."""
    return {name: value.strip('"') for name, value in re.findall(r'([\w.-]+)=("[^"]*"|\S+)', arguments)}


def _image_environment() -> dict[str, str]:
    return _assignments(_only("ENV"))


def _run_script(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PATH": path} if path is not None else None
    return subprocess.run([BASH, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False,
                          env=environment)


def test_the_image_is_built_from_a_debian_base_given_as_an_argument() -> None:
    instructions = _instructions()
    assert instructions[0] == ("ARG", "BASE=debian:bookworm-slim")
    assert _only("FROM") == "${BASE}"


def test_the_image_runs_nvdash_as_the_nonroot_user_by_default() -> None:
    assert _only("USER") == f"{NONROOT}:{NONROOT}"
    assert json.loads(_only("ENTRYPOINT")) == ["nvdash"]
    assert _only("EXPOSE") == "8000"
    run = _only("RUN")
    assert f"useradd --uid {NONROOT}" in run
    # The history folder (the VOLUME) is the user's, so a fresh volume is writable without root.
    assert f"install -d -o {NONROOT} -g {NONROOT}" in run
    assert _only("VOLUME") == "/var/lib/nvdash" == _only("WORKDIR")


def test_the_default_command_is_one_nvdash_accepts_serving_every_address_on_the_exposed_port() -> None:
    command = json.loads(_only("CMD"))
    assert command[0] == "serve"
    environment = _image_environment()
    settings = parse_settings(command[1:], environment)
    assert (settings.host, settings.port) == ("0.0.0.0", int(_only("EXPOSE")))
    # The history goes to the volume; with no NVDASH_TOKEN nvdash makes a token (it serves on 0.0.0.0).
    assert settings.history_path == environment[ENV_HISTORY] == "/var/lib/nvdash/history.sqlite"
    assert settings.token is None
    assert not settings.no_token
    assert parse_settings(command[1:], {**environment, ENV_TOKEN: "s3cret"}).token == "s3cret"


def test_the_wheel_is_installed_with_an_extra_that_pyproject_defines() -> None:
    run = _only("RUN")
    extras = re.findall(r'"\$\{wheel\}\[(\w+)\]"', run)
    assert extras == ["kubernetes"]
    assert set(extras) <= _extras()
    # The context (one nvdash wheel, perhaps its dependencies' wheels) goes to /tmp/wheels; by default pip may use
    # the network, build-image.sh makes it use those wheels alone.
    assert _only("COPY") == ". /tmp/wheels/"
    assert "/tmp/wheels/nvdash-*.whl" in run
    assert 'ARG PIP_OPTIONS=""' in [f"ARG {arguments}" for name, arguments in _instructions() if name == "ARG"]
    assert re.search(r'--build-arg "PIP_OPTIONS=--no-index --find-links /tmp/wheels"',
                     SCRIPT.read_text(encoding="utf-8"))
    # The NVIDIA container runtime mounts libnvidia-ml in only when asked for the utility capability.
    environment = _image_environment()
    assert environment["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert environment["PATH"].startswith("/opt/nvdash/bin:")


def test_the_labels_say_what_the_project_says() -> None:
    labels = _assignments(" ".join(arguments for name, arguments in _instructions() if name == "LABEL"))
    assert labels["org.opencontainers.image.title"] == _project("name")
    assert labels["org.opencontainers.image.licenses"] == _project("license")
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    arguments = [arguments for name, arguments in _instructions() if name == "ARG"]
    assert "VERSION=" + _project("version") in arguments
    assert labels["org.opencontainers.image.source"].startswith("https://github.com/")


def test_the_script_help_lists_its_options() -> None:
    result = _run_script("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: scripts/build-image.sh")
    for option in ("--install", "--suite", "--mirror", "--security-mirror", "--cache", "--rebuild-base", "--wheel",
                   "--tag"):
        assert re.search(rf"^  {option}\b", result.stdout, re.MULTILINE), option


@pytest.mark.parametrize(("args", "message"), [
    (("--frobnicate",), "build-image.sh: unknown option: --frobnicate (see --help)"),
    (("--suite",), "build-image.sh: --suite needs a value"),
    (("--suite", "../etc"), "build-image.sh: --suite: not a Debian release name: ../etc"),
])
def test_the_script_refuses_a_bad_argument_in_one_line(args: tuple[str, ...], message: str) -> None:
    result = _run_script(*args)
    assert (result.returncode, result.stderr, result.stdout) == (1, message + "\n", "")


def test_the_script_names_the_debian_package_of_a_missing_tool(tmp_path: Path) -> None:
    # A PATH with nothing but what the script needs before its first check: buildah is missing.
    for tool in ("dirname",):
        found = shutil.which(tool)
        assert found is not None
        (tmp_path / tool).symlink_to(found)
    result = _run_script("--wheel", "/nonexistent.whl", path=str(tmp_path))
    assert result.returncode == 1
    assert result.stderr == ("build-image.sh: buildah not found: apt-get install buildah "
                             "(or run this script as root with --install)\n")


def test_the_script_is_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (Debian package shellcheck; scripts/test.sh installs it)")
    result = subprocess.run([shellcheck, "--severity=style", str(SCRIPT)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout
