"""``/metrics``' share families: each pod's part of a shared GPU (or MIG instance), and what no owner explains.

The records are built by hand (the sampler's share computation is tested on its own): an L4 time-sliced by three
pods whose processes kept the SMs busy 45 %, 27 % and 9 % of a window in which the GPU was 90 % busy, so each pod's
part of the GPU's power and energy is 0.5, 0.3 and 0.1, and 0.1 of it (plus nothing idle here) is unattributed.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.metrics.collector import ExportOptions, StoreCollector
from nvdash.metrics.compat import naming
from nvdash.metrics.counters import default_counters, parse_counters
from nvdash.metrics.exposition import text_format
from nvdash.metrics.fields import FAMILIES, POD_SHARE_FAMILIES, UNATTRIBUTED_FAMILIES
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.store import Store
from tests.unit.test_metrics_mig_pods import A100, INVENTORY, L4, SAMPLES, USAGE, MiB, gpu_labels

L4_START_MJ, L4_END_MJ = 5_000_000, 15_000_000
"""The L4's energy counter at the server's first reading and now: 10,000 J since."""


def pod(name: str, sm_pct: float, fraction: float, memory_mib: int, energy_j: float) -> OwnerShare:
    return OwnerShare(ShareOwner("pod", "prod", name, "server"), sm_pct=sm_pct, fraction=fraction,
                      memory_bytes=memory_mib * MiB, power_w=200.0 * fraction, energy_j=energy_j,
                      gpm_sm_active_pct=None, processes=1)


SLICED = UnitShares(
    gpu_index=2, gpu_uuid="GPU-l4", unit="GPU-l4", sharing="shared", window_s=2.0, utilization_pct=90.0,
    owners=(pod("serve-0", 45.0, 0.5, 4000, 5000.0), pod("serve-1", 27.0, 0.3, 2000, 3000.0),
            pod("serve-2", 9.0, 0.1, 1000, 1000.0)),
    unattributed_sm_pct=9.0, unattributed_memory_bytes=500 * MiB, unattributed_power_w=20.0,
    unattributed_energy_j=1000.0, measured=True)
FINETUNE = UnitShares(
    gpu_index=1, gpu_uuid="GPU-a100", unit="MIG-big", sharing="mig", window_s=2.0, utilization_pct=62.5,
    owners=(OwnerShare(ShareOwner("pod", "research", "finetune", "main"), sm_pct=50.0, fraction=0.8,
                       memory_bytes=14000 * MiB, power_w=40.0, energy_j=800.0, gpm_sm_active_pct=50.0,
                       processes=1),),
    unattributed_sm_pct=12.5, unattributed_memory_bytes=None, unattributed_power_w=10.0, unattributed_energy_j=200.0,
    measured=True)
BARE = UnitShares(
    gpu_index=0, gpu_uuid="GPU-h100", unit="GPU-h100", sharing="whole", window_s=2.0, utilization_pct=90.0,
    owners=(OwnerShare(ShareOwner("process", pid=4242), sm_pct=80.0, fraction=80.0 / 90.0, memory_bytes=None,
                       power_w=400.0, energy_j=8000.0, gpm_sm_active_pct=None, processes=1),),
    unattributed_sm_pct=10.0, unattributed_memory_bytes=None, unattributed_power_w=50.0, unattributed_energy_j=1000.0,
    measured=True)
"""The H100 run by a process outside any pod: it gets no series of its own."""

Series = dict[str, list[tuple[dict[str, str], float]]]


def with_energy(sample: GpuSample, energy_mj: int) -> GpuSample:
    return GpuSample(**{**{name: getattr(sample, name) for name in sample.__slots__}, "energy_mj": energy_mj})


def store(shares: tuple[UnitShares, ...] = (SLICED, FINETUNE, BARE), lost_l4: bool = False) -> Store:
    result = Store(INVENTORY, capacity=4)
    first = (SAMPLES[0], SAMPLES[1], with_energy(SAMPLES[2], L4_START_MJ))
    result.append(Snapshot(990.0, first, HostSample(), usage=USAGE))
    l4 = GpuSample(2, lost=True) if lost_l4 else with_energy(SAMPLES[2], L4_END_MJ)
    result.append(Snapshot(1000.0, (SAMPLES[0], SAMPLES[1], l4), HostSample(), usage=USAGE, shares=shares))
    return result


def exposition(source: Store, *, pods: bool = False, compat: str = "4.8") -> str:
    registry = CollectorRegistry(auto_describe=False)
    options = ExportOptions(hostname="node", pods=pods, naming=naming(compat))
    registry.register(StoreCollector(source, default_counters(), options))
    return text_format(registry.collect()).decode()


def scrape(source: Store, *, pods: bool = False, compat: str = "4.8") -> Series:
    return {family.name: [(sample.labels, sample.value) for sample in family.samples]
            for family in parse_text(exposition(source, pods=pods, compat=compat))}


def by_pod(series: Series, name: str) -> dict[str, float]:
    return {labels["pod"]: value for labels, value in series[name]}


def test_each_pod_gets_its_share_not_the_gpus_value_without_the_pods_option() -> None:
    found = scrape(store())
    # The parser names a counter's family without _total.
    assert by_pod(found, "nvdash_pod_gpu_sm_share_ratio") == {"serve-0": 0.45, "serve-1": 0.27, "serve-2": 0.09,
                                                              "finetune": 0.5}
    assert by_pod(found, "nvdash_pod_gpu_memory_bytes") == {"serve-0": 4000 * MiB, "serve-1": 2000 * MiB,
                                                            "serve-2": 1000 * MiB, "finetune": 14000 * MiB}
    assert by_pod(found, "nvdash_pod_gpu_power_watts") == {"serve-0": 100.0, "serve-1": 60.0, "serve-2": 20.0,
                                                           "finetune": 40.0}
    assert by_pod(found, "nvdash_pod_gpu_energy_joules") == {"serve-0": 5000.0, "serve-1": 3000.0, "serve-2": 1000.0,
                                                             "finetune": 800.0}
    serve_0 = next(labels for labels, _ in found["nvdash_pod_gpu_sm_share_ratio"] if labels["pod"] == "serve-0")
    assert serve_0 == {**gpu_labels(L4), "namespace": "prod", "pod": "serve-0", "container": "server",
                       "sharing": "shared"}
    # The device's own series are not repeated per pod without --metrics-pods.
    assert all("pod" not in labels for labels, _ in found["DCGM_FI_DEV_GPU_UTIL"])


def test_a_mig_instances_pod_carries_the_instances_labels() -> None:
    found = scrape(store())
    (labels, value), = [(labels, value) for labels, value in found["nvdash_pod_gpu_energy_joules"]
                        if labels["pod"] == "finetune"]
    assert labels == {**gpu_labels(A100), "GPU_I_PROFILE": "3g.20gb", "GPU_I_ID": "1", "namespace": "research",
                      "pod": "finetune", "container": "main", "sharing": "mig"}
    assert value == 800.0


def test_owners_that_are_not_pods_get_no_series_and_unattributed_is_per_device() -> None:
    found = scrape(store())
    assert all(labels["gpu"] != "0" for labels, _ in found["nvdash_pod_gpu_energy_joules"])  # the bare process
    unattributed = {(labels["gpu"], labels.get("GPU_I_ID")): value
                    for labels, value in found["nvdash_gpu_unattributed_energy_joules"]}
    assert unattributed == {("2", None): 1000.0, ("1", "1"): 200.0, ("0", None): 1000.0}
    sm = {labels["gpu"]: (labels, value) for labels, value in found["nvdash_gpu_unattributed_sm_ratio"]}
    assert sm["2"] == (gpu_labels(L4), 0.09)  # device labels only
    assert sm["0"][1] == 0.1
    assert {labels["gpu"]: value for labels, value in found["nvdash_gpu_unattributed_power_watts"]} == {
        "2": 20.0, "1": 10.0, "0": 50.0}


def test_the_pods_energy_and_the_unattributed_add_up_to_the_gpus_energy_counter_increase() -> None:
    found = scrape(store())
    pods = sum(value for labels, value in found["nvdash_pod_gpu_energy_joules"] if labels["gpu"] == "2")
    unattributed = sum(value for labels, value in found["nvdash_gpu_unattributed_energy_joules"]
                       if labels["gpu"] == "2")
    first, last = ([value for labels, value in scrape(store_at).get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", [])
                    if labels["gpu"] == "2"] for store_at in (first_only(), store()))
    assert (last[0] - first[0]) / 1000 == 10_000.0  # mJ -> J
    assert pods + unattributed == (last[0] - first[0]) / 1000


def first_only() -> Store:
    result = Store(INVENTORY, capacity=4)
    result.append(Snapshot(990.0, (SAMPLES[0], SAMPLES[1], with_energy(SAMPLES[2], L4_START_MJ)), HostSample(),
                           usage=USAGE))
    return result


def test_the_pods_option_keeps_the_devices_series_repeated_per_pod_beside_the_shares() -> None:
    found = scrape(store(), pods=True)
    util = [(labels.get("pod"), value) for labels, value in found["DCGM_FI_DEV_GPU_UTIL"] if labels["gpu"] == "2"]
    assert sorted(util) == [("serve-0", 30.0), ("serve-1", 30.0)]  # the kubelet's allocations, as before
    assert by_pod(found, "nvdash_pod_gpu_sm_share_ratio")["serve-1"] == 0.27


def test_a_lost_gpu_and_a_snapshot_without_shares_have_no_share_series() -> None:
    found = scrape(store(lost_l4=True))
    assert all(labels["gpu"] != "2" for name in (*POD_SHARE_FAMILIES, *UNATTRIBUTED_FAMILIES)
               for labels, _ in found.get(name.removesuffix("_total"), []))
    empty = scrape(store(shares=()))
    assert empty["nvdash_pod_gpu_sm_share_ratio"] == []
    assert empty["nvdash_gpu_unattributed_energy_joules"] == []


def test_a_counters_file_selects_the_share_families() -> None:
    assert set(POD_SHARE_FAMILIES) | set(UNATTRIBUTED_FAMILIES) <= FAMILIES
    kinds = {counter.name: counter.kind for counter in default_counters()}
    assert kinds["nvdash_pod_gpu_energy_joules_total"] == kinds["nvdash_gpu_unattributed_energy_joules_total"] \
        == "counter"
    assert kinds["nvdash_pod_gpu_sm_share_ratio"] == "gauge"
    registry = CollectorRegistry(auto_describe=False)
    counters = parse_counters("nvdash_pod_gpu_power_watts, gauge, Power (in W).\n")
    registry.register(StoreCollector(store(), counters, ExportOptions(hostname="node")))
    found = {family.name: family for family in parse_text(text_format(registry.collect()).decode())}
    assert set(found) == {"nvdash_pod_gpu_power_watts"}
    assert found["nvdash_pod_gpu_power_watts"].documentation == "Power (in W)."


def test_the_help_text_states_the_unit_and_that_other_owners_are_not_exported() -> None:
    helps = {counter.name: counter.help for counter in default_counters()}
    assert "(in J)" in helps["nvdash_pod_gpu_energy_joules_total"]
    assert "not pods are not exported per owner" in helps["nvdash_pod_gpu_sm_share_ratio"]
    assert "per-process utilization" in helps["nvdash_pod_gpu_sm_share_ratio"]
    assert "GPU's energy-counter increase" in helps["nvdash_gpu_unattributed_energy_joules_total"]


def test_under_4_9_naming_the_host_label_is_renamed_and_values_are_unchanged() -> None:
    found = scrape(store(), compat="4.9")
    labels, value = next((labels, value) for labels, value in found["nvdash_pod_gpu_power_watts"]
                         if labels["pod"] == "serve-0")
    assert labels["hostname"] == "node"
    assert "Hostname" not in labels
    assert value == 100.0


def test_openmetrics_types_the_energy_as_a_counter() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store(), default_counters(), ExportOptions(hostname="node"), openmetrics=True))
    parsed = {family.name: family for family in parse_openmetrics(openmetrics_latest(registry).decode())}
    energy = parsed["nvdash_pod_gpu_energy_joules"]
    assert energy.type == "counter"
    assert {s.labels["pod"]: s.value for s in energy.samples if s.name.endswith("_total")} == {
        "serve-0": 5000.0, "serve-1": 3000.0, "serve-2": 1000.0, "finetune": 800.0}


def test_promtool_parses_the_share_families_and_finds_nothing_wrong_with_their_names_or_types() -> None:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing (Debian's prometheus package)", pytrace=False)
    text = exposition(store())
    chunk = "".join(f"# HELP {block}" for block in text.split("# HELP ")[1:]
                    if block.startswith(("nvdash_pod_gpu_sm", "nvdash_pod_gpu_memory_bytes", "nvdash_pod_gpu_power",
                                         "nvdash_pod_gpu_energy", "nvdash_gpu_unattributed")))
    assert chunk.count("# TYPE") == 7
    result = subprocess.run([path, "check", "metrics"], input=chunk, capture_output=True, text=True, timeout=60,
                            check=False)
    problems = (result.stdout + result.stderr).strip().splitlines()
    # The one lint left is dcgm-exporter's own label names (UUID, modelName, Hostname), kept on purpose.
    assert problems, "promtool said nothing: the chunk was not linted"
    assert all(line.endswith("label names should be written in 'snake_case' not 'camelCase'") for line in problems), \
        problems
