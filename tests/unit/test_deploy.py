"""Offline checks of the deployment files: the Kubernetes objects of ``deploy/kubernetes``'s kube-prometheus-stack
overlay as ``kubectl kustomize`` renders them (validated against the Kubernetes OpenAPI schemas that
``kubernetes-validate`` bundles, and against each other and nvdash's own command line; tests/unit/test_kustomize.py
checks every overlay) and the Grafana dashboard in ``deploy/grafana`` (its layout, its variables, the families its
queries read, and PromQL that promtool parses)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]
from kubernetes_validate.utils import all_versions  # type: ignore[import-untyped]

from nvdash.metrics.counters import default_counters
from nvdash.metrics.fields import FAMILIES
from nvdash.server.options import ENV_TOKEN, parse_settings
from nvdash.settings import Settings
from tests import grafana_queries as grafana
from tests import kustomize
from tests.unit.test_metrics_dcgm_parity import DCGM_EXPORTER_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
FULL_OVERLAY = kustomize.OVERLAYS / "kube-prometheus-stack"
"""The overlay with every component: pod labels, the Prometheus Operator's objects and the Grafana dashboard."""
APP = ROOT / "nvdash" / "server" / "app.py"

BUILT_IN_KINDS = ("Namespace", "DaemonSet", "Service", "ConfigMap")
"""Kinds whose schema is part of Kubernetes' OpenAPI (the ServiceMonitor and PrometheusRule are CRDs: checked
against the Prometheus Operator's schemas in tests/unit/test_kustomize.py)."""
KUBERNETES_VERSIONS = sorted({".".join(version.split(".")[:2]) for version in all_versions()},
                             key=lambda version: tuple(int(part) for part in version.split(".")))
"""Every Kubernetes minor version whose schemas the installed kubernetes-validate bundles (1.25 to 1.37 in its
1.37.0)."""
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
POD_LOGS = "/var/log/pods"
HISTORY_DIR = "/var/lib/nvdash"
NODE_NAME = "gpu-node-1"

DEFAULT_FAMILIES = frozenset(counter.name for counter in default_counters() if counter.kind != "label")
"""The families a plain nvdash exports (the pod and process families once their flags are given)."""
FAMILY = re.compile(r"\b(?:DCGM_FI_\w+|nvdash_\w+)\b")
SELECTOR = re.compile(r"(?P<family>\b(?:DCGM_FI_\w+|nvdash_\w+)\b)(?P<matchers>\{[^}]*\})?")
SCOPE_VARIABLES = ("cluster", "job", "instance", "Hostname", "gpu")
"""The dashboard's chained variables, widest first: every query and every later variable filters on them."""
PER_GPU_MATCHERS = tuple(f'{name}=~"${name}"' for name in SCOPE_VARIABLES)
VARIABLE_FAMILY = "DCGM_FI_DEV_GPU_TEMP"
"""The family the variables list their values from: every GPU has it (in MIG mode too), and dcgm-exporter's default
counters export it, so the dashboard works on dcgm-exporter's series as well as nvdash's."""
GROUPING = re.compile(r"^(?:topk\(\d+, )?\w+ by \((?P<labels>[^)]*)\)")
PLAIN = re.compile(r"^(?:topk\(\d+, )?max by \([^)]*\) \((?P<family>\w+)\{[^}]*\}\)\)?$")
"""A target that only picks one family per GPU (``max by (...) (FAMILY{...})``): its values are in the family's
unit."""
UNITS = {
    "DCGM_FI_DEV_GPU_UTIL": "percent",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "percent",
    "DCGM_FI_DEV_FB_USED": "mbytes",  # MiB: Grafana's mebibytes (decmbytes would be 10^6 bytes)
    "DCGM_FI_DEV_FB_FREE": "mbytes",
    "DCGM_FI_DEV_GPU_TEMP": "celsius",
    "DCGM_FI_DEV_MEMORY_TEMP": "celsius",
    "DCGM_FI_DEV_POWER_USAGE": "watt",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "watt",
    "DCGM_FI_DEV_SM_CLOCK": "rotmhz",
    "DCGM_FI_DEV_MEM_CLOCK": "rotmhz",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "percentunit",
    "DCGM_FI_PROF_SM_ACTIVE": "percentunit",
    "DCGM_FI_PROF_SM_OCCUPANCY": "percentunit",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "percentunit",
    "DCGM_FI_PROF_DRAM_ACTIVE": "percentunit",
    "nvdash_pcie_transmit_bytes_per_second": "Bps",
    "nvdash_pcie_receive_bytes_per_second": "Bps",
    "nvdash_nvlink_transmit_bytes_per_second": "Bps",
    "nvdash_nvlink_receive_bytes_per_second": "Bps",
    "nvdash_process_gpu_memory_bytes": "bytes",
    "nvdash_process_sm_utilization_ratio": "percentunit",
}
"""The Grafana unit of each family's values (dcgm-exporter's units: MiB, °C, W, MHz, ratios 0-1)."""


# --- Kubernetes ---------------------------------------------------------------------------------------------------


def manifests() -> dict[str, dict[str, Any]]:
    """The full overlay's objects by kind, for the kinds it has once (it has a PrometheusRule per rule file)."""
    grouped = kustomize.by_kind(kustomize.build(FULL_OVERLAY))
    return {kind: objects[0] for kind, objects in grouped.items() if len(objects) == 1}


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return manifests()


def pod_spec(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = docs["DaemonSet"]["spec"]["template"]["spec"]
    return spec


def container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["nvdash"]
    return dict(containers[0])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def test_the_manifests_are_one_namespace_with_a_daemonset_service_and_servicemonitor(
        docs: dict[str, dict[str, Any]]) -> None:
    objects = kustomize.build(FULL_OVERLAY)
    assert sorted((item["kind"], item["metadata"]["name"]) for item in objects) == sorted([
        ("Namespace", "nvdash"), ("DaemonSet", "nvdash"), ("Service", "nvdash"), ("ServiceMonitor", "nvdash"),
        ("PrometheusRule", "nvdash-alerts"), ("PrometheusRule", "nvdash-quota-alerts"),
        ("PrometheusRule", "nvdash-recording-rules"),
        ("ConfigMap", "nvdash-grafana-dashboard")])
    namespace = docs["Namespace"]["metadata"]["name"]
    assert namespace == "nvdash"
    for item in objects:
        if item["kind"] != "Namespace":
            assert item["metadata"]["namespace"] == namespace, item["kind"]
    # hostPID and hostPath volumes are refused by the baseline Pod Security Standard.
    assert docs["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.parametrize("kind", BUILT_IN_KINDS)
def test_built_in_kinds_validate_against_the_kubernetes_schemas(docs: dict[str, dict[str, Any]], kind: str) -> None:
    assert len(KUBERNETES_VERSIONS) >= 5, f"kubernetes-validate bundles only {KUBERNETES_VERSIONS}"
    failures = []
    for version in KUBERNETES_VERSIONS:
        try:
            validated = kubernetes_validate.validate(docs[kind], version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"Kubernetes {version}: {'.'.join(map(str, error.path))}: {error.message}")
        else:
            assert validated == version
    assert not failures, f"{kind}:\n" + "\n".join(failures)


@pytest.mark.parametrize(("path", "value", "complaint"), [
    (("spec", "template", "spec", "containers", 0, "readinessprobe"), {}, "'readinessprobe' was unexpected"),
    (("spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"), "8000", "is not of type 'integer'"),
    (("spec", "template", "spec", "hostPid"), True, "'hostPid' was unexpected"),
])
def test_the_schema_check_catches_a_misspelt_field_or_a_wrong_type(
        docs: dict[str, dict[str, Any]], path: tuple[str | int, ...], value: Any, complaint: str) -> None:
    broken = copy.deepcopy(docs["DaemonSet"])
    parent: Any = broken
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError, match=re.escape(complaint)):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_servicemonitor_has_what_the_prometheus_operator_requires(docs: dict[str, dict[str, Any]]) -> None:
    monitor = docs["ServiceMonitor"]
    service = docs["Service"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["name"]
    spec = monitor["spec"]
    assert matches(spec["selector"]["matchLabels"], service["metadata"]["labels"]), "it selects no Service"
    # No namespaceSelector: the ServiceMonitor's own namespace, the Service's in any overlay's namespace.
    assert "namespaceSelector" not in spec
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    port_names = {port["name"] for port in service["spec"]["ports"]}
    assert len(spec["endpoints"]) == 1
    endpoint = spec["endpoints"][0]
    assert endpoint["port"] in port_names
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s"
    assert endpoint.get("scheme", "http") == "http"
    # nvdash's namespace/pod/container (the pod using a GPU) win over the operator's target labels.
    assert endpoint["honorLabels"] is True


def test_the_servicemonitor_drops_only_the_targets_own_pod_labels(docs: dict[str, dict[str, Any]]) -> None:
    relabelings = docs["ServiceMonitor"]["spec"]["endpoints"][0]["relabelings"]
    assert [rule["action"] for rule in relabelings] == ["labeldrop"]
    dropped = re.compile(f"^(?:{relabelings[0]['regex']})$")  # Prometheus anchors relabeling regexes
    for label in ("namespace", "pod", "container"):
        assert dropped.match(label), label
    for label in ("Hostname", "gpu", "UUID", "instance", "job", "pod_name", "node"):
        assert not dropped.match(label), label


def test_the_service_is_headless_and_reaches_the_daemonsets_pods(docs: dict[str, dict[str, Any]]) -> None:
    service = docs["Service"]["spec"]
    assert service["clusterIP"] == "None"
    template_labels = docs["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert matches(service["selector"], template_labels)
    assert matches(docs["DaemonSet"]["spec"]["selector"]["matchLabels"], template_labels)
    container_ports = {port["name"]: port["containerPort"] for port in container(docs)["ports"]}
    assert container_ports == {"metrics": 8000}
    (port,) = service["ports"]
    assert port["name"] == "metrics"
    assert port["targetPort"] in container_ports
    assert port["port"] == container_ports[port["targetPort"]]


def test_the_daemonset_runs_on_gpu_nodes_with_the_nvidia_runtime(docs: dict[str, dict[str, Any]]) -> None:
    spec = pod_spec(docs)
    assert spec["hostPID"] is True
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    env = {item["name"]: item for item in container(docs)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # nvdash watches the GPUs; it must not take one from a workload.
    resources = container(docs)["resources"]
    for section in ("requests", "limits"):
        assert set(resources[section]) == {"cpu", "memory"}, section
        assert not any(key.startswith("nvidia.com/") for key in resources[section])


def test_every_mount_names_a_volume_and_the_host_paths_are_right(docs: dict[str, dict[str, Any]]) -> None:
    volumes = {volume["name"]: volume for volume in pod_spec(docs)["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container(docs)["volumeMounts"]}
    orphans = sorted(mount["name"] for mount in mounts.values() if mount["name"] not in volumes)
    assert not orphans, f"mounts of volumes that do not exist: {orphans}"
    expected = {  # mount path: (host path, hostPath type, read-only)
        POD_RESOURCES: (POD_RESOURCES, "Directory", True),
        POD_LOGS: (POD_LOGS, "Directory", True),
        HISTORY_DIR: (HISTORY_DIR, "DirectoryOrCreate", False),
    }
    for path, (host_path, host_type, read_only) in expected.items():
        mount = mounts[path]
        host = volumes[mount["name"]]["hostPath"]
        assert (host["path"], host["type"], mount.get("readOnly", False)) == (host_path, host_type, read_only), path
    host_paths = {volume["hostPath"]["path"] for volume in volumes.values() if "hostPath" in volume}
    assert host_paths == {POD_RESOURCES, POD_LOGS, HISTORY_DIR}, "no other host path is mounted"


def test_the_container_is_locked_down_and_writes_only_to_writable_mounts(docs: dict[str, dict[str, Any]]) -> None:
    security = container(docs)["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    assert pod_spec(docs)["automountServiceAccountToken"] is False
    writable = {mount["mountPath"] for mount in container(docs)["volumeMounts"] if not mount.get("readOnly")}
    settings = container_settings(docs)
    assert settings.history_path is not None
    assert str(PurePosixPath(settings.history_path).parent) in writable, "the history would hit a read-only disk"


def substitute_env(argument: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(NAME)`` expansion of an argument (unknown names stay as they are)."""
    return re.sub(r"\$\((\w+)\)", lambda match: env.get(match.group(1), match.group(0)), argument)


def container_env(docs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The container's environment as the kubelet sets it, on node ``NODE_NAME``."""
    env = {}
    for item in container(docs)["env"]:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif item["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName":
            env[item["name"]] = NODE_NAME
    return env


def container_settings(docs: dict[str, dict[str, Any]]) -> Settings:
    """The container's command line parsed by nvdash's own parser (a renamed flag fails here)."""
    env = container_env(docs)
    arguments = [substitute_env(str(argument), env) for argument in container(docs)["args"]]
    assert not any("$(" in argument for argument in arguments), arguments
    return parse_settings(arguments, environ=env)


def test_the_command_is_nvdash_serve(docs: dict[str, dict[str, Any]]) -> None:
    (script,) = entry_points(group="console_scripts", name="nvdash")
    assert script.value == "nvdash.cli:main"
    assert container(docs)["command"] == ["nvdash", "serve"]


def test_the_container_arguments_parse_with_nvdashs_cli(docs: dict[str, dict[str, Any]]) -> None:
    settings = container_settings(docs)
    assert settings.host == "0.0.0.0"
    assert settings.port == container(docs)["ports"][0]["containerPort"]
    assert settings.hostname == NODE_NAME
    assert settings.metrics_pods is True
    assert settings.metrics_processes is True
    assert settings.simulate is None
    assert settings.kubelet_socket == f"{POD_RESOURCES}/kubelet.sock"
    assert settings.pod_log_dir == POD_LOGS
    assert settings.history is True
    assert settings.history_path == f"{HISTORY_DIR}/history.sqlite"


def test_the_token_comes_from_a_secret_that_prometheus_sends_too(docs: dict[str, dict[str, Any]]) -> None:
    # nvdash on 0.0.0.0 requires a token: the pod reads NVDASH_TOKEN from a Secret, and the ServiceMonitor sends
    # that Secret's value to /metrics as a bearer token (else every scrape would get 401).
    (source,) = container(docs)["envFrom"]
    secret = source["secretRef"]["name"]
    assert source["secretRef"].get("optional", False) is False  # no Secret, no pod: not a token nobody knows
    authorization = docs["ServiceMonitor"]["spec"]["endpoints"][0]["authorization"]
    assert authorization == {"type": "Bearer", "credentials": {"name": secret, "key": ENV_TOKEN}}
    with_secret = parse_settings([substitute_env(str(argument), container_env(docs))
                                  for argument in container(docs)["args"]],
                                 environ={**container_env(docs), ENV_TOKEN: "from-the-secret"})
    assert (with_secret.token, with_secret.no_token) == ("from-the-secret", False)


def test_the_probes_ask_nvdashs_health_route(docs: dict[str, dict[str, Any]]) -> None:
    # The route as nvdash's server registers it (a renamed route fails here).
    assert re.search(r'\(\s*r"/health",', APP.read_text(encoding="utf-8")), f"no /health route in {APP}"
    ports = {port["name"] for port in container(docs)["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        get = container(docs)[probe]["httpGet"]
        assert get["path"] == "/health", probe
        assert get["port"] in ports, probe


# --- Grafana ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return grafana.load()


def visible_panels(dashboard: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """The panels laid out together: the top level, then each collapsed row's own panels."""
    yield list(dashboard["panels"])
    for panel in dashboard["panels"]:
        if panel["type"] == "row" and panel.get("collapsed"):
            yield list(panel["panels"])


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in grafana.panels(dashboard) if panel["type"] != "row"]


def test_the_dashboard_is_an_importable_model(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] == "nvdash-gpus"
    assert dashboard["id"] is None
    (source,) = dashboard["__inputs"]
    assert (source["name"], source["type"], source["pluginId"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == "${DS_PROMETHEUS}"
    for panel in query_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(target["datasource"]["uid"] == "${datasource}" for target in panel["targets"]), panel["title"]
        assert panel["title"], panel
        assert panel["description"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_every_panel_has_a_unique_id_and_a_place_on_the_grid(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in grafana.panels(dashboard)]
    assert len(ids) == len(set(ids)), sorted(ids)
    for group in visible_panels(dashboard):
        cells: dict[tuple[int, int], str] = {}
        for panel in group:
            place = panel["gridPos"]
            x, y, w, h = (place[key] for key in ("x", "y", "w", "h"))
            assert all(isinstance(value, int) for value in (x, y, w, h)), panel["title"]
            assert min(x, y) >= 0, (panel["title"], place)
            assert min(w, h) > 0, (panel["title"], place)
            assert x + w <= 24, (panel["title"], place)
            for cell in ((column, row) for column in range(x, x + w) for row in range(y, y + h)):
                assert cell not in cells, f"{panel['title']!r} overlaps {cells[cell]!r}"
                cells[cell] = panel["title"]


def test_the_variables_chain_and_select_many(dashboard: dict[str, Any]) -> None:
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", *SCOPE_VARIABLES]
    assert re.search(rf"^{VARIABLE_FAMILY}\s*,\s*gauge", DCGM_EXPORTER_DEFAULTS, flags=re.MULTILINE)
    for index, name in enumerate(SCOPE_VARIABLES):
        variable = variables[name]
        # Each lists its label's values among the series the variables before it select.
        outer = ", ".join(PER_GPU_MATCHERS[:index])
        assert variable["definition"] == (f"label_values({VARIABLE_FAMILY}{{{outer}}}, {name})" if outer
                                          else f"label_values({VARIABLE_FAMILY}, {name})")
        assert variable["type"] == "query"
        assert variable["query"]["query"] == variable["definition"]
        assert variable["datasource"]["uid"] == "${datasource}"
        assert variable["multi"] is True, name
        assert variable["includeAll"] is True, name
        # .* also matches a missing label: without a cluster label, All selects everything.
        assert variable["allValue"] == ".*", name
        assert variable["current"]["value"] == ["$__all"], name


def test_all_values_select_series_without_a_cluster_label(tmp_path: Path, dashboard: dict[str, Any]) -> None:
    """promtool evaluates each query's selectors, every variable at All, on nvdash's series (no cluster label)
    and dcgm-exporter's (with a cluster label, another job): both are selected."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: the test command (bash scripts/test.sh) installs it with Debian's "
                    "prometheus package", pytrace=False)
    values = grafana.plain_values(dashboard)
    selectors = sorted({grafana.substitute(match.group(0), values) for panel in query_panels(dashboard)
                        for target in panel["targets"] for match in SELECTOR.finditer(target["expr"])
                        if match.group("family") == VARIABLE_FAMILY})
    assert selectors == [VARIABLE_FAMILY + '{cluster=~".*", job=~".*", instance=~".*", Hostname=~".*", gpu=~".*"}']
    series = [
        {"series": f'{VARIABLE_FAMILY}{{Hostname="node-a",gpu="0",instance="node-a:8000",job="nvdash"}}',
         "values": "40x5"},
        {"series": f'{VARIABLE_FAMILY}{{Hostname="node-b",cluster="west",gpu="1",instance="node-b:9400",'
                   'job="dcgm-exporter"}', "values": "50x5"},
    ]
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": f"sum by (Hostname) ({selectors[0]})", "eval_time": "5m", "exp_samples": [
            {"labels": '{Hostname="node-a"}', "value": 40}, {"labels": '{Hostname="node-b"}', "value": 50}]}],
    }]}
    path = tmp_path / "dashboard-selectors-test.yml"
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_query_uses_only_the_dashboards_variables(dashboard: dict[str, Any]) -> None:
    known = set(grafana.dashboard_variables(dashboard)) | set(grafana.BUILTINS)
    used = {name for panel in query_panels(dashboard) for target in panel["targets"]
            for name in grafana.variable_names(target["expr"])}
    assert used <= known, f"undefined variables: {sorted(used - known)}"
    assert {*SCOPE_VARIABLES, "__range", "__rate_interval"} <= used
    with pytest.raises(KeyError, match="nodes"):
        grafana.substitute('up{instance=~"$nodes"}', grafana.plain_values(dashboard))
    assert grafana.substitute('x{a=~"${Hostname:regex}", b=~"[[gpu]]"}[$__rate_interval]',
                              grafana.plain_values(dashboard)) == 'x{a=~".*", b=~".*"}[1m]'


def test_every_query_reads_families_nvdash_exports_by_default(dashboard: dict[str, Any]) -> None:
    queries = grafana.dashboard_queries()
    assert len(queries) == sum(len(panel["targets"]) for panel in query_panels(dashboard))
    variables = [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    read = {(title, family) for title, expr in queries for family in FAMILY.findall(expr)}
    read |= {("variables", family) for text in variables for family in FAMILY.findall(text)}
    assert not {item for item in read if item[1] not in FAMILIES}, "families nvdash cannot export"
    missing = sorted(item for item in read if item[1] not in DEFAULT_FAMILIES)
    assert not missing, f"families not in nvdash/metrics/default-counters.csv: {missing}"
    assert len({family for _title, family in read}) >= 35


def test_every_query_is_filtered_by_node_and_gpu(dashboard: dict[str, Any]) -> None:
    missing = []
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            selectors = list(SELECTOR.finditer(target["expr"]))
            assert selectors, (panel["title"], target["expr"])
            missing += [(panel["title"], match.group(0)) for match in selectors
                        if not all(matcher in (match.group("matchers") or "") for matcher in PER_GPU_MATCHERS)]
    assert not missing, missing


def test_per_gpu_series_are_named_by_node_and_gpu(dashboard: dict[str, Any]) -> None:
    unnamed = []
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            grouping = GROUPING.match(target["expr"])
            labels = {label.strip() for label in grouping.group("labels").split(",")} if grouping else set()
            if {"Hostname", "gpu"} <= labels and panel["type"] != "table":
                legend = target.get("legendFormat", "")
                if "{{Hostname}}" not in legend or "{{gpu}}" not in legend:
                    unnamed.append((panel["title"], legend))
    assert not unnamed, unnamed


def test_each_familys_panel_has_the_familys_unit(dashboard: dict[str, Any]) -> None:
    checked = set()
    wrong = []
    for panel in query_panels(dashboard):
        unit = panel["fieldConfig"]["defaults"].get("unit")
        for target in panel["targets"]:
            plain = PLAIN.match(target["expr"])
            if plain and plain.group("family") in UNITS:
                checked.add(plain.group("family"))
                if unit != UNITS[plain.group("family")]:
                    wrong.append((panel["title"], plain.group("family"), unit))
    assert not wrong, wrong
    assert checked == set(UNITS), f"families with no plain panel: {sorted(set(UNITS) - checked)}"


def test_range_wide_queries_are_instant(dashboard: dict[str, Any]) -> None:
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            if "__range" in grafana.variable_names(target["expr"]):
                assert target["instant"] is True, panel["title"]
                assert target["range"] is False, panel["title"]


def test_promtool_parses_every_query(tmp_path: Path, dashboard: dict[str, Any]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: the test command (bash scripts/test.sh) installs it with Debian's "
                    "prometheus package", pytrace=False)
    queries = grafana.dashboard_queries()
    values = grafana.plain_values(dashboard)
    selectors = [(f"variable {variable['name']}", grafana.substitute(text, values))
                 for variable in dashboard["templating"]["list"]
                 if (text := re.sub(r"^label_values\((.*), \w+\)$", r"\1", variable.get("definition", "")))
                 and text != variable.get("definition")]
    assert len(selectors) == len(SCOPE_VARIABLES), selectors
    checked = queries + selectors
    rules = [{"record": f"nvdash_grafana:query_{index}", "expr": expr} for index, (_title, expr) in enumerate(checked)]
    path = tmp_path / "grafana-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                            check=False)
    titles = "\n".join(f"rule {index + 1}: {title}" for index, (title, _expr) in enumerate(checked))
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{titles}"
    assert f"SUCCESS: {len(checked)} rules found" in result.stdout
