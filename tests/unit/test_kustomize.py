"""Every kustomize overlay of ``deploy/kubernetes`` as ``kubectl kustomize`` renders it: its built-in objects
validate against every Kubernetes version that ``kubernetes-validate`` bundles, its ServiceMonitor and
PrometheusRules against the Prometheus Operator's CRD schemas (tests/data/prometheus-operator), its DaemonSet's
arguments parse with nvdash's own parser; the PrometheusRules hold the rule files' groups, the dashboard
ConfigMap holds deploy/grafana/nvdash.json, and the generated files are up to date."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from nvdash.settings import Settings
from tests import kustomize
from tests.unit.test_deploy import KUBERNETES_VERSIONS, container_settings

ROOT = kustomize.ROOT
OVERLAY_NAMES = ("plain", "pods", "prometheus-operator", "grafana", "kube-prometheus-stack")
OPTIONAL_COMPONENTS = ("gpu-node-affinity", "tolerate-all-taints", "all-gpus-by-volume-mount")
SCHEMAS = ROOT / "tests" / "data" / "prometheus-operator"
CRD_SCHEMAS = {"ServiceMonitor": SCHEMAS / "servicemonitors.v1.schema.yaml",
               "PrometheusRule": SCHEMAS / "prometheusrules.v1.schema.yaml"}
RULE_FILES = {"nvdash-alerts": ROOT / "deploy" / "prometheus" / "nvdash-alerts.yml",
              "nvdash-quota-alerts": ROOT / "deploy" / "prometheus" / "nvdash-quota-alerts.yml",
              "nvdash-recording-rules": ROOT / "deploy" / "prometheus" / "nvdash-recording-rules.yml"}
DASHBOARD = ROOT / "deploy" / "grafana" / "nvdash.json"
README = kustomize.KUBERNETES / "README.md"
RELEASE = {"release": "kube-prometheus-stack"}
GFD_LABEL = {"nvidia.com/gpu.present": "true"}


def load_generator() -> ModuleType:
    """deploy/kubernetes/generate.py as a module (it is a script, not part of the nvdash package)."""
    spec = importlib.util.spec_from_file_location("nvdash_deploy_generate", kustomize.KUBERNETES / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kubectl() -> Path:
    return kustomize.find_kubectl()


@pytest.fixture(scope="module")
def rendered(kubectl: Path) -> dict[str, list[dict[str, Any]]]:
    """Every overlay's objects, by overlay name."""
    return {name: kustomize.build(kustomize.OVERLAYS / name, kubectl) for name in OVERLAY_NAMES}


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [item for item in objects if item["kind"] == kind]
    return found


def daemonset_settings(objects: list[dict[str, Any]]) -> Settings:
    """The overlay's DaemonSet's command line, parsed by nvdash (as tests/unit/test_deploy.py does)."""
    return container_settings({"DaemonSet": only(objects, "DaemonSet")})


def closed(schema: Any) -> Any:
    """``schema`` with every object that lists its properties refusing others, as the API server's strict field
    validation (kubectl's default) refuses unknown fields of a custom resource."""
    if isinstance(schema, dict):
        schema = {key: closed(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators() -> dict[str, jsonschema.protocols.Validator]:
    validators = {}
    for kind, path in CRD_SCHEMAS.items():
        schema = closed(yaml.safe_load(path.read_text(encoding="utf-8")))
        # metadata is the API server's ObjectMeta, not described by the CRD.
        schema["properties"]["metadata"] = {"type": "object"}
        validators[kind] = jsonschema.Draft7Validator(schema)
    return validators


def crd_errors(validators: dict[str, jsonschema.protocols.Validator], item: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
            for error in validators[item["kind"]].iter_errors(item)]


# --- kubectl --------------------------------------------------------------------------------------------------


def test_a_missing_kubectl_fails_the_test_instead_of_skipping_it(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"kubectl is not installed: install kubectl 1\.21"):
        kustomize.find_kubectl(search=[tmp_path])
    old = tmp_path / "kubectl"  # a kubectl 1.20, whose kustomize v2 cannot build components
    old.write_text("#!/bin/sh\necho 'Client Version: v1.20.2'\necho 'Kustomize Version: v2.0.3'\n", encoding="utf-8")
    old.chmod(0o755)
    with pytest.raises(pytest.fail.Exception, match="embeds no kustomize v4 or newer"):
        kustomize.find_kubectl(search=[tmp_path])


# --- every overlay ----------------------------------------------------------------------------------------------


def test_the_overlays_are_the_documented_ones() -> None:
    assert sorted(path.name for path in kustomize.OVERLAYS.iterdir()) == sorted(OVERLAY_NAMES)
    readme = README.read_text(encoding="utf-8")
    for name in OVERLAY_NAMES:
        assert f"`overlays/{name}`" in readme, name
    for path in kustomize.COMPONENTS.iterdir():
        assert f"`components/{path.name}`" in readme, path.name


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_every_built_in_object_validates_against_every_kubernetes_version(
        rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    built_in = [item for item in rendered[overlay] if item["apiVersion"] in ("v1", "apps/v1")]
    assert {item["kind"] for item in built_in} >= {"Namespace", "DaemonSet", "Service"}
    failures = []
    for item in built_in:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(item, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                failures.append(f"{item['kind']} on Kubernetes {version}: {'.'.join(map(str, error.path))}: "
                                f"{error.message}")
    assert not failures, "\n".join(failures)
    namespace = only(rendered[overlay], "Namespace")["metadata"]["name"]
    assert all(item["metadata"].get("namespace") == namespace for item in rendered[overlay]
               if item["kind"] != "Namespace"), "an object would land in kubectl's current namespace"


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_every_overlays_daemonset_arguments_parse_with_nvdash(
        rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    settings = daemonset_settings(rendered[overlay])
    pods = overlay in ("pods", "kube-prometheus-stack")
    assert (settings.metrics_pods, settings.metrics_processes) == (pods, pods)
    spec = only(rendered[overlay], "DaemonSet")["spec"]["template"]["spec"]
    assert spec.get("hostPID", False) is pods
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == GFD_LABEL
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (container,) = spec["containers"]
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    # What pod labels and processes read is mounted where nvdash is told to read it, and only then.
    assert (str(Path(settings.kubelet_socket).parent) in mounts) is pods
    assert (settings.pod_log_dir in mounts) is pods
    assert settings.history_path is not None
    assert str(Path(settings.history_path).parent) in mounts


def test_the_plain_overlay_is_the_base_alone(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert sorted(item["kind"] for item in rendered["plain"]) == ["DaemonSet", "Namespace", "Service"]
    spec = only(rendered["plain"], "DaemonSet")["spec"]["template"]["spec"]
    assert {volume["name"] for volume in spec["volumes"]} == {"history", "tmp"}


# --- the Prometheus Operator ----------------------------------------------------------------------------------


def test_the_operators_objects_validate_against_its_crd_schemas(
        rendered: dict[str, list[dict[str, Any]]], crd_validators: dict[str, jsonschema.protocols.Validator]) -> None:
    for overlay in ("prometheus-operator", "kube-prometheus-stack"):
        custom = [item for item in rendered[overlay] if item["apiVersion"] == "monitoring.coreos.com/v1"]
        assert sorted(item["kind"] for item in custom) == ["PrometheusRule"] * len(RULE_FILES) + ["ServiceMonitor"]
        for item in custom:
            assert not crd_errors(crd_validators, item), (overlay, item["metadata"]["name"])
    for overlay in ("plain", "pods", "grafana"):
        assert not [item for item in rendered[overlay] if item["apiVersion"].startswith("monitoring.coreos.com")]


def test_the_crd_schema_check_catches_a_misspelt_field_or_a_wrong_type(
        rendered: dict[str, list[dict[str, Any]]], crd_validators: dict[str, jsonschema.protocols.Validator]) -> None:
    monitor = copy.deepcopy(only(rendered["prometheus-operator"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    assert any("'honourLabels' was unexpected" in error for error in crd_errors(crd_validators, monitor))
    rule = copy.deepcopy(rendered["prometheus-operator"][[item["kind"] for item in rendered["prometheus-operator"]]
                                                           .index("PrometheusRule")])
    rule["spec"]["groups"][0]["rules"][0]["for"] = 5
    assert any("is not of type 'string'" in error for error in crd_errors(crd_validators, rule))
    del rule["spec"]["groups"][0]["name"]
    assert any("'name' is a required property" in error for error in crd_errors(crd_validators, rule))


def test_each_prometheusrule_holds_its_rule_files_groups(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rules = {item["metadata"]["name"]: item for item in rendered["prometheus-operator"]
             if item["kind"] == "PrometheusRule"}
    assert sorted(rules) == sorted(RULE_FILES)
    for name, path in RULE_FILES.items():
        groups = yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        assert rules[name]["spec"] == {"groups": groups}, name
        assert sum(len(group["rules"]) for group in groups) > 0


def test_the_operators_objects_carry_the_release_label_that_kube_prometheus_stack_selects(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    custom = [item for item in rendered["kube-prometheus-stack"] if item["apiVersion"] == "monitoring.coreos.com/v1"]
    assert len(custom) == len(RULE_FILES) + 1
    for item in custom:
        assert item["metadata"]["labels"]["release"] == RELEASE["release"], item["metadata"]["name"]


def readme_block(marker: str) -> str:
    """The fenced code block of README.md that follows the line ``marker``."""
    text = README.read_text(encoding="utf-8")
    match = re.search(re.escape(marker) + r"\n+```\w*\n(?P<block>.*?)```", text, re.DOTALL)
    assert match, f"no code block after {marker!r} in {README}"
    return match.group("block")


def test_the_readmes_release_label_patch_relabels_the_operators_objects(kubectl: Path, tmp_path: Path) -> None:
    block = readme_block("<!-- release label overlay -->")
    overlay = kustomize.write_overlay(tmp_path / "mine", resources=[kustomize.OVERLAYS / "kube-prometheus-stack"],
                                      extra=patches_of(block))
    objects = kustomize.build(overlay, kubectl)
    labels = {(item["kind"], item["metadata"]["name"]): item["metadata"]["labels"].get("release")
              for item in objects if item["apiVersion"] == "monitoring.coreos.com/v1"}
    assert set(labels.values()) == {"prometheus"}, labels
    assert len(labels) == len(RULE_FILES) + 1
    # The patch touches the operator's objects only.
    assert all("release" not in item["metadata"].get("labels", {}) for item in objects
               if item["apiVersion"] != "monitoring.coreos.com/v1")


def patches_of(block: str) -> str:
    """The ``patches:`` section of a kustomization shown in README.md."""
    document = yaml.safe_load(block)
    assert set(document) >= {"resources", "patches"}, document
    return str(yaml.safe_dump({"patches": document["patches"]}, sort_keys=False))


# --- Grafana ----------------------------------------------------------------------------------------------------


def test_the_dashboard_configmap_holds_the_dashboard_for_grafanas_sidecar(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay in ("grafana", "kube-prometheus-stack"):
        config_map = only(rendered[overlay], "ConfigMap")
        assert config_map["metadata"]["name"] == "nvdash-grafana-dashboard"
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert list(config_map["data"]) == ["nvdash.json"]
        assert json.loads(config_map["data"]["nvdash.json"]) == json.loads(DASHBOARD.read_text(encoding="utf-8"))
        # `kubectl apply` (client-side) stores the object in an annotation, and annotations may hold 256 KiB.
        assert len(json.dumps(config_map, separators=(",", ":"))) < 256 * 1024
    assert not [item for item in rendered["plain"] if item["kind"] == "ConfigMap"]


# --- the generated files ----------------------------------------------------------------------------------------


def test_the_generated_files_are_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(kustomize.KUBERNETES / "generate.py"), "--check"],
                            capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        pytest.fail(f"{result.stderr.strip()}\n(the rule files or the dashboard changed: run "
                    "python deploy/kubernetes/generate.py and commit what it writes)", pytrace=False)


def copy_sources(root: Path) -> Path:
    """The files generate.py reads and writes, copied under ``root``."""
    for relative in ("deploy/prometheus", "deploy/grafana", "deploy/kubernetes/components"):
        shutil.copytree(ROOT / relative, root / relative)
    return root


def test_the_check_names_a_stale_file_and_generating_again_fixes_it(tmp_path: Path) -> None:
    generator = load_generator()
    root = copy_sources(tmp_path)
    assert generator.main(["--check", "--root", str(root)]) == 0
    rules = root / "deploy" / "prometheus" / "nvdash-quota-alerts.yml"
    rules.write_text(rules.read_text(encoding="utf-8").replace("for: 5m", "for: 7m", 1), encoding="utf-8")
    dashboard = root / "deploy" / "grafana" / "nvdash.json"
    dashboard.write_text(dashboard.read_text(encoding="utf-8").replace('"nvdash-gpus"', '"nvdash-gpus-2"'),
                         encoding="utf-8")
    assert generator.stale(root) == [root / generator.PROMETHEUS_RULE, root / generator.DASHBOARD_COPY]
    result = subprocess.run([sys.executable, str(kustomize.KUBERNETES / "generate.py"), "--check", "--root",
                             str(root)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert f"{root / generator.PROMETHEUS_RULE} is out of date: run python deploy/kubernetes/generate.py" \
        in result.stderr.splitlines()
    assert generator.main(["--root", str(root)]) == 0
    assert generator.stale(root) == []
    written = list(yaml.safe_load_all((root / generator.PROMETHEUS_RULE).read_text(encoding="utf-8")))
    quota = next(item for item in written if item["metadata"]["name"] == "nvdash-quota-alerts")
    assert quota["spec"]["groups"] == yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
    assert "7m" in {rule.get("for") for group in quota["spec"]["groups"] for rule in group["rules"]}


def test_a_rule_file_that_is_not_only_groups_is_refused_in_one_line(tmp_path: Path) -> None:
    root = copy_sources(tmp_path)
    rules = root / "deploy" / "prometheus" / "nvdash-alerts.yml"
    rules.write_text(rules.read_text(encoding="utf-8") + "extra: 1\n", encoding="utf-8")
    result = subprocess.run([sys.executable, str(kustomize.KUBERNETES / "generate.py"), "--root", str(root)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, result.stderr) == (
        1, "generate.py: nvdash-alerts.yml: a rule file holds one top-level key, groups\n")


# --- composing components ---------------------------------------------------------------------------------------


def test_every_component_composes_and_the_optional_ones_do_what_they_say(kubectl: Path, tmp_path: Path) -> None:
    components = [kustomize.COMPONENTS / name for name in
                  ("pods", "prometheus-operator", "grafana", *OPTIONAL_COMPONENTS)]
    assert sorted(path.name for path in kustomize.COMPONENTS.iterdir()) == sorted(path.name for path in components)
    objects = kustomize.build(kustomize.write_overlay(tmp_path / "all", components=components), kubectl)
    daemonset = only(objects, "DaemonSet")
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(daemonset, version, strict=True)
    spec = daemonset["spec"]["template"]["spec"]
    # gpu-node-affinity: no nodeSelector; any one of the labels places the pod, GFD's among them.
    assert "nodeSelector" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in \
        [expression for term in terms for expression in term["matchExpressions"]]
    assert len(terms) >= 3
    # tolerate-all-taints: one toleration with no key, which tolerates every taint.
    assert spec["tolerations"] == [{"operator": "Exists"}]
    # all-gpus-by-volume-mount: /dev/null at the path the container toolkit reads the requested GPUs from.
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    (container,) = spec["containers"]
    (mount,) = [mount for mount in container["volumeMounts"] if mount["mountPath"].startswith("/var/run/nvidia")]
    assert mount["mountPath"] == "/var/run/nvidia-container-devices/all"
    assert volumes[mount["name"]]["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
    # Still no GPU taken from a workload, and pods' mounts kept beside the new one.
    assert not any(key.startswith("nvidia.com/") for section in container["resources"].values() for key in section)
    assert {"/var/lib/kubelet/pod-resources", "/var/log/pods", "/var/lib/nvdash"} <= \
        {mount["mountPath"] for mount in container["volumeMounts"]}
    assert daemonset_settings(objects).metrics_pods is True


def test_an_overlay_that_renames_the_namespace_moves_every_object(kubectl: Path, tmp_path: Path) -> None:
    overlay = kustomize.write_overlay(tmp_path / "renamed", resources=[kustomize.OVERLAYS / "kube-prometheus-stack"],
                                      extra="namespace: gpu-monitoring\n")
    objects = kustomize.build(overlay, kubectl)
    assert only(objects, "Namespace")["metadata"]["name"] == "gpu-monitoring"
    assert {item["metadata"]["namespace"] for item in objects if item["kind"] != "Namespace"} == {"gpu-monitoring"}
    # The ServiceMonitor names no namespace of its own: it finds the Service in the new one.
    assert "namespaceSelector" not in only(objects, "ServiceMonitor")["spec"]
