"""The cluster view over a real Prometheus (Debian's package) scraping nodes that name their series differently:
dcgm-exporter 4.8's names with ``Hostname`` (nvdash's default), 4.8's names with ``hostname`` (dcgm-exporter 4.8.3),
4.9's names and units (nvdash ``--metrics-compat 4.9``, dcgm-exporter 4.9), and a node exporting both namings.

The static nodes serve fixed expositions written here from dcgm-exporter's definitions (4.9: utilization a 0-1
ratio, framebuffer in bytes, clocks in Hz), so every node must show exactly the same readings in nvdash's units. Two
real nvdash nodes (one with ``--metrics-compat 4.9``) show the same path end to end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import numpy as np
import pytest
from bokeh.models import ColumnDataSource

from nvdash.apps.figures import format_bytes_of, format_pct
from nvdash.cluster.history import METRICS, PrometheusHistory
from nvdash.cluster.model import ClusterState, gpu_records
from nvdash.cluster.poller import ClusterPoller
from nvdash.cluster.promapi import PrometheusClient
from nvdash.health.status import Status
from tests.conftest import NvdashServer, get_json, nvdash_server, wait_for
from tests.prometheus_cluster import query, run_prometheus
from tests.server.bokeh_viewer import open_session

MIB = 1024 * 1024
UTIL_PCT, USED_MIB, FREE_MIB, RESERVED_MIB, SM_MHZ = 73.0, 40960.0, 39980.0, 539.0, 1980.0
TEMP_C, POWER_W, ENFORCED_W, REQUESTED_W = 54.0, 512.5, 450.0, 700.0
PCIE_TX, PCIE_RX = 2.5e9, 1.5e9


def readings_4_8(gpu: int) -> dict[str, float]:
    """One GPU's readings under dcgm-exporter 4.8's names and units (GPU 1 idle, with an XID 48)."""
    return {
        "DCGM_FI_DEV_GPU_UTIL": UTIL_PCT if gpu == 0 else 0.0, "DCGM_FI_DEV_FB_USED": USED_MIB,
        "DCGM_FI_DEV_FB_FREE": FREE_MIB, "DCGM_FI_DEV_FB_RESERVED": RESERVED_MIB, "DCGM_FI_DEV_GPU_TEMP": TEMP_C,
        "DCGM_FI_DEV_SLOWDOWN_TEMP": 87.0, "DCGM_FI_DEV_POWER_USAGE": POWER_W, "DCGM_FI_DEV_SM_CLOCK": SM_MHZ,
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ENFORCED_W, "DCGM_FI_DEV_POWER_MGMT_LIMIT": REQUESTED_W,
        "DCGM_FI_DEV_XID_ERRORS": 48.0 if gpu == 1 else 0.0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
    }


def readings_4_9(gpu: int) -> dict[str, float]:
    """The same readings under 4.9's names and units (dcgm-exporter 4.9.0's default counters)."""
    return {
        "DCGM_FI_DEV_GPU_UTIL_RATIO": UTIL_PCT / 100.0 if gpu == 0 else 0.0,
        "DCGM_FI_DEV_FB_USED_BYTES": USED_MIB * MIB, "DCGM_FI_DEV_FB_FREE_BYTES": FREE_MIB * MIB,
        "DCGM_FI_DEV_FB_RESERVED_BYTES": RESERVED_MIB * MIB, "DCGM_FI_DEV_GPU_TEMP_CELSIUS": TEMP_C,
        "DCGM_FI_DEV_SLOWDOWN_TEMP": 87.0, "DCGM_FI_DEV_BOARD_POWER_WATTS": POWER_W,
        "DCGM_FI_DEV_SM_CLOCK_HERTZ": SM_MHZ * 1e6, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ENFORCED_W,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": REQUESTED_W, "DCGM_FI_DEV_XID_ERROR": 48.0 if gpu == 1 else 0.0,
        "DCGM_FI_DEV_ROW_REMAP_FAILED": 0.0,
    }


@dataclass(frozen=True)
class Exposition:
    """A static node: its naming, host label, and whether it is an nvdash (with nvdash's own families)."""

    host: str
    naming: str
    host_label: str
    nvdash: bool = True

    def text(self) -> str:
        """The exposition: every GPU's readings, each held by a pod (GPU 0 ``train``, GPU 1 ``idle``), as
        dcgm-exporter writes a pod's device series."""
        lines = []
        for gpu, pod in ((0, "train"), (1, "idle")):
            labels = {"gpu": str(gpu), "UUID": f"GPU-static-{gpu}", "pci_bus_id": f"00000000:1{gpu}:00.0",
                      "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3", self.host_label: self.host}
            held = {**labels, "namespace": "ns", "pod": pod, "container": "main"}
            readings = readings_4_8(gpu) if self.naming == "4.8" else readings_4_9(gpu)
            for name, value in readings.items():
                lines.append(f"{name}{{{render(held)}}} {value!r}")
            if self.nvdash:
                lines.append(f"nvdash_gpu_lost{{{render(labels)}}} 0.0")
                lines.append(f"nvdash_pcie_transmit_bytes_per_second{{{render(labels)}}} {PCIE_TX!r}")
                lines.append(f"nvdash_pcie_receive_bytes_per_second{{{render(labels)}}} {PCIE_RX!r}")
                allocated = {**held, "resource": "nvidia.com/gpu", "sharing": "whole"}
                lines.append(f"nvdash_pod_gpu_allocated{{{render(allocated)}}} 1.0")
        return "\n".join(lines) + "\n"


def render(labels: Mapping[str, str]) -> str:
    return ",".join(f'{name}="{value}"' for name, value in labels.items())


STATIC = (
    Exposition("static-48", "4.8", "Hostname"),
    Exposition("static-483", "4.8", "hostname"),
    Exposition("static-49", "4.9", "hostname"),
    # Two exporters on one node: nvdash with 4.8's names and a dcgm-exporter 4.9 (no nvdash families).
    Exposition("static-both", "4.8", "Hostname"),
    Exposition("static-both", "4.9", "hostname", nvdash=False),
)
STATIC_HOSTS = ("static-48", "static-483", "static-49", "static-both")
REAL = {"real-48": [], "real-49": ["--metrics-compat", "4.9"]}
"""Real nvdash nodes (two simulated A100 PCIe each) and their extra arguments."""
A100_MAX_SM_MHZ = 1410.0


@contextmanager
def serve_text(text: str) -> Iterator[str]:
    """A real HTTP server answering every GET with ``text`` as a Prometheus exposition; yields ``host:port``."""
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Mixed:
    url: str
    real: dict[str, NvdashServer]
    central: NvdashServer


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mixed]:
    root: Path = tmp_path_factory.mktemp("naming")
    with ExitStack() as stack:
        targets = [stack.enter_context(serve_text(node.text())) for node in STATIC]
        real = {name: stack.enter_context(nvdash_server(["--simulate", "a100-pcie-2", "--interval", "0.5",
                                                          "--no-history", "--hostname", name, *args]))
                for name, args in REAL.items()}
        targets += [f"127.0.0.1:{server.port}" for server in real.values()]
        url = stack.enter_context(run_prometheus(root, targets, rules=False))
        central = stack.enter_context(nvdash_server(["--simulate", "none", "--no-history", "--prometheus", url]))
        # Each node scraped a few times (the history's windows then hold several scrapes).
        for name in names_of_all():
            wait_for(lambda n=name: query(url, f'count_over_time({{__name__=~"DCGM_FI_DEV_GPU_TEMP.*", '
                                             f'gpu="0", Hostname="{n}"}}[5m]) or count_over_time('
                                             f'{{__name__=~"DCGM_FI_DEV_GPU_TEMP.*", gpu="0", hostname="{n}"}}[5m])'),
                     lambda rows: bool(rows) and min(float(row["value"][1]) for row in rows) >= 5, timeout_s=90.0)
        yield Mixed(url, real, central)


def names_of_all() -> list[str]:
    return sorted({*STATIC_HOSTS, *REAL})


def cluster_state(url: str) -> ClusterState:
    poller = ClusterPoller(PrometheusClient(url, timeout_s=20.0))
    return wait_for(poller.refresh, lambda state: state.error is None and state.hostnames == names_of_all()
                    and all(gpu.reporting for gpu in state.gpus), timeout_s=90.0)


def test_every_naming_shows_the_same_gpus_and_readings(mixed: Mixed) -> None:
    state = cluster_state(mixed.url)
    for host in STATIC_HOSTS:
        gpus = state.node(host)
        # One GPU per index, also where two exporters report the node under both namings.
        assert [(gpu.index, gpu.uuid, gpu.model) for gpu in gpus] == [
            (0, "GPU-static-0", "NVIDIA H100 80GB HBM3"), (1, "GPU-static-1", "NVIDIA H100 80GB HBM3")], host
        busy, idle = gpus
        assert busy.utilization_pct == pytest.approx(UTIL_PCT), host
        assert idle.utilization_pct == 0.0
        assert busy.memory_used_bytes == USED_MIB * MIB
        assert busy.memory_total_bytes == (USED_MIB + FREE_MIB + RESERVED_MIB) * MIB
        assert busy.values == pytest.approx(state.node("static-48")[0].values), host
        _info, sample = gpu_records(0, busy.model, busy.uuid, busy.values)
        assert (sample.power_limit_w, sample.power_management_limit_w) == (ENFORCED_W, REQUESTED_W)
        assert sample.temperature_c == TEMP_C
        assert sample.power_w == POWER_W
        assert busy.health.status is Status.OK
        assert idle.health.status is Status.CRITICAL
        assert idle.health.findings[0].text.startswith("last XID 48: "), host


def test_every_naming_shows_the_same_pods(mixed: Mixed) -> None:
    state = cluster_state(mixed.url)
    for host in STATIC_HOSTS:
        rows = [pod for pod in state.pods if pod.hostname == host]
        assert [(pod.pod, pod.device, pod.idle) for pod in rows] == [("idle", "GPU 1", True),
                                                                      ("train", "GPU 0", False)], host
        idle, train = rows
        assert train.utilization_pct == pytest.approx(UTIL_PCT)
        assert train.memory_used_bytes == USED_MIB * MIB
        assert idle.utilization_pct == 0.0


def test_every_naming_gives_the_same_history_in_nvdash_units(mixed: Mixed) -> None:
    client = PrometheusClient(mixed.url, timeout_s=20.0)
    expected = {"utilization_pct": UTIL_PCT, "memory_used_bytes": USED_MIB * MIB, "temperature_c": TEMP_C,
                "power_w": POWER_W, "clock_sm_mhz": SM_MHZ, "pcie_tx_bytes_per_s": PCIE_TX,
                "pcie_rx_bytes_per_s": PCIE_RX}
    assert set(expected) == set(METRICS)
    end = time.time()
    for host in STATIC_HOSTS:
        result = PrometheusHistory(client, host).query(list(METRICS), end - 300, end, gpus=[0], step_s=15.0)
        for name, value in expected.items():
            assert sorted(result.series[name]) == [0], (host, name)
            series = result.series[name][0]
            known = ~np.isnan(series.mean)
            assert known.any(), (host, name)
            for column in (series.mean, series.minimum, series.maximum):
                assert column[known] == pytest.approx(np.full(known.sum(), value)), (host, name)


def test_real_nodes_with_either_naming_read_in_nvdash_units(mixed: Mixed) -> None:
    state = cluster_state(mixed.url)
    client = PrometheusClient(mixed.url, timeout_s=20.0)
    end = time.time()
    for name, server in mixed.real.items():
        info = get_json(server.url + "/info.json")["gpus"]
        gpus = state.node(name)
        assert [(gpu.index, gpu.uuid, gpu.model) for gpu in gpus] == [
            (gpu["index"], gpu["uuid"], gpu["name"]) for gpu in info]
        for gpu, listed in zip(gpus, info, strict=True):
            # Bytes from 4.8's MiB and from 4.9's bytes alike: used + free + reserved is the GPU's memory.
            assert gpu.memory_total_bytes == listed["memory_total_bytes"], name
            assert gpu.memory_used_bytes is not None
            assert 0 < gpu.memory_used_bytes <= listed["memory_total_bytes"]
            assert gpu.utilization_pct is not None
            assert 0.0 <= gpu.utilization_pct <= 100.0
        clocks = PrometheusHistory(client, name).query(["clock_sm_mhz"], end - 300, end, step_s=15.0)
        assert sorted(clocks.series["clock_sm_mhz"]) == [0, 1]
        for series in clocks.series["clock_sm_mhz"].values():
            known = series.mean[~np.isnan(series.mean)]
            # MHz from 4.8's MHz and from 4.9's Hz alike: an A100's SM clock tops out at 1410 MHz.
            assert len(known) >= 1
            assert ((known > 0) & (known <= A100_MAX_SM_MHZ)).all(), (name, known)


def test_the_cluster_nodes_page_lists_every_node_alike(mixed: Mixed) -> None:
    def rows() -> dict[str, list[object]]:
        session = open_session(mixed.central.url, "/Cluster-Nodes")
        try:
            for source in session.document.select({"type": ColumnDataSource}):
                if "problems" in source.data:
                    return dict(source.data)
            return {}
        finally:
            session.close()

    table = wait_for(rows, lambda found: list(found.get("node", [])) == names_of_all(), timeout_s=90.0)
    by_node = {node: index for index, node in enumerate(table["node"])}
    for column in ("gpus", "models", "util", "memory", "health", "problems"):
        assert len({str(table[column][by_node[host]]) for host in STATIC_HOSTS}) == 1, (column, table[column])
    first = by_node["static-49"]
    assert table["gpus"][first] == 2
    assert table["util"][first] == format_pct((UTIL_PCT + 0.0) / 2, 0)
    assert table["memory"][first] == format_bytes_of(2 * USED_MIB * MIB, 2 * (USED_MIB + FREE_MIB + RESERVED_MIB) * MIB)
    assert str(table["problems"][first]).startswith("GPU 1: last XID 48: ")
