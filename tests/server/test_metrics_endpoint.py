"""``/metrics`` on a real server: dcgm-exporter's names for every simulated GPU, the options, the token."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.conftest import free_port, http_get, nvdash_env, nvdash_server, wait_for

FAST = ["--simulate", "dgx-h100", "--interval", "0.25", "--no-history"]


def scrape(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url + "/metrics", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), {k.lower(): v for k, v in error.headers.items()}


def test_metrics_for_every_gpu_in_dcgm_exporters_names(tmp_path: Path) -> None:
    with nvdash_server([*FAST, "--hostname", "gpu-node-7"]) as server:
        def read() -> dict[str, list[tuple[dict[str, str], float]]]:
            status, text, _ = scrape(server.url)
            assert status == 200
            return {f.name: [(s.labels, s.value) for s in f.samples] for f in parse_text(text)}

        found = wait_for(read, lambda f: len(f.get("DCGM_FI_DEV_GPU_UTIL", [])) == 8, timeout_s=60.0)
        utilization = found["DCGM_FI_DEV_GPU_UTIL"]
        assert sorted(int(labels["gpu"]) for labels, _ in utilization) == list(range(8))
        labels = utilization[0][0]
        assert set(labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                               "DCGM_FI_DRIVER_VERSION"}
        assert labels["Hostname"] == "gpu-node-7"
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert labels["UUID"].startswith("GPU-")
        assert all(0 <= value <= 100 for _, value in utilization)
        # Framebuffer sizes are MiB: an H100 80GB holds 81,559 MiB in all.
        used = {labels["gpu"]: value for labels, value in found["DCGM_FI_DEV_FB_USED"]}
        free = {labels["gpu"]: value for labels, value in found["DCGM_FI_DEV_FB_FREE"]}
        reserved = {labels["gpu"]: value for labels, value in found["DCGM_FI_DEV_FB_RESERVED"]}
        for gpu, value in used.items():
            assert value + free[gpu] + reserved[gpu] == 81559
        assert all(0 <= value <= 1 for _, value in found["DCGM_FI_PROF_SM_ACTIVE"])
        assert all(0 <= value <= 1 for _, value in found["DCGM_FI_PROF_GR_ENGINE_ACTIVE"])
        assert all(0 <= value <= 100 for _, value in found["DCGM_FI_DEV_MEM_COPY_UTIL"])
        assert len(found["DCGM_FI_DEV_MEM_COPY_UTIL"]) == 8
        # The rates under DCGM's names are nvdash's own: PCIe in bytes/s, NVLink TX + RX in DCGM's 1000 KiB/s.
        by_gpu = {name: {labels["gpu"]: value for labels, value in found[name]} for name in (
            "DCGM_FI_PROF_PCIE_TX_BYTES", "nvdash_pcie_transmit_bytes_per_second", "DCGM_FI_PROF_PCIE_RX_BYTES",
            "nvdash_pcie_receive_bytes_per_second", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "nvdash_nvlink_transmit_bytes_per_second", "nvdash_nvlink_receive_bytes_per_second")}
        assert by_gpu["DCGM_FI_PROF_PCIE_TX_BYTES"] == by_gpu["nvdash_pcie_transmit_bytes_per_second"]
        assert by_gpu["DCGM_FI_PROF_PCIE_RX_BYTES"] == by_gpu["nvdash_pcie_receive_bytes_per_second"]
        for gpu, value in by_gpu["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].items():
            total = by_gpu["nvdash_nvlink_transmit_bytes_per_second"][gpu] + by_gpu[
                "nvdash_nvlink_receive_bytes_per_second"][gpu]
            assert value == pytest.approx(total / 1024 / 1000)
        assert "nvdash_pod_gpu_allocated" not in found
        assert "nvdash_process_gpu_memory_bytes" not in found
        status, _, headers = scrape(server.url)
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        status, text, headers = scrape(server.url, {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert status == 200
        assert headers["content-type"].startswith("application/openmetrics-text")
        assert text.endswith("# EOF\n")
        # A scrape reads the store: twenty scrapes add no NVML calls beyond the sampler's own per sweep.
        before = server.health()
        rate = before["nvml_calls"] / before["sampler"]["sweeps"]
        for _ in range(20):
            scrape(server.url)
        after = server.health()
        sweeps = after["sampler"]["sweeps"] - before["sampler"]["sweeps"]
        assert after["nvml_calls"] - before["nvml_calls"] <= 1.5 * rate * max(sweeps, 1) + 100


def test_token_labels_and_counters_file(tmp_path: Path) -> None:
    counters = tmp_path / "counters.csv"
    counters.write_text("# mine\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                        "DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status\n")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    args = [*FAST, "--metrics-counters", str(counters), "--metrics-labels", "gpu,Hostname",
            "--metrics-token-file", str(token)]
    with nvdash_server(args) as server:
        assert ("the counters file names fields nvdash does not read, left out: DCGM_FI_DEV_VGPU_LICENSE_STATUS"
                in server.output())
        status, _, headers = scrape(server.url)
        assert status == 401
        assert headers["www-authenticate"].startswith("Bearer")
        assert scrape(server.url, {"Authorization": "Bearer wrong"})[0] == 401
        text = wait_for(lambda: scrape(server.url, {"Authorization": "Bearer s3cret"})[1],
                        lambda t: "DCGM_FI_DEV_GPU_TEMP{" in t, timeout_s=60.0)
        names = {family.name for family in parse_text(text)}
        # The counters file chooses the GPU families; a live server also says when its readings were taken.
        assert names == {"DCGM_FI_DEV_GPU_TEMP", "nvdash_last_sample_timestamp_seconds",
                         "nvdash_last_process_sample_timestamp_seconds"}
        labels = next(iter(parse_text(text))).samples[0].labels
        assert set(labels) == {"gpu", "Hostname"}
        assert http_get(server.url + "/health")[0] == 200  # the token guards /metrics only


def test_a_bad_counters_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("DCGM_FI_DEV_GPU_UTIL, summary, nope\n")
    for args, message in (
        (["--metrics-counters", str(bad)],
         f"{bad}:1: type 'summary' of DCGM_FI_DEV_GPU_UTIL is not one of gauge, counter, untyped, label"),
        (["--metrics-counters", str(tmp_path / "none.csv")], "cannot read counters file"),
        (["--metrics-labels", "gpu,color"], "--metrics-labels: unknown label 'color'"),
    ):
        process = subprocess.run([sys.executable, "-m", "nvdash", "--port", str(free_port()), *FAST, *args],
                                 env=nvdash_env(), capture_output=True, text=True, timeout=60, check=False)
        assert process.returncode in (1, 2), process.stderr
        lines = process.stderr.strip().splitlines()
        assert len(lines) == 1, process.stderr
        assert message in lines[0]


def test_metrics_in_dcgm_exporter_4_9s_names() -> None:
    with nvdash_server([*FAST, "--hostname", "gpu-node-7", "--metrics-compat", "4.9"]) as server:
        def read() -> dict[str, list[tuple[dict[str, str], float]]]:
            status, text, _ = scrape(server.url)
            assert status == 200
            return {f.name: [(s.labels, s.value) for s in f.samples] for f in parse_text(text)}

        found = wait_for(read, lambda f: len(f.get("DCGM_FI_DEV_GPU_UTIL_RATIO", [])) == 8, timeout_s=60.0)
        assert "DCGM_FI_DEV_GPU_UTIL" not in found
        assert "DCGM_FI_DEV_FB_USED" not in found
        labels = found["DCGM_FI_DEV_GPU_UTIL_RATIO"][0][0]
        assert set(labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname",
                               "DCGM_FI_SYSTEM_DRIVER_VERSION"}
        assert labels["hostname"] == "gpu-node-7"
        assert all(0 <= value <= 1 for _, value in found["DCGM_FI_DEV_GPU_UTIL_RATIO"])
        # Framebuffer sizes are bytes: an H100 80GB holds 81,559 MiB in all.
        by_gpu = {name: {labels["gpu"]: value for labels, value in found[name]} for name in (
            "DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_FREE_BYTES", "DCGM_FI_DEV_FB_RESERVED_BYTES",
            "DCGM_FI_DEV_SM_CLOCK_HERTZ")}
        for gpu, used in by_gpu["DCGM_FI_DEV_FB_USED_BYTES"].items():
            total = used + by_gpu["DCGM_FI_DEV_FB_FREE_BYTES"][gpu] + by_gpu["DCGM_FI_DEV_FB_RESERVED_BYTES"][gpu]
            assert total == 81559 * 1024 * 1024
        # Clocks in Hz: NVML reports whole MHz.
        assert all(hz > 0 and hz % 1_000_000 == 0 for hz in by_gpu["DCGM_FI_DEV_SM_CLOCK_HERTZ"].values())
