"""The example Prometheus deployment in ``deploy/prometheus``: promtool accepts the alert rules, under dcgm-exporter
4.8's naming and 4.9's, and the scrape config, and passes each rules file's unit tests; every rule says what an
operator needs and has a firing and a quiet test. The 4.9 files are what ``python -m nvdash.metrics.rules_compat``
generates from the 4.8 files now, and a rename alone would not have made them right."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nvdash.cluster.recorded import NODE_GPUS, RULES_INFO, RULES_VERSION, XID_NONZERO
from nvdash.metrics import rules_compat
from nvdash.metrics.collector import LAST_PROCESS_SAMPLE_FAMILY, LAST_SAMPLE_FAMILY
from nvdash.metrics.compat import LABEL_RENAMES_4_9, RENAMES_4_9
from nvdash.metrics.fields import FIELDS
from tests.unit.test_metrics_dcgm_parity import DCGM_EXPORTER_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
SEVERITIES = {"info", "warning", "critical"}
PER_INSTANCE = {"NvdashTargetDown", "NvdashSamplerStale", "NvdashProcessReadingsStale"}
"""Rules about a scrape target rather than a GPU: no gpu, UUID or host label to name."""
PER_NODE = {"NvdashNodeGpuCountDropped", "NvdashNodeAbsent"}
"""Rules about a node (its host label) rather than one GPU."""
FAMILY = re.compile(r"\b(?:DCGM_FI_\w+|nvdash_\w+)\b")


@dataclass(frozen=True)
class Naming:
    """One dcgm-exporter naming's rules file, its promtool tests and the label that names the host."""

    version: str
    rules: Path
    tests: Path
    host_label: str


NAMING_4_8 = Naming("4.8", PROMETHEUS / "nvdash-alerts.yml", PROMETHEUS / "tests" / "nvdash-alerts-test.yml",
                    "Hostname")
NAMING_4_9 = Naming("4.9", PROMETHEUS / "nvdash-alerts-4.9.yml", PROMETHEUS / "tests" / "nvdash-alerts-4.9-test.yml",
                    "hostname")
NAMINGS = pytest.mark.parametrize("naming", [NAMING_4_8, NAMING_4_9], ids=lambda naming: naming.version)
RULES = NAMING_4_8.rules

Load = Callable[[Path], Any]


def promtool(*args: str, cwd: Path = ROOT, expect_success: bool = True) -> str:
    """Runs promtool (from the repository root); returns its output. A result other than the expected one shows
    its command and output."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: the test command (bash scripts/test.sh) installs it with Debian's "
                    "prometheus package", pytrace=False)
    result = subprocess.run([path, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    output = (result.stdout + result.stderr).strip()
    if expect_success:
        assert result.returncode == 0, f"promtool {' '.join(args)} exited {result.returncode}:\n{output}"
    else:
        assert result.returncode != 0, f"promtool {' '.join(args)} passed:\n{output}"
    return output


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@NAMINGS
def test_promtool_checks_the_rules(naming: Naming) -> None:
    promtool("check", "rules", relative(naming.rules))


def test_promtool_checks_the_config() -> None:
    # rule_files in prometheus.yml are relative to the config file, wherever promtool runs.
    promtool("check", "config", relative(CONFIG))


QUOTA_RULES = PROMETHEUS / "nvdash-quota-alerts.yml"
QUOTA_TESTS = PROMETHEUS / "tests" / "nvdash-quota-alerts-test.yml"
"""The GPUQuota group: nvdash's own quota families, the same under every dcgm-exporter naming."""


RECORDING_RULES = PROMETHEUS / "nvdash-recording-rules.yml"
RECORDING_TESTS = PROMETHEUS / "tests" / "nvdash-recording-rules-test.yml"
"""The nvdash-fleet group: recording rules that read both namings, so one file serves every naming."""


def test_every_rule_test_file_belongs_to_a_naming() -> None:
    assert sorted([NAMING_4_8.tests, NAMING_4_9.tests, QUOTA_TESTS, RECORDING_TESTS]) == RULE_TESTS


def test_promtool_checks_and_tests_the_recording_rules(load: Load) -> None:
    promtool("check", "rules", relative(RECORDING_RULES))
    promtool("test", "rules", relative(RECORDING_TESTS))
    groups = load(RECORDING_RULES)["groups"]
    assert [(group["name"], group["interval"]) for group in groups] == [("nvdash-fleet", "30s")]
    assert [rule["record"] for rule in groups[0]["rules"]] == [RULES_INFO, XID_NONZERO, NODE_GPUS]
    assert groups[0]["rules"][0]["labels"] == {"version": RULES_VERSION}
    # One file for every naming: each family is read under both names.
    text = RECORDING_RULES.read_text(encoding="utf-8").split("groups:", 1)[1]
    for family in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP"):
        assert re.search(rf"\b{family}\b", text)
        assert re.search(rf"\b{RENAMES_4_9[family].name}\b", text)
    assert "nvdash-recording-rules.yml" in load(CONFIG)["rule_files"]


def test_promtool_checks_and_tests_the_quota_rules(load: Load) -> None:
    promtool("check", "rules", relative(QUOTA_RULES))
    promtool("test", "rules", relative(QUOTA_TESTS))
    groups = load(QUOTA_RULES)["groups"]
    assert [group["name"] for group in groups] == ["GPUQuota"]
    rules = {rule["alert"]: rule for rule in groups[0]["rules"]}
    assert {name: (rule["expr"], rule.get("for")) for name, rule in rules.items()} == {
        "NvdashPodGpuMemoryOverQuota": ('nvdash_pod_gpu_quota_finding{finding="memory_over_quota"} == 1', "1m"),
        "NvdashPodGpuComputeOverQuota": ('nvdash_pod_gpu_quota_finding{finding="compute_over_quota"} == 1', "5m"),
        "NvdashGpuUnallocatedUse": ('nvdash_pod_gpu_quota_finding{finding="unallocated_use"} == 1', "5m"),
        # nvdash waits 10 minutes before it calls a quota unused (see nvdash.health.quota_judge).
        "NvdashPodGpuQuotaUnused": ('nvdash_pod_gpu_quota_finding{finding="quota_unused"} == 1', None),
    }
    assert "nvdash-quota-alerts.yml" in load(CONFIG)["rule_files"]


@NAMINGS
def test_promtool_runs_the_rule_tests(naming: Naming) -> None:
    promtool("test", "rules", relative(naming.tests))


@pytest.fixture
def load() -> Load:
    """A YAML loader (PyYAML); the tests that use it are skipped without PyYAML."""
    yaml = pytest.importorskip("yaml")

    def load_file(path: Path) -> Any:
        return yaml.safe_load(path.read_text(encoding="utf-8"))

    return load_file


def alert_rules(load: Load, path: Path = RULES) -> list[dict[str, Any]]:
    groups = load(path)["groups"]
    assert [group["name"] for group in groups] == ["nvdash"]
    return [rule for group in groups for rule in group["rules"]]


def families_read(rules: list[dict[str, Any]]) -> set[str]:
    """The families the rules' expressions and descriptions' ``query`` templates read."""
    found: set[str] = set()
    for rule in rules:
        found |= set(FAMILY.findall(rule["expr"]))
        found |= set(FAMILY.findall(str((rule.get("annotations") or {}).get("description", ""))))
    return found


@NAMINGS
def test_every_rule_has_for_severity_summary_and_description(load: Load, naming: Naming) -> None:
    rules = alert_rules(load, naming.rules)
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
            "$value", f"$labels.{naming.host_label}"] if name in PER_NODE else [
            "$value", "$labels.gpu", "$labels.UUID", f"$labels.{naming.host_label}"]
        problems.extend(f"{name}: the description does not name {item}" for item in wanted
                        if item not in description)
    assert not problems, "\n".join(problems)


def rule_cases(load: Load, naming: Naming) -> list[tuple[str, str, list[dict[str, str]]]]:
    """The tests' alert cases in order: (eval_time, alertname, expected labels of each alert)."""
    document = load(naming.tests)
    loaded = {(naming.tests.parent / name).resolve() for name in document.get("rule_files", [])}
    assert loaded == {naming.rules}, f"{relative(naming.tests)} should load {relative(naming.rules)} only"
    return [(str(case["eval_time"]), case["alertname"], [alert.get("exp_labels", {}) for alert in
                                                         case.get("exp_alerts") or []])
            for test in document.get("tests", []) for case in test.get("alert_rule_test") or []]


@NAMINGS
def test_every_rule_has_a_firing_and_a_quiet_test(load: Load, naming: Naming) -> None:
    names = {rule["alert"] for rule in alert_rules(load, naming.rules)}
    firing = {alertname for _, alertname, alerts in rule_cases(load, naming) if alerts}
    quiet = {alertname for _, alertname, alerts in rule_cases(load, naming) if not alerts}
    assert not names - firing, f"rules without a firing test: {sorted(names - firing)}"
    assert not names - quiet, f"rules without a test where they must not fire: {sorted(names - quiet)}"
    assert not (firing | quiet) - names, f"tests of unknown rules: {sorted((firing | quiet) - names)}"


def test_the_4_9_tests_expect_the_same_alerts_at_the_same_times_as_the_4_8_tests(load: Load) -> None:
    """Each 4.9 rule fires and stays quiet in the same cases as its 4.8 twin, with the same labels renamed."""
    renamed = [(time, alertname, [{LABEL_RENAMES_4_9.get(key, key): value for key, value in labels.items()}
                                  for labels in alerts])
               for time, alertname, alerts in rule_cases(load, NAMING_4_8)]
    assert rule_cases(load, NAMING_4_9) == renamed
    assert {rule["alert"] for rule in alert_rules(load, NAMING_4_9.rules)} == {
        rule["alert"] for rule in alert_rules(load, NAMING_4_8.rules)}


def test_the_4_9_rules_read_only_families_and_labels_that_4_9_naming_exports(load: Load) -> None:
    """The 4.9 rules read each family of the 4.8 rules under its 4.9 name, and no name or label 4.9 renames away
    (a rule reading one would be silent)."""
    rules_4_8 = families_read(alert_rules(load, NAMING_4_8.rules))
    rules_4_9 = families_read(alert_rules(load, NAMING_4_9.rules))
    assert rules_4_9 == {RENAMES_4_9[name].name if name in RENAMES_4_9 else name for name in rules_4_8}
    assert not rules_4_9 & set(RENAMES_4_9)
    for path in (NAMING_4_9.rules, NAMING_4_9.tests):
        body = path.read_text(encoding="utf-8").split("groups:" if path == NAMING_4_9.rules else "rule_files:", 1)[1]
        for label in LABEL_RENAMES_4_9:
            assert not re.search(rf"(?<!\w){label}(?!\w)", body), f"{relative(path)} still names the label {label}"
    assert "$labels.hostname" in NAMING_4_9.rules.read_text(encoding="utf-8")


def test_thresholds_in_a_changed_unit_are_converted(load: Load) -> None:
    """GPU_UTIL is a 0-1 ratio in 4.9: "busy" is above 0.5, not above 50; FB_* are bytes and their messages print
    bytes; the ratio-free comparisons stay as they were."""
    rules = {rule["alert"]: rule for rule in alert_rules(load, NAMING_4_9.rules)}
    assert re.search(r"DCGM_FI_DEV_GPU_UTIL_RATIO > 0\.5\b", rules["NvdashGpuPcieLinkGenDowntrained"]["expr"])
    assert "0.5 * (DCGM_FI_DEV_FB_USED_BYTES + DCGM_FI_DEV_FB_FREE_BYTES)" in rules["NvdashGpuMemoryFillingUp"]["expr"]
    assert "MiB" not in rules["NvdashGpuMemoryFillingUp"]["annotations"]["description"]
    assert "humanize1024" in rules["NvdashGpuMemoryFillingUp"]["annotations"]["description"]
    assert "humanizePercentage" in rules["NvdashGpuAllocatedButIdle"]["annotations"]["description"]
    assert 'DCGM_FI_DEV_GPU_UTIL_RATIO{pod!=""} == 0' in rules["NvdashGpuAllocatedButIdle"]["expr"]


def test_the_4_9_files_are_what_the_generator_makes_now() -> None:
    """A change to the 4.8 rules or tests without regenerating the 4.9 files fails here, naming the command."""
    out_of_date = rules_compat.stale(PROMETHEUS)
    if out_of_date:
        pytest.fail(f"{', '.join(relative(path) for path in out_of_date)} differ from what the 4.8 files give: run "
                    f"{rules_compat.COMMAND}", pytrace=False)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of deploy/prometheus's rules and tests, to edit."""
    shutil.copytree(PROMETHEUS, tmp_path / "prometheus")
    return tmp_path / "prometheus"


def test_an_edited_4_8_rule_makes_the_4_9_files_stale_until_regenerated(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = copy / NAMING_4_8.rules.name
    rules.write_text(rules.read_text(encoding="utf-8").replace("DCGM_FI_DEV_SLOWDOWN_TEMP - 5",
                                                               "DCGM_FI_DEV_SLOWDOWN_TEMP - 3"), encoding="utf-8")
    assert rules_compat.stale(copy) == [copy / NAMING_4_9.rules.name]
    assert rules_compat.main(["--check", "--dir", str(copy)]) == 1
    assert capsys.readouterr().err == (f"{copy / NAMING_4_9.rules.name} is out of date with its 4.8 twin: run "
                                       f"{rules_compat.COMMAND}\n")
    assert rules_compat.main(["--dir", str(copy)]) == 0
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS >= DCGM_FI_DEV_SLOWDOWN_TEMP - 3" in (
        copy / NAMING_4_9.rules.name).read_text(encoding="utf-8")
    assert rules_compat.main(["--check", "--dir", str(copy)]) == 0


def test_a_rename_alone_would_break_the_converted_rules(copy: Path) -> None:
    """The proof that the per-rule conversions are needed: the 4.9 rules made by renaming alone fail the 4.9 tests,
    exactly for the rules that have conversions."""
    mechanical = rules_compat.generate_rules(NAMING_4_8.rules.read_text(encoding="utf-8"),
                                             dict.fromkeys(rules_compat.RULE_CONVERSIONS, ()))
    (copy / NAMING_4_9.rules.name).write_text(mechanical, encoding="utf-8")
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO > 50" in mechanical
    output = promtool("test", "rules", str(copy / "tests" / NAMING_4_9.tests.name), expect_success=False)
    failed = set(re.findall(r"alertname: (\w+), time:", output))
    assert failed == {rule for rule, conversions in rules_compat.RULE_CONVERSIONS.items() if conversions}, output


def test_a_rule_on_a_unit_changed_family_without_a_conversion_is_refused(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = copy / NAMING_4_8.rules.name
    text = rules.read_text(encoding="utf-8").replace(
        "      - alert: NvdashGpuNvlinkNearMax",
        "      - alert: NvdashGpuBusy\n        expr: DCGM_FI_DEV_GPU_UTIL > 80\n        for: 5m\n\n"
        "      - alert: NvdashGpuNvlinkNearMax")
    rules.write_text(text, encoding="utf-8")
    with pytest.raises(rules_compat.ConversionError, match=r"^NvdashGpuBusy reads DCGM_FI_DEV_GPU_UTIL, whose unit "
                                                           r"changes .*RULE_CONVERSIONS"):
        rules_compat.generate_rules(text)
    before = (copy / NAMING_4_9.rules.name).read_text(encoding="utf-8")
    assert rules_compat.main(["--dir", str(copy)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith(f"{rules_compat.COMMAND}: error: NvdashGpuBusy reads DCGM_FI_DEV_GPU_UTIL")
    assert (copy / NAMING_4_9.rules.name).read_text(encoding="utf-8") == before


def test_a_conversion_that_no_longer_matches_is_refused() -> None:
    text = NAMING_4_8.rules.read_text(encoding="utf-8").replace("DCGM_FI_DEV_GPU_UTIL > 50",
                                                                "DCGM_FI_DEV_GPU_UTIL > 60")
    with pytest.raises(rules_compat.ConversionError,
                       match=r"^NvdashGpuPcieLinkGenDowntrained: the threshold DCGM_FI_DEV_GPU_UTIL > 50 matches 0"):
        rules_compat.generate_rules(text)
    tests = NAMING_4_8.tests.read_text(encoding="utf-8").replace("need 84000 MiB", "need 84001 MiB")
    with pytest.raises(rules_compat.ConversionError, match=r"^NvdashGpuMemoryFillingUp: the 4.9 edit of "):
        rules_compat.generate_tests(tests)


@pytest.mark.parametrize(("values", "family", "expected"), [
    ("40000+500x70", "DCGM_FI_DEV_FB_USED", "41943040000+524288000x70"),
    ("81000-2000x20 _x3 stale 7", "DCGM_FI_DEV_FB_FREE", "84934656000-2097152000x20 _x3 stale 7340032"),
    ("95x25 50 0.5", "DCGM_FI_DEV_GPU_UTIL", "0.95x25 0.5 0.005"),
    ("1.5e3", "DCGM_FI_DEV_SM_CLOCK", "1500000000"),
    ("2500+500x3", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "2.5+0.5x3"),
])
def test_series_values_are_converted_to_the_new_unit(values: str, family: str, expected: str) -> None:
    # Framebuffer MiB -> bytes (x 1048576), utilization % -> ratio (/ 100), clocks MHz -> Hz, energy mJ -> J.
    assert rules_compat.convert_values(values, RENAMES_4_9[family]) == expected


def test_a_series_value_that_cannot_be_converted_is_refused() -> None:
    with pytest.raises(rules_compat.ConversionError, match=r"cannot convert the series value 'Inf'"):
        rules_compat.convert_values("1 Inf", RENAMES_4_9["DCGM_FI_DEV_GPU_UTIL"])


def test_the_headers_name_the_families_the_4_9_naming_renames(load: Load) -> None:
    """The 4.8 file's header lists the families its rules read that 4.9 renames and points to the 4.9 twin; the
    4.9 file's header lists each of them with its new name."""
    renamed = sorted(families_read(alert_rules(load, NAMING_4_8.rules)) & set(RENAMES_4_9))
    assert renamed == ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL",
                       "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_XID_ERRORS"]

    def naming_paragraph(path: Path) -> str:
        header = path.read_text(encoding="utf-8").split("groups:", 1)[0]
        return header.split(rules_compat.NAMING_MARKER, 1)[1].split("\n#\n", 1)[0]

    paragraph = naming_paragraph(NAMING_4_8.rules)
    assert "load nvdash-alerts-4.9.yml" in re.sub(r"\s*#\s*", " ", paragraph)
    assert rules_compat.COMMAND in paragraph
    assert sorted(set(re.findall(r"DCGM_FI_DEV_\w+", paragraph))) == renamed
    paragraph = naming_paragraph(NAMING_4_9.rules)
    assert re.findall(r"(DCGM_FI_DEV_\w+) -> (DCGM_FI_DEV_\w+)", paragraph) == [
        (name, RENAMES_4_9[name].name) for name in renamed]


def test_test_series_are_converted_however_their_values_are_quoted() -> None:
    tests = NAMING_4_8.tests.read_text(encoding="utf-8")
    assert "values: '95x25'" in tests
    double = rules_compat.generate_tests(tests.replace("values: '95x25'", 'values: "95x25"'))
    assert 'values: "0.95x25"' in double
    with pytest.raises(rules_compat.ConversionError, match=r"cannot convert the series value '\[95\]'"):
        rules_compat.generate_tests(tests.replace("values: '95x25'", "values: [95]"))


def test_the_rules_that_catch_silence_read_what_nvdash_and_dcgm_exporter_export(load: Load) -> None:
    """The staleness rules read the timestamps nvdash's /metrics exports; the GPU count reads a family that
    dcgm-exporter's default counters export too (so it works with either); the pending page retirement reads the
    family nvdash fills from NVML's pending status."""
    rules = {rule["alert"]: rule["expr"] for rule in alert_rules(load)}
    assert set(FAMILY.findall(rules["NvdashSamplerStale"])) == {LAST_SAMPLE_FAMILY}
    assert set(FAMILY.findall(rules["NvdashNodeAbsent"])) == {LAST_SAMPLE_FAMILY}
    assert set(FAMILY.findall(rules["NvdashProcessReadingsStale"])) == {LAST_PROCESS_SAMPLE_FAMILY}
    (gpu_family,) = set(FAMILY.findall(rules["NvdashNodeGpuCountDropped"]))
    assert re.search(rf"^{gpu_family}\s*,\s*gauge", DCGM_EXPORTER_DEFAULTS, flags=re.MULTILINE)
    assert "offset 1d" in rules["NvdashNodeGpuCountDropped"]
    assert set(FAMILY.findall(rules["NvdashGpuRetiredPagesPending"])) == {"DCGM_FI_DEV_RETIRED_PENDING"}
    assert "DCGM_FI_DEV_RETIRED_PENDING" in FIELDS
    # The fixed threshold stands in only where the slowdown threshold is missing.
    assert set(FAMILY.findall(rules["NvdashGpuTemperatureHigh"])) == {"DCGM_FI_DEV_GPU_TEMP",
                                                                     "DCGM_FI_DEV_SLOWDOWN_TEMP"}
