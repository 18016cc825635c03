"""The cluster views behind authentication, against a real Prometheus (Debian's package) that serves its API over
TLS with basic authentication (its own ``--web.config.file``), and a small authenticating reverse proxy in front of
it that wants a bearer token and a tenant header the way Mimir's gateway does (Prometheus 2.42 has no bearer auth).

Prometheus scrapes a real simulated nvdash node (job ``nvdash``) and, beside it, a static dcgm-exporter-like target
(job ``dcgm-exporter``) naming the same node and another one, as during a migration.
"""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from bokeh.models import ColumnDataSource, Div

from nvdash.cluster import ClusterRuntime, open_cluster
from nvdash.cluster.access import PrometheusAccess
from nvdash.cluster.model import ClusterState
from nvdash.cluster.selectors import SeriesScope
from tests.conftest import NvdashServer, free_port, get_json, nvdash_server, wait_for
from tests.prometheus_cluster import prometheus_binary
from tests.server.bokeh_viewer import open_session
from tests.unit.test_auth import make_certificate

USER, PASSWORD = "nvdash", "s3cret pass:word"
TENANT = "team-a"
STATIC_TEMP_C = 99.0
"""The dcgm-exporter target's temperature: never a simulated A100's."""
JOB_NVDASH = SeriesScope(matchers=('job="nvdash"',))


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash for Prometheus's web config (glibc's crypt, else Apache's htpasswd)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # deprecated: present up to Python 3.12

        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 10))
        if hashed and hashed.startswith("$2"):
            return hashed
    except ImportError:
        pass
    htpasswd = shutil.which("htpasswd")
    if htpasswd is None:
        pytest.fail("no bcrypt: Python's crypt module is gone and htpasswd is missing (apt-get install apache2-utils)")
    done = subprocess.run([htpasswd, "-nbBC", "10", "user", password], capture_output=True, text=True, check=True,
                          timeout=60)
    return done.stdout.strip().partition(":")[2]


def static_exposition() -> str:
    """A dcgm-exporter naming node-a's GPU 0 (as nvdash does) and a node nvdash never scrapes."""
    lines = []
    for host in ("node-a", "node-z"):
        labels = f'gpu="0",UUID="GPU-static-{host}",modelName="NVIDIA A100",Hostname="{host}"'
        lines += [f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {STATIC_TEMP_C}", f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 100"]
    return "\n".join(lines) + "\n"


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """A real HTTP server on a free port; yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def static_target() -> Iterator[str]:
    body = static_exposition().encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    with serve(Handler) as port:
        yield f"127.0.0.1:{port}"


@dataclass
class Proxy:
    """An authenticating proxy: the token it accepts (changed to rotate it) and what it was asked."""

    url: str = ""
    token: str = "token-1"
    asked: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, X-Scope-OrgID) of every request let through."""


@contextmanager
def auth_proxy(upstream: str, ca: Path) -> Iterator[Proxy]:
    """Checks ``Authorization: Bearer`` and ``X-Scope-OrgID``, then forwards to the TLS, basic-auth Prometheus."""
    proxy = Proxy()
    context = ssl.create_default_context(cafile=str(ca))
    login = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))

    class Handler(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            if self.headers.get("Authorization") != f"Bearer {proxy.token}":
                self._answer(401, b"unauthorized\n")
                return
            tenant = self.headers.get("X-Scope-OrgID")
            if tenant is None:
                self._answer(400, b"no org id\n")  # Mimir's answer to a request without a tenant
                return
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else None
            proxy.asked.append((self.command, self.path.partition("?")[0], tenant))
            headers = {"Authorization": login}
            if data is not None:
                headers["Content-Type"] = self.headers.get("Content-Type", "")
            request = urllib.request.Request(upstream + self.path, data=data, headers=headers, method=self.command)
            try:
                with opener.open(request, timeout=30) as answer:
                    self._answer(answer.status, answer.read())
            except urllib.error.HTTPError as error:
                self._answer(error.code, error.read())

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def log_message(self, format: str, *args: object) -> None:
            return

    with serve(Handler) as port:
        proxy.url = f"http://127.0.0.1:{port}"
        yield proxy


def ready(url: str, ca: Path) -> int:
    login = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(url + "/-/ready", headers={"Authorization": login})
    try:
        with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(ca)), timeout=5) as answer:
            return int(answer.status)
    except (OSError, urllib.error.URLError):
        return 0


@contextmanager
def secured_prometheus(root: Path, targets: dict[str, str], cert: Path, key: Path) -> Iterator[str]:
    """A real Prometheus over TLS with basic auth, scraping each job's target every second; yields its URL."""
    web = root / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  {USER}: '{bcrypt_hash(PASSWORD)}'\n")
    config = root / "prometheus.yml"
    jobs = "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
                   for job, target in targets.items())
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n" + jobs)
    port = free_port()
    with (root / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={web}"], stdout=log,
            stderr=subprocess.STDOUT)
        try:
            url = f"https://127.0.0.1:{port}"
            wait_for(lambda: ready(url, cert), lambda status: status == 200, timeout_s=60.0)
            yield url
        finally:
            process.terminate()
            process.wait(20)


@dataclass
class Setup:
    prometheus: str
    proxy: Proxy
    files: Path
    ca: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("promauth")
    cert, key = make_certificate(root)
    with ExitStack() as stack:
        node = stack.enter_context(nvdash_server(["--simulate", "a100-pcie-2", "--interval", "0.5", "--no-history",
                                                  "--hostname", "node-a"]))
        static = stack.enter_context(static_target())
        url = stack.enter_context(secured_prometheus(root, {"nvdash": f"127.0.0.1:{node.port}",
                                                            "dcgm-exporter": static}, cert, key))
        proxy = stack.enter_context(auth_proxy(url, cert))
        files = root / "secrets"
        files.mkdir()
        (files / "basic").write_text(f"{USER}:{PASSWORD}\n")
        (files / "wrong").write_text(f"{USER}:not-it\n")
        yield Setup(url, proxy, files, cert)


def cluster(url: str, **access: object) -> ClusterRuntime:
    return open_cluster(url, timeout_s=20.0, access=PrometheusAccess(**access))  # type: ignore[arg-type]


def settled(runtime: ClusterRuntime, hosts: list[str]) -> ClusterState:
    """The state once Prometheus has scraped both targets (every listed node's GPUs reporting)."""
    return wait_for(runtime.poller.refresh, lambda state: state.error is None and state.hostnames == hosts
                    and all(gpu.reporting for gpu in state.gpus), timeout_s=90.0)


def test_basic_auth_over_tls_verified_with_the_ca_file(setup: Setup) -> None:
    runtime = cluster(setup.prometheus, basic_auth_file=str(setup.files / "basic"), ca_file=str(setup.ca),
                      scope=JOB_NVDASH)
    state = settled(runtime, ["node-a"])
    assert [gpu.index for gpu in state.node("node-a")] == [0, 1]
    assert state.refused is False


def test_the_selector_leaves_out_a_dcgm_exporter_beside_nvdash(setup: Setup) -> None:
    basic = str(setup.files / "basic")
    everything = settled(cluster(setup.prometheus, basic_auth_file=basic, ca_file=str(setup.ca)), ["node-a", "node-z"])
    assert everything.node("node-z")[0].value("DCGM_FI_DEV_GPU_TEMP") == STATIC_TEMP_C
    only = settled(cluster(setup.prometheus, basic_auth_file=basic, ca_file=str(setup.ca), scope=JOB_NVDASH),
                   ["node-a"])
    assert len(only.gpus) == 2
    temperatures = [gpu.value("DCGM_FI_DEV_GPU_TEMP") for gpu in only.node("node-a")]
    assert all(value is not None and 0 < value < STATIC_TEMP_C for value in temperatures), temperatures


def test_refused_or_missing_credentials_are_a_visible_degraded_state(setup: Setup) -> None:
    url = setup.prometheus
    missing = cluster(url, ca_file=str(setup.ca)).poller.refresh()
    assert missing.error == f"Prometheus at {url} refused nvdash's credentials (HTTP 401) (none were given)"
    assert missing.refused
    wrong = cluster(url, basic_auth_file=str(setup.files / "wrong"), ca_file=str(setup.ca)).poller.refresh()
    assert wrong.error == f"Prometheus at {url} refused nvdash's credentials (HTTP 401)"
    assert wrong.refused
    assert not wrong.gpus
    unverified = cluster(url, basic_auth_file=str(setup.files / "basic")).poller.refresh()
    assert unverified.error is not None
    assert unverified.error.startswith(f"cannot reach Prometheus at {url}: ")
    assert "CERTIFICATE_VERIFY_FAILED" in unverified.error
    assert not unverified.refused
    skipped = cluster(url, basic_auth_file=str(setup.files / "basic"), insecure_skip_verify=True, scope=JOB_NVDASH)
    assert settled(skipped, ["node-a"]).error is None


def test_a_bearer_token_and_tenant_through_a_proxy_rotate_and_post(setup: Setup) -> None:
    proxy = setup.proxy
    token = setup.files / "token"
    token.write_text("token-1\n")
    runtime = cluster(proxy.url, bearer_token_file=str(token), headers=(("X-Scope-OrgID", TENANT),),
                      scope=JOB_NVDASH)
    settled(runtime, ["node-a"])
    assert {tenant for _method, _path, tenant in proxy.asked} == {TENANT}
    # The proxy's token rotates: refused until the file holds the new one, then read again without a restart.
    proxy.token = "token-2"
    refused = runtime.poller.refresh()
    assert refused.error == f"Prometheus at {proxy.url} refused nvdash's credentials (HTTP 401)"
    assert refused.hostnames == ["node-a"]  # the last good answer stays
    fresh = setup.files / "token.new"
    fresh.write_text("token-2\n")
    os.replace(fresh, token)
    assert settled(runtime, ["node-a"]).refused is False
    # Rewritten in place to a token of the same length within the file's timestamp granularity, the change is not
    # seen before asking: the 401 makes nvdash read the file again and ask once more, so no refresh fails.
    before = token.stat()
    proxy.token = "token-5"
    with token.open("r+") as stream:
        stream.write("token-5\n")
    os.utime(token, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert runtime.poller.refresh().error is None
    # A node's history over many GPUs is a query longer than a URL should be: it goes as a POST, and answers.
    proxy.asked.clear()
    end = time.time()
    result = runtime.history("node-a").query(["temperature_c"], end - 300, end, gpus=range(700), step_s=15.0)
    assert ("POST", "/api/v1/query_range", TENANT) in proxy.asked
    assert sorted(result.series["temperature_c"]) == [0, 1]


def status_and_nodes(server: NvdashServer) -> tuple[str, list[str]]:
    session = open_session(server.url, "/Cluster-Nodes")
    try:
        texts = [div.text for div in session.document.select({"type": Div}) if "Prometheus" in div.text]
        nodes = next((list(source.data["node"]) for source in session.document.select({"type": ColumnDataSource})
                      if "problems" in source.data), [])
        return " ".join(texts), nodes
    finally:
        session.close()


def test_the_cluster_pages_behind_the_proxy(setup: Setup, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-wrong-token\n")
    setup.proxy.token = "token-3"
    args = ["--simulate", "none", "--no-history", "--prometheus", setup.proxy.url, "--prometheus-bearer-token-file",
            str(token), "--prometheus-header", f"X-Scope-OrgID: {TENANT}", "--prometheus-selector", 'job="nvdash"']
    with nvdash_server(args) as central:
        status, _nodes = wait_for(lambda: status_and_nodes(central), lambda found: "refused" in found[0],
                                  timeout_s=60.0)
        refusal = escape(f"Prometheus at {setup.proxy.url} refused nvdash's credentials (HTTP 401)")
        assert f"<b>Prometheus refused access:</b> {refusal} · retrying" in status
        token.write_text("token-3\n")
        wait_for(lambda: status_and_nodes(central), lambda found: found[1] == ["node-a"],
                                  timeout_s=60.0)
        health = get_json(central.url + "/health")
        assert health["cluster"]["error"] is None
        assert "token-3" not in str(health)
        assert "token-3" not in central.output()
