"""The ``--prometheus-*`` access options: what they build, their one-line errors, the selector added to every series
the cluster views select, the credential files re-read when they change, and long queries sent as POST."""

from __future__ import annotations

import base64
import os
import re
import urllib.parse
from pathlib import Path

import pytest

from nvdash.cluster import open_cluster
from nvdash.cluster.access import Credentials, PrometheusAccess, SecretFile, read_bearer_token
from nvdash.cluster.history import METRICS, PrometheusHistory
from nvdash.cluster.model import DEFAULT_QUERIES, cluster_queries
from nvdash.cluster.nodes import detail_queries, node_queries
from nvdash.cluster.pod_history import SM_SHARE, pod_expression
from nvdash.cluster.promapi import MAX_GET_URL, PrometheusClient
from nvdash.cluster.selectors import HOST_LABELS, SelectorError, SeriesScope, parse_matchers
from nvdash.server.options import UsageError, parse_settings

URL = "http://prometheus.example:9090"


def settings_of(*argv: str) -> PrometheusAccess:
    return parse_settings(["--simulate", "none", "--prometheus", URL, *argv], {}).prometheus_access


def refusal(*argv: str, url: bool = True) -> str:
    with pytest.raises(UsageError) as raised:
        parse_settings(["--simulate", "none", *(["--prometheus", URL] if url else []), *argv], {})
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_the_options_build_the_access(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    access = settings_of("--prometheus-bearer-token-file", str(token), "--prometheus-header", "X-Scope-OrgID: team-a",
                         "--prometheus-header", "X-Extra:  two words ", "--prometheus-host-label", "node",
                         "--prometheus-selector", "job='nvdash' , cluster=~\"gpu-.*\"")
    assert access.bearer_token_file == str(token)
    assert access.headers == (("X-Scope-OrgID", "team-a"), ("X-Extra", "two words"))
    assert access.scope == SeriesScope("node", ("job='nvdash'", 'cluster=~"gpu-.*"'))
    assert Credentials(access).headers() == {"Authorization": "Bearer s3cret-token"}
    assert parse_settings(["--simulate", "none"], {}).prometheus_access == PrometheusAccess()


def test_basic_auth_file_gives_the_basic_header(tmp_path: Path) -> None:
    basic = tmp_path / "basic"
    basic.write_text("alice:pa ss:word\n")
    access = settings_of("--prometheus-basic-auth-file", str(basic))
    expected = base64.b64encode(b"alice:pa ss:word").decode()
    assert Credentials(access).headers() == {"Authorization": f"Basic {expected}"}


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    empty, token, junk = tmp_path / "empty", tmp_path / "token", tmp_path / "junk.pem"
    empty.write_text("  \n")
    token.write_text("abc\n")
    junk.write_text("not a certificate\n")
    missing = str(tmp_path / "missing")
    assert refusal("--prometheus-bearer-token-file", missing) == (
        f"--prometheus-bearer-token-file: cannot read {missing}: No such file or directory")
    assert refusal("--prometheus-bearer-token-file", str(empty)) == f"--prometheus-bearer-token-file: {empty} is empty"
    two = tmp_path / "two"
    two.write_text("abc\ndef\n")
    assert "more than one token" in refusal("--prometheus-bearer-token-file", str(two))
    nouser = tmp_path / "nouser"
    nouser.write_text("justapassword\n")
    assert "must hold user:password" in refusal("--prometheus-basic-auth-file", str(nouser))
    assert refusal("--prometheus-basic-auth-file", str(empty)) == f"--prometheus-basic-auth-file: {empty} is empty"
    assert refusal("--prometheus-ca-file", str(junk)) == f"--prometheus-ca-file: {junk} holds no PEM certificate"
    assert refusal("--prometheus-ca-file", missing).startswith(f"--prometheus-ca-file: cannot read {missing}")
    assert refusal("--prometheus-header", "X-Scope-OrgID team-a").startswith(
        "--prometheus-header must be 'Name: value'")
    assert refusal("--prometheus-header", "Bad Name: x").startswith("--prometheus-header must be 'Name: value'")
    assert "non-empty" in refusal("--prometheus-header", "X-Scope-OrgID:")
    assert "non-empty" in refusal("--prometheus-header", "X-A: a\rInjected: b")
    assert refusal("--prometheus-header", "Host: other") == "--prometheus-header: nvdash writes Host itself"
    assert refusal("--prometheus-header", "X-A: 1", "--prometheus-header", "x-a: 2") == (
        "--prometheus-header x-a is given twice")
    assert refusal("--prometheus-bearer-token-file", str(token), "--prometheus-header", "Authorization: Bearer x") == (
        "--prometheus-header Authorization contradicts the credentials file")
    assert refusal("--prometheus-bearer-token-file", str(token), "--prometheus-basic-auth-file", str(token)) == (
        "give --prometheus-bearer-token-file or --prometheus-basic-auth-file, not both")
    assert "contradict" in refusal("--prometheus-ca-file", str(junk), "--prometheus-insecure-skip-verify")
    assert refusal("--prometheus-bearer-token-file", str(token), url=False) == (
        "--prometheus-bearer-token-file needs --prometheus")
    assert refusal("--prometheus-selector", 'job="nvdash"', url=False) == "--prometheus-selector needs --prometheus"
    assert refusal("--prometheus-host-label", "host-name").startswith(
        "--prometheus-host-label: 'host-name' is not a Prometheus label name")
    for bad in ('job=nvdash', 'job="nvdash', 'job=="x"', '1job="x"', 'job="a" cluster="b"', 'job=~"("'):
        assert refusal("--prometheus-selector", bad).startswith("--prometheus-selector: "), bad
    assert refusal("--prometheus-selector", " ") == (
        "--prometheus-selector is empty (leave it out to select every series)")


def test_matchers_parse_every_operator_and_quote() -> None:
    assert parse_matchers('{job="nvdash", cluster!~`a|b`, zone!="x\\"y",team=~\'ml\'}') == (
        'job="nvdash"', "cluster!~`a|b`", 'zone!="x\\"y"', "team=~'ml'")
    with pytest.raises(SelectorError, match="cannot read"):
        parse_matchers('job="a",,x="b"')


SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\{([^}]*)\}")
NAMES = re.compile(r"\b(?:DCGM_FI_\w+|nvdash_\w+)\b")


def assert_every_series_scoped(promql: str, matcher: str) -> None:
    """Every series selector of ``promql`` carries ``matcher``, and no metric is named outside a selector."""
    selectors = list(SELECTOR.finditer(promql))
    assert selectors, promql
    for found in selectors:
        assert matcher in found.group(2), (found.group(0), promql)
    bare = SELECTOR.sub("", promql)
    assert not NAMES.findall(bare), (NAMES.findall(bare), promql)


def test_every_query_of_the_cluster_views_carries_the_selector() -> None:
    scope = SeriesScope(matchers=('job="nvdash"',))
    for promql in cluster_queries(scope).all():
        assert_every_series_scoped(promql, 'job="nvdash"')
    history = PrometheusHistory(PrometheusClient(URL), "node-a", scope)
    for metric in METRICS.values():
        assert_every_series_scoped(history.expression("avg_over_time", metric, "60s", [0, 1]), 'job="nvdash"')
    assert_every_series_scoped(pod_expression(SM_SHARE, "ns", "pod", 60.0, scope), 'job="nvdash"')
    # Without a selector nothing changes: either host label, no extra matcher.
    assert cluster_queries(SeriesScope()) == DEFAULT_QUERIES
    assert "job=" not in " ".join(DEFAULT_QUERIES.all())


def test_a_host_label_of_its_own_is_the_only_one_asked() -> None:
    scope = SeriesScope(host_label="node")
    assert scope.host_labels == ("node",)
    assert SeriesScope().host_labels == HOST_LABELS
    assert cluster_queries(scope).seen.startswith("group by (node, gpu, UUID, modelName) (")
    expression = PrometheusHistory(PrometheusClient(URL), "n1", scope).expression(
        "avg_over_time", METRICS["temperature_c"], "60s", None)
    assert 'node="n1"' in expression
    assert "Hostname" not in expression
    assert "hostname" not in expression


def test_a_group_label_reaches_the_queries_that_name_nodes_and_gpus() -> None:
    assert settings_of("--prometheus-group-label", "rack").scope == SeriesScope(group_label="rack")
    assert settings_of().scope.group_label == ""
    scope = SeriesScope(group_label="rack")
    queries = cluster_queries(scope)
    assert queries.gpus.startswith("max by (__name__, Hostname, hostname, gpu, UUID, modelName, rack) (")
    assert queries.seen.startswith("group by (Hostname, hostname, gpu, UUID, modelName, rack) (")
    assert node_queries(scope).reporting.startswith(
        "count by (Hostname, hostname, modelName, rack) (group by (Hostname, hostname, gpu, modelName, rack) (")
    assert detail_queries(scope, ["a"])[0].startswith(
        "max by (__name__, Hostname, hostname, gpu, UUID, modelName, rack)")
    assert refusal("--prometheus-group-label", "rack-id").startswith(
        "--prometheus-group-label: 'rack-id' is not a Prometheus label name")
    assert refusal("--prometheus-group-label", "Hostname") == (
        "--prometheus-group-label Hostname names a node or a GPU, not a group of nodes")
    assert refusal("--prometheus-group-label", "rack", url=False) == "--prometheus-group-label needs --prometheus"


def test_a_rotated_token_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    secret = SecretFile(str(path), read_bearer_token)
    assert secret.value() == "first"
    replacement = tmp_path / "token.new"
    replacement.write_text("second\n")
    os.replace(replacement, path)  # how a Kubernetes secret volume swaps its files
    assert secret.value() == "second"
    # A broken new version keeps the last good token (and the secret never reaches the message).
    path.write_text("")
    assert secret.value() == "second"
    assert not secret.reload()


def test_a_long_query_is_posted_as_a_form() -> None:
    client = PrometheusClient(URL, headers={"X-Scope-OrgID": "team-a"})
    short = client.request("/api/v1/query", {"query": "up"})
    assert short.get_method() == "GET"
    assert short.full_url == f"{URL}/api/v1/query?query=up"
    assert short.get_header("X-scope-orgid") == "team-a"
    query = "up{job=~\"" + "|".join(f"job-{index}" for index in range(800)) + "\"}"
    long = client.request("/api/v1/query_range", {"query": query, "step": "15"})
    assert len(f"{URL}/api/v1/query_range?query={query}") > MAX_GET_URL
    assert long.get_method() == "POST"
    assert long.full_url == f"{URL}/api/v1/query_range"
    assert long.get_header("Content-type") == "application/x-www-form-urlencoded"
    assert isinstance(long.data, bytes)
    assert urllib.parse.parse_qs(long.data.decode("ascii"), strict_parsing=True) == {"query": [query], "step": ["15"]}


def test_the_timeout_is_seconds_above_0_and_at_most_120(tmp_path: Path) -> None:
    assert settings_of().timeout_s == 5.0
    assert settings_of("--prometheus-timeout", "30").timeout_s == 30.0
    assert settings_of("--prometheus-timeout", "0.5").timeout_s == 0.5
    assert settings_of("--prometheus-timeout", "120").timeout_s == 120.0
    for bad in ("0", "-1", "120.5", "nan", "inf"):
        assert refusal(f"--prometheus-timeout={bad}") == (
            f"--prometheus-timeout must be a number of seconds above 0 and at most 120, not {float(bad):g}")
    assert refusal("--prometheus-timeout", "abc") == "argument --prometheus-timeout: invalid float value: 'abc'"
    assert refusal("--prometheus-timeout", "30", url=False) == "--prometheus-timeout needs --prometheus"


def test_the_timeout_comes_from_the_environment_or_the_config_file(tmp_path: Path) -> None:
    argv = ["--simulate", "none", "--prometheus", URL]
    assert parse_settings(argv, {"NVDASH_PROMETHEUS_TIMEOUT": "45"}).prometheus_access.timeout_s == 45.0
    config = tmp_path / "nvdash.toml"
    config.write_text("[cluster]\nprometheus-timeout = 60\n")
    assert parse_settings([*argv, "--config", str(config)], {}).prometheus_access.timeout_s == 60.0
    assert parse_settings([*argv, "--config", str(config)],
                          {"NVDASH_PROMETHEUS_TIMEOUT": "7.5"}).prometheus_access.timeout_s == 7.5
    config.write_text("[cluster]\nprometheus-timeout = 600\n")
    with pytest.raises(UsageError) as raised:
        parse_settings([*argv, "--config", str(config)], {})
    assert str(raised.value) == ("--prometheus-timeout must be a number of seconds above 0 and at most 120, not 600 "
                                 f"(in {config}, key cluster.prometheus-timeout)")
    with pytest.raises(UsageError) as raised:
        parse_settings(argv, {"NVDASH_PROMETHEUS_TIMEOUT": "never"})
    assert str(raised.value) == ("argument --prometheus-timeout: invalid float value: 'never' "
                                 "(from $NVDASH_PROMETHEUS_TIMEOUT)")


def test_the_client_of_the_cluster_runtime_takes_the_timeout() -> None:
    cluster = open_cluster(URL, access=settings_of("--prometheus-timeout", "42"))
    try:
        assert cluster.client.timeout_s == 42.0
    finally:
        cluster.close()
