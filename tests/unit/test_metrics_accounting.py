"""``/metrics`` from the accounting: ``nvdash_gpu_allocated_idle_seconds`` and the optional ``hpc_job`` label.

Values follow the definitions: an allocation is flagged once idle at every reading for the accountant's
``idle_after_s`` (a job allocated the GPU that runs no process on it is idle), and the gauge is how long the GPU's
longest-idle flagged allocation has been idle at the accountant's latest reading; the label (dcgm-exporter's
``hpc_job``) names the GPU's Slurm jobs, else its pods.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.accounting.accountant import Accountant
from nvdash.accounting.attribution import Owner, Share
from nvdash.metrics.collector import JOB_LABEL, ExportOptions, StoreCollector, job_label_value
from nvdash.metrics.counters import Counter, default_counters, parse_counters
from nvdash.metrics.exposition import text_format
from nvdash.sampling.records import GpuSample, HostSample, Inventory, Snapshot
from nvdash.sampling.usage_records import GpuProcess, Usage
from nvdash.server.metrics_handler import metrics_setup
from nvdash.settings import Settings
from nvdash.store import Store
from tests.unit import test_metrics_mig_pods as mig
from tests.unit.test_apps_health import INVENTORY

GiB = 1024**3
IDLE = "nvdash_gpu_allocated_idle_seconds"
HEALTH = "nvdash_gpu_health_status"
IDLE_AFTER_S = 10.0
START = 1000.0
Series = dict[str, list[tuple[dict[str, str], float]]]


class Names:
    def user(self, uid: int) -> str | None:
        return {1000: "alice"}.get(uid)

    def group_of(self, user: str) -> str | None:
        return "physics" if user == "alice" else None


def uuids(inventory: Inventory) -> dict[int, str]:
    return {info.index: info.uuid for info in inventory.gpus}


def gpus(gpu2_lost: bool = False) -> tuple[GpuSample, ...]:
    """GPU 0 at 0 % with no process, GPU 1 busy, GPU 2 at 5 % (or lost)."""
    return (GpuSample(0, utilization_pct=0.0, memory_used_bytes=0),
            GpuSample(1, utilization_pct=60.0, memory_used_bytes=GiB),
            GpuSample(2, lost=True) if gpu2_lost else GpuSample(2, utilization_pct=5.0))


def usage(time_s: float) -> Usage:
    """GPU 1 runs a process (one nvdash cannot see the host side of); GPUs 0 and 2 run none."""
    return Usage(time_s=time_s, processes=(GpuProcess(1, "GPU-1", 4_200_001, ("compute",), gpu_memory_bytes=GiB),))


def accounted(tmp_path: Path, until_s: float, step_s: float = 5.0) -> tuple[Store, Accountant]:
    """A store and its accountant fed readings every ``step_s`` from ``START`` to ``until_s``: Slurm job 555 was
    allocated GPU 0, job 556 GPU 1 (``idle_after_s`` is 10 s)."""
    (tmp_path / "0").write_text("555 1000\n")
    (tmp_path / "1").write_text("556 1000\n")
    store = Store(INVENTORY, capacity=100)
    accountant = Accountant(uuids(INVENTORY), job_mapping_dir=tmp_path, names=Names(), idle_after_s=IDLE_AFTER_S)
    store.add_listener(accountant)
    time_s = START
    while time_s <= until_s:
        store.append(Snapshot(time_s, gpus(), HostSample(), usage=usage(time_s)))
        time_s += step_s
    return store, accountant


def text_of(store: Store, accountant: Accountant | None, counters: list[Counter] | None = None,
            job_label: bool = False) -> str:
    registry = CollectorRegistry(auto_describe=False)
    options = ExportOptions(hostname="n1", job_label=job_label)
    registry.register(StoreCollector(store, counters or default_counters(), options, accountant=accountant))
    return text_format(registry.collect()).decode()


def families(text: str) -> Series:
    return {family.name: [(sample.labels, sample.value) for sample in family.samples] for family in parse_text(text)}


def by_gpu(found: Series, name: str) -> dict[str, float]:
    return {labels["gpu"]: value for labels, value in found[name]}


# --------------------------------------------------------------------------------------------- the idle gauge


def test_the_gauge_is_the_idle_seconds_of_the_flagged_allocation_and_0_elsewhere(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    assert [a.owner.job for a in accountant.idle()[1]] == ["555"]
    found = families(text_of(store, accountant))
    # Job 555 has had GPU 0 with no process on it at every reading since START: 30 s at the latest one.
    assert by_gpu(found, IDLE) == {"0": 30.0, "1": 0.0, "2": 0.0}
    labels = next(labels for labels, _ in found[IDLE] if labels["gpu"] == "0")
    assert labels == next(labels for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"] if labels["gpu"] == "0")
    assert "# TYPE nvdash_gpu_allocated_idle_seconds gauge\n" in text_of(store, accountant)


def test_an_allocation_idle_for_less_than_idle_after_is_not_counted_yet(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 5.0)
    assert accountant.idle()[1] == []
    assert by_gpu(families(text_of(store, accountant)), IDLE) == {"0": 0.0, "1": 0.0, "2": 0.0}


def test_the_longest_idle_allocation_of_a_gpu_counts(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    # A second job joins GPU 0 at START + 35: job 555 stays the longest idle.
    (tmp_path / "0").write_text("555 1000\n557 1000\n")
    for time_s in (START + 35.0, START + 50.0):
        store.append(Snapshot(time_s, gpus(), HostSample(), usage=usage(time_s)))
    assert sorted(a.owner.job for a in accountant.idle()[1]) == ["555", "557"]
    assert by_gpu(families(text_of(store, accountant)), IDLE)["0"] == 50.0


def test_a_lost_gpu_has_no_idle_series(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    store.append(Snapshot(START + 35.0, gpus(gpu2_lost=True), HostSample(), usage=usage(START + 35.0)))
    found = families(text_of(store, accountant))
    assert by_gpu(found, IDLE) == {"0": 35.0, "1": 0.0}
    assert by_gpu(found, "nvdash_gpu_lost")["2"] == 1.0
    assert by_gpu(found, HEALTH) == {"0": 1.0, "1": 0.0, "2": 2.0}, "idle: a warning; lost: critical"


def test_without_an_accountant_or_without_its_counters_row_the_gauge_is_absent(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    assert IDLE not in families(text_of(store, None))  # a replay has no accountant
    mine = parse_counters("DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n")
    assert set(families(text_of(store, accountant, mine))) == {"DCGM_FI_DEV_GPU_UTIL"}


def test_the_default_output_is_unchanged_but_for_the_gauge_and_the_idle_gpus_health(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    before = text_of(store, None)
    after = text_of(store, accountant)
    assert IDLE in after
    # Job 555's idle allocation of GPU 0 is a warning of the Health page: the health verdict says so too.
    assert by_gpu(families(before), HEALTH) == {"0": 0.0, "1": 0.0, "2": 0.0}
    assert by_gpu(families(after), HEALTH) == {"0": 1.0, "1": 0.0, "2": 0.0}
    assert "".join(line for line in after.splitlines(keepends=True) if IDLE not in line and HEALTH not in line) == \
        "".join(line for line in before.splitlines(keepends=True) if HEALTH not in line)
    assert JOB_LABEL not in after


def test_the_gauge_parses_as_openmetrics(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, default_counters(), ExportOptions(hostname="n1"), openmetrics=True,
                                     accountant=accountant))
    parsed = {family.name: family for family in parse_openmetrics(openmetrics_latest(registry).decode())}
    assert parsed[IDLE].type == "gauge"
    assert {s.labels["gpu"]: s.value for s in parsed[IDLE].samples} == {"0": 30.0, "1": 0.0, "2": 0.0}


# --------------------------------------------------------------------------------------------- the job label


def test_the_job_label_names_each_gpus_slurm_jobs_on_every_series(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    found = families(text_of(store, accountant, job_label=True))
    for name, samples in found.items():
        assert all(JOB_LABEL in labels for labels, _ in samples), name
    assert {labels["gpu"]: labels[JOB_LABEL] for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"]} == {
        "0": "555", "1": "556", "2": ""}
    assert {labels[JOB_LABEL] for labels, _ in found["DCGM_FI_DEV_XID_ERRORS"] if labels["gpu"] == "0"} == {"555"}
    assert {labels[JOB_LABEL] for labels, _ in found[IDLE] if labels["gpu"] == "0"} == {"555"}


def test_the_job_label_is_off_by_default_and_empty_without_an_accountant(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 30.0)
    assert JOB_LABEL not in text_of(store, accountant)
    found = families(text_of(store, None, job_label=True))
    assert {labels[JOB_LABEL] for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"]} == {""}


def test_several_jobs_of_one_gpu_are_sorted_and_comma_joined(tmp_path: Path) -> None:
    store, accountant = accounted(tmp_path, START + 5.0)
    (tmp_path / "0").write_text("900\n1000\n")
    store.append(Snapshot(START + 10.0, gpus(), HostSample(), usage=usage(START + 10.0)))
    found = families(text_of(store, accountant, job_label=True))
    assert by_label(found, "DCGM_FI_DEV_GPU_UTIL", "0") == "1000,900"


def by_label(found: Series, name: str, gpu: str) -> str:
    (value,) = {labels[JOB_LABEL] for labels, _ in found[name] if labels["gpu"] == gpu and "GPU_I_ID" not in labels}
    return value


def share(kind: str, job: str, unit: str = "GPU-0") -> Share:
    return Share(0, unit, 1.0, Owner(kind, job, "alice", "physics"), None, 50.0, None)


@pytest.mark.parametrize(("shares", "value"), [
    ([], ""),
    ([share("slurm", "555")], "555"),
    ([share("pod", "ml/train-0"), share("pod", "ml/eval-1")], "ml/eval-1,ml/train-0"),
    ([share("pod", "ml/train-0"), share("slurm", "556"), share("slurm", "555"), share("slurm", "555")], "555,556"),
    ([share("user", "alice"), share("container", "0123456789ab")], ""),
])
def test_the_label_value_prefers_slurm_jobs_then_pods(shares: list[Share], value: str) -> None:
    assert job_label_value(shares) == value


def test_mig_instances_carry_their_own_owners_and_the_gpu_all_of_them() -> None:
    source = mig.store()
    accountant = Accountant(uuids(mig.INVENTORY), names=Names())
    snapshot = source.latest()
    assert snapshot is not None
    accountant.step(snapshot)
    found = families(text_of(source, accountant, job_label=True))
    assert by_label(found, "DCGM_FI_DEV_FB_USED", "0") == "research/llm"
    # GPU 1's instances: MIG-big allocated to research/finetune, MIG-small to research/notebook, the split
    # instance to no pod.
    assert by_label(found, "DCGM_FI_DEV_FB_USED", "1") == "research/finetune,research/notebook"
    instances = {labels["GPU_I_PROFILE"]: labels[JOB_LABEL] for labels, _ in found["DCGM_FI_DEV_FB_USED"]
                 if "GPU_I_ID" in labels}
    assert instances == {"3g.20gb": "research/finetune", "2g.10gb": "", "1g.5gb": "research/notebook"}


def test_metrics_setup_wires_the_job_label_setting() -> None:
    assert metrics_setup(Settings(), "node")[0].options.job_label is False
    assert metrics_setup(Settings(metrics_job_label=True), "node")[0].options.job_label is True
