"""``/metrics`` and the front page on a real server with the accounting: the idle gauge, the ``hpc_job`` label and
the "allocated but idle" warning.

The simulated GPUs' definitions decide what can be asserted: on ``dgx-h100`` GPUs 0-5 run a training rank each
(busy), GPU 6 MPS clients and GPU 7 nothing; on ``a100-pcie-2`` GPU 0 runs a rank and GPU 1 nothing and no health
rule finds anything wrong with it. A job allocated a GPU it runs no process on is idle at every reading, so with
``--idle-after 1s`` it is flagged a second after its first reading.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.conftest import get_json, http_get, nvdash_server, wait_for

IDLE = "nvdash_gpu_allocated_idle_seconds"
Series = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Series:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {family.name: [(sample.labels, sample.value) for sample in family.samples] for family in parse_text(text)}


def by_gpu(found: Series, name: str) -> dict[str, tuple[dict[str, str], float]]:
    return {labels["gpu"]: (labels, value) for labels, value in found.get(name, [])}


def test_idle_gauge_and_job_label_on_dgx_h100(tmp_path: Path) -> None:
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("777\n")
    (mapping / "7").write_text("778\n")  # GPU 7 runs no process
    args = ["--simulate", "dgx-h100", "--interval", "0.25", "--no-history", "--job-mapping-dir", str(mapping),
            "--idle-after", "1s", "--metrics-job-label"]
    with nvdash_server(args) as server:
        found = wait_for(lambda: scrape(server.url),
                         lambda f: len(f.get(IDLE, [])) == 8 and by_gpu(f, IDLE)["7"][1] > 0, timeout_s=60.0)
        idle = by_gpu(found, IDLE)
        assert sorted(idle, key=int) == [str(gpu) for gpu in range(8)]
        assert all(value >= 0 for _, value in idle.values())
        assert idle["7"][0]["hpc_job"] == "778"
        utilization = by_gpu(found, "DCGM_FI_DEV_GPU_UTIL")
        assert utilization["0"][0]["hpc_job"] == "777"
        # The others are owned by no Slurm job or pod (their processes' owners are users): an empty label.
        assert {gpu: labels["hpc_job"] for gpu, (labels, _) in utilization.items() if gpu not in ("0", "7")} == {
            str(gpu): "" for gpu in range(1, 7)}
        # Every GPU's series carries it; the node's own freshness gauges belong to no GPU and no job.
        node_level = {"nvdash_last_sample_timestamp_seconds", "nvdash_last_process_sample_timestamp_seconds"}
        assert node_level <= set(found)
        assert all("hpc_job" in labels for name, samples in found.items() if name not in node_level
                   for labels, _ in samples)
        assert all("hpc_job" not in labels and "gpu" not in labels for name in node_level
                   for labels, _ in found[name])
        # The gauge keeps counting while the job stays idle.
        later = wait_for(lambda: scrape(server.url), lambda f: by_gpu(f, IDLE)["7"][1] > idle["7"][1] + 0.5,
                         timeout_s=30.0)
        assert by_gpu(later, IDLE)["7"][0]["hpc_job"] == "778"


def test_idle_allocation_on_a100_pcie_2_is_exported_and_on_the_front_page(tmp_path: Path) -> None:
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "1").write_text("901\n")  # GPU 1 is outside the simulated job: no process, utilization 0
    args = ["--simulate", "a100-pcie-2", "--interval", "0.25", "--no-history", "--job-mapping-dir", str(mapping),
            "--idle-after", "1s"]
    with nvdash_server(args) as server:
        found = wait_for(lambda: scrape(server.url), lambda f: by_gpu(f, IDLE).get("1", ({}, 0.0))[1] > 0,
                         timeout_s=60.0)
        assert set(by_gpu(found, IDLE)) == {"0", "1"}
        assert not any("hpc_job" in labels for samples in found.values() for labels, _ in samples)  # off by default
        page = wait_for(lambda: http_get(server.url + "/")[1],
                        lambda text: "allocated but idle for" in text, timeout_s=30.0)
        assert re.search(r"allocated but idle for \d+ (s|min): Slurm job 901, no process", page), page
        snapshot = get_json(server.url + "/api/snapshot.json")
        reasons = {reason["kind"]: reason for reason in snapshot["gpus"][1]["health"]["reasons"]}
        assert snapshot["gpus"][1]["health"]["status"] == "warning"
        idle = next(reason for reason in reasons.values() if "allocated but idle for" in reason["text"])
        assert "Slurm job 901" in idle["text"]
        assert idle["status"] == "warning"
        assert snapshot["gpus"][0]["health"]["status"] == "ok"
