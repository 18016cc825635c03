"""The example Prometheus deployment in ``deploy/prometheus``: promtool accepts the alert rules and the scrape
config and passes the rules' unit tests; every rule says what an operator needs, and has a firing and a quiet
test."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvdash.metrics.compat import RENAMES_4_9

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "nvdash-alerts.yml"
CONFIG = PROMETHEUS / "prometheus.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
SEVERITIES = {"info", "warning", "critical"}
PER_INSTANCE = {"NvdashTargetDown", "NvdashSamplerStale", "NvdashProcessReadingsStale"}
"""Rules about a scrape target rather than a GPU: no gpu, UUID or Hostname label to name."""

Load = Callable[[Path], Any]


def promtool(*args: str) -> None:
    """Runs promtool from the repository root; a failure shows its command and output."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: the test command (bash scripts/test.sh) installs it with Debian's "
                    "prometheus package", pytrace=False)
    result = subprocess.run([path, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, f"promtool {' '.join(args)} exited {result.returncode}:\n{output}"


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_promtool_checks_the_rules() -> None:
    promtool("check", "rules", relative(RULES))


def test_promtool_checks_the_config() -> None:
    # rule_files in prometheus.yml are relative to the config file, wherever promtool runs.
    promtool("check", "config", relative(CONFIG))


def test_promtool_runs_the_rule_tests() -> None:
    assert RULE_TESTS, "no rule tests in deploy/prometheus/tests"
    promtool("test", "rules", *(relative(path) for path in RULE_TESTS))


@pytest.fixture
def load() -> Load:
    """A YAML loader (PyYAML); the tests that use it are skipped without PyYAML."""
    yaml = pytest.importorskip("yaml")

    def load_file(path: Path) -> Any:
        return yaml.safe_load(path.read_text(encoding="utf-8"))

    return load_file


def alert_rules(load: Load) -> list[dict[str, Any]]:
    groups = load(RULES)["groups"]
    assert [group["name"] for group in groups] == ["nvdash"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_rule_has_for_severity_summary_and_description(load: Load) -> None:
    rules = alert_rules(load)
    assert rules
    names = [rule.get("alert") for rule in rules]
    assert all(names), "every rule is an alerting rule"
    assert len(names) == len(set(names)), f"duplicate alert names: {names}"
    problems: list[str] = []
    for rule in rules:
        name = rule["alert"]
        if "for" not in rule:
            problems.append(f"{name}: no for")
        severity = (rule.get("labels") or {}).get("severity")
        if severity not in SEVERITIES:
            problems.append(f"{name}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
        annotations = rule.get("annotations") or {}
        for key in ("summary", "description"):
            if not str(annotations.get(key, "")).strip():
                problems.append(f"{name}: no {key}")
        description = str(annotations.get("description", ""))
        wanted = ["$value", "$labels.instance"] if name in PER_INSTANCE else [
            "$value", "$labels.gpu", "$labels.UUID", "$labels.Hostname"]
        problems.extend(f"{name}: the description does not name {item}" for item in wanted
                        if item not in description)
    assert not problems, "\n".join(problems)


def test_every_rule_has_a_firing_and_a_quiet_test(load: Load) -> None:
    names = {rule["alert"] for rule in alert_rules(load)}
    firing: set[str] = set()
    quiet: set[str] = set()
    assert RULE_TESTS, "no rule tests in deploy/prometheus/tests"
    for path in RULE_TESTS:
        document = load(path)
        loaded = {(path.parent / name).resolve() for name in document.get("rule_files", [])}
        assert loaded == {RULES}, f"{relative(path)} should load {relative(RULES)} only"
        for test in document.get("tests", []):
            for case in test.get("alert_rule_test") or []:
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert not names - firing, f"rules without a firing test: {sorted(names - firing)}"
    assert not names - quiet, f"rules without a test where they must not fire: {sorted(names - quiet)}"
    assert not (firing | quiet) - names, f"tests of unknown rules: {sorted((firing | quiet) - names)}"


def test_the_header_names_the_families_the_4_9_naming_renames(load: Load) -> None:
    """The rules read dcgm-exporter 4.8's names; the file's header lists those that --metrics-compat 4.9 renames."""
    used: set[str] = set()
    for rule in alert_rules(load):
        used |= set(re.findall(r"\b(?:DCGM_FI_\w+|nvdash_\w+)\b", rule["expr"]))
    renamed = sorted(used & set(RENAMES_4_9))
    assert renamed == ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL",
                       "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_XID_ERRORS"]
    header = RULES.read_text(encoding="utf-8").split("groups:", 1)[0]
    listed = header.split("--metrics-compat 4.9", 1)[1].split("Keep the default naming", 1)[0]
    assert sorted(set(re.findall(r"DCGM_FI_\w+", listed))) == renamed
