"""No GPU, no NVLink, a GPU lost mid-run, and bad command lines: visible degraded states, never a 500."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import NvdashServer, free_port, get_json, http_get, nvdash_env, nvdash_server, wait_for
from tests.server.bokeh_viewer import open_session, receive_for

GPU_ROUTES = [
    "/GPU-Utilization",
    "/GPU-Memory",
    "/GPU-Resources",
    "/PCIe-Throughput",
    "/NVLink-Throughput",
    "/NVLink-Timeline",
]


def _assert_machine_only(url: str, reason: str) -> None:
    assert get_json(url + "/index.json") == {"/Machine-Resources": "Machine Resources"}
    status, body, _ = http_get(url + "/")
    assert status == 200
    assert reason in body
    assert "--simulate dgx-h100" in body
    assert 'href="/Machine-Resources"' in body
    for route in GPU_ROUTES:
        status, body, headers = http_get(url + route)
        assert status == 404, route
        assert headers["Content-Type"].startswith("text/html")
        assert "is not available here" in body
        assert "No NVIDIA GPU" in body
    assert http_get(url + "/Machine-Resources")[0] == 200


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_machine_dashboard_works_and_the_index_explains() -> None:
    with nvdash_server([]) as server:
        info = get_json(server.url + "/info.json")
        assert info["gpus"] == []
        assert "libnvidia-ml.so.1" in info["nvml_error"]
        _assert_machine_only(server.url, "the NVIDIA driver is not installed")
        assert "no GPU" in server.output()


def test_driver_with_no_devices() -> None:
    with nvdash_server(["--simulate", "none"]) as server:
        _assert_machine_only(server.url, "found no NVIDIA GPU")


@pytest.fixture(scope="module")
def a100_pcie_2() -> Iterator[NvdashServer]:
    """Two GPUs without NVLink; the tests that use it only read."""
    with nvdash_server(["--simulate", "a100-pcie-2"]) as server:
        yield server


def test_gpus_without_nvlink_offer_no_nvlink_routes(a100_pcie_2: NvdashServer) -> None:
    server = a100_pcie_2
    index = get_json(server.url + "/index.json")
    assert "/NVLink-Throughput" not in index
    assert "/NVLink-Timeline" not in index
    assert "/PCIe-Throughput" in index
    status, body, _ = http_get(server.url + "/NVLink-Throughput")
    assert status == 404
    assert "NVLink" in body


def test_a_lost_gpu_is_shown_lost_while_the_others_keep_updating() -> None:
    env = {"NVDASH_FAKE_FAULTS": "lose:3@1"}
    with nvdash_server(["--simulate", "dgx-h100", "--interval", "0.2"], env=env) as server:
        wait_for(lambda: get_json(server.url + "/api/snapshot.json")["gpus"][3]["lost"], lambda lost: lost is True)
        session = open_session(server.url, "/GPU-Utilization")
        try:
            from bokeh.models import ColumnDataSource

            def bars() -> dict[str, list[object]]:
                sources = [s for s in session.document.select({"type": ColumnDataSource}) if "label" in s.data]
                assert len(sources) == 1
                return {k: list(v) for k, v in sources[0].data.items()}

            first = bars()
            assert [label == "lost" for label in first["label"]] == [i == 3 for i in range(8)]
            assert first["utilization"][3] == "GPU lost"
        finally:
            session.close()
        timeline = open_session(server.url, "/GPU-Resources")
        try:
            (source,) = [s for s in timeline.document.select({"type": ColumnDataSource}) if "util/3" in s.data]
            before = len(source.data["time"])
            healthy = [f"util/{gpu}" for gpu in (0, 1, 2, 4, 5, 6, 7)]

            def new_rows() -> list[dict[str, float]]:
                """The rows streamed since the pane opened (all after the loss)."""
                receive_for(timeline, 0.2)
                data = {k: list(v) for k, v in source.data.items()}
                return [{k: data[k][i] for k in ("util/3", *healthy)} for i in range(before, len(data["time"]))]

            def complete(rows: list[dict[str, float]]) -> int:
                return sum(1 for row in rows if not any(math.isnan(row[k]) for k in healthy))

            # A GPU whose read misses a sweep's time budget (on a busy machine) has a gap in that row; the healthy
            # ones keep coming: three rows with a value from each of them, while the lost GPU has none at all.
            rows = wait_for(new_rows, lambda rows: complete(rows) >= 3)
            assert all(math.isnan(row["util/3"]) for row in rows), "the lost GPU has values"
        finally:
            session.close()
        health = server.health()
        assert health["sampler"]["errors"] == 0


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdash", *args],
        env=nvdash_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_port_in_use_is_one_line_and_nonzero() -> None:
    with nvdash_server(["--simulate", "t4"]) as server:
        result = _run_cli("--port", str(server.port), "--simulate", "t4")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == [f"nvdash: error: port {server.port} on 127.0.0.1 is already in use; choose another with --port"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "nvdash: error: --interval must be at least 0.1 seconds, not 0.0"),
        (["--simulate", "gtx-9000"], "nvdash: error: unknown profile 'gtx-9000'; choose one of: "),
    ],
)
def test_bad_arguments_are_one_line_and_nonzero(args: list[str], message: str) -> None:
    result = _run_cli("--port", str(free_port()), *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(message)


def test_unknown_profile_from_the_environment_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nvdash", "--port", str(free_port())],
        env=nvdash_env({"NVDASH_SIMULATE": "nope"}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "nvdash: error: unknown profile 'nope'; choose one of: " + result.stderr.split("choose one of: ")[1].strip()
    ]


def test_index_names_each_reason_once_for_the_dashboards_not_offered(a100_pcie_2: NvdashServer) -> None:
    _, body, _ = http_get(a100_pcie_2.url + "/")
    assert body.count("None of the GPUs on this machine has NVLink.") == 1
    assert "Not offered on this machine: NVLink Throughput, NVLink Timeline." in body
