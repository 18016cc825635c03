"""``/metrics``' collector beyond one series per GPU: the new families, MIG instances, pods and processes.

Expected values follow the definitions the families come from: DCGM's units (framebuffer in MiB, profiling fields
as ratios 0-1, ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` as NVML's TX + RX KiB/s divided by 1000, as DCGM's cache
manager computes it), and dcgm-exporter's labels (a MIG instance's series carry the parent GPU's ``gpu``, ``UUID``,
``pci_bus_id``, ``device`` and ``modelName`` plus ``GPU_I_PROFILE`` and the GPU instance id as ``GPU_I_ID``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from nvdash.metrics.collector import GPU_LABELS, KEPT_LABELS, ExportOptions, StoreCollector, process_name
from nvdash.metrics.counters import Counter, default_counters, parse_counters
from nvdash.metrics.exposition import text_format
from nvdash.sampling.records import GpuEvent, GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot
from nvdash.sampling.usage_records import (
    GpuProcess,
    GpuUsage,
    HostProcess,
    MigInstance,
    PodDevice,
    PodResources,
    Usage,
)
from nvdash.store import Store

MiB = 1024 * 1024
GiB = 1024 * MiB
HOST = HostInfo(hostname="node", cpu_count=16, memory_total_bytes=64 * GiB)
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-h100", 80 * GiB, 5, 16, 63e9, 18, 450e9,
               pci_bus_id="00000000:18:00.0", gpm_supported=True)
A100 = GpuInfo(1, "NVIDIA A100-PCIE-40GB", "GPU-a100", 40 * GiB, 4, 16, 31.5e9, 0, None,
               pci_bus_id="00000000:3B:00.0")
L4 = GpuInfo(2, "NVIDIA L4", "GPU-l4", 24 * GiB, 4, 16, 31.5e9, 0, None, pci_bus_id="00000000:86:00.0")
INVENTORY = Inventory(host=HOST, gpus=(H100, A100, L4), driver_version="550.54.15")

BIG = MigInstance(1, "MIG-big", gpu_instance_id=1, compute_instance_id=0, profile="3g.20gb", sm_count=42,
                  memory_used_bytes=18109 * MiB, memory_total_bytes=20096 * MiB, sm_active_pct=62.5)
SMALL = MigInstance(1, "MIG-small", gpu_instance_id=13, compute_instance_id=0, profile="1g.5gb", sm_count=14,
                    memory_used_bytes=13 * MiB, memory_total_bytes=4864 * MiB)
SPLIT_A = MigInstance(1, "MIG-split-a", gpu_instance_id=5, compute_instance_id=0, profile="1c.2g.10gb", sm_count=14,
                      memory_used_bytes=8205 * MiB, memory_total_bytes=9984 * MiB, sm_active_pct=20.0)
SPLIT_B = MigInstance(1, "MIG-split-b", gpu_instance_id=5, compute_instance_id=1, profile="1c.2g.10gb", sm_count=14,
                      memory_used_bytes=8205 * MiB, memory_total_bytes=9984 * MiB, sm_active_pct=60.0)

TRAINER = PodDevice("research", "llm", "trainer", "nvidia.com/gpu", "GPU-h100", "whole")
NOTEBOOK = PodDevice("research", "notebook", "jupyter", "nvidia.com/mig-1g.5gb", "MIG-small", "mig")
FINETUNE = PodDevice("research", "finetune", "main", "nvidia.com/mig-3g.20gb", "MIG-big", "mig")
SERVE_0 = PodDevice("prod", "serve-0", "server", "nvidia.com/gpu.shared", "GPU-l4::0", "shared")
SERVE_1 = PodDevice("prod", "serve-1", "server", "nvidia.com/gpu.shared", "GPU-l4::1", "shared")
SERVE_1_AGAIN = PodDevice("prod", "serve-1", "server", "nvidia.com/gpu.shared", "GPU-l4::2", "shared")
ELSEWHERE = PodDevice("prod", "ghost", "main", "nvidia.com/gpu", "GPU-not-on-this-node", "whole")


def python(pid: int) -> HostProcess:
    return HostProcess(pid, user="alice", command="/opt/conda/bin/python3 train.py --epochs 3")


PROCESSES = (
    GpuProcess(0, "GPU-h100", 101, ("compute",), gpu_memory_bytes=70 * GiB, sm_pct=87.5, host=python(101),
               pod_namespace="research", pod_name="llm", container_name="trainer"),
    GpuProcess(1, "GPU-a100", 201, ("compute",), gpu_memory_bytes=14000 * MiB, mig_uuid="MIG-big",
               mig_profile="3g.20gb", host=None, pod_namespace="research", pod_name="finetune", container_name="main"),
    GpuProcess(2, "GPU-l4", 301, ("compute",), gpu_memory_bytes=None, sm_pct=12.0,
               host=HostProcess(301, command="tritonserver"), pod_namespace="prod", pod_name="serve-0",
               container_name="server"),
)
USAGE = Usage(
    time_s=1000.0,
    gpus=(GpuUsage(0, "GPU-h100", mig_enabled=False),
          GpuUsage(1, "GPU-a100", mig_enabled=True, instances=(BIG, SPLIT_A, SPLIT_B, SMALL)),
          GpuUsage(2, "GPU-l4")),
    processes=PROCESSES,
    pods=PodResources(devices=(TRAINER, NOTEBOOK, FINETUNE, SERVE_0, SERVE_1, SERVE_1_AGAIN, ELSEWHERE),
                      available=True, status="ok"),
)
SAMPLES = (
    GpuSample(0, utilization_pct=90.0, memory_utilization_pct=41.0, memory_used_bytes=30 * GiB,
              memory_total_bytes=80 * GiB, temperature_c=61.0, pcie_tx_bytes_per_s=2.5e9, pcie_rx_bytes_per_s=1.25e9,
              nvlink_tx_bytes_per_s=1.2e11, nvlink_rx_bytes_per_s=1.1e11, gpm_graphics_active_pct=93.0),
    GpuSample(1, memory_used_bytes=29340 * MiB, memory_total_bytes=40 * GiB, temperature_c=45.0,
              pcie_tx_bytes_per_s=1e6, pcie_rx_bytes_per_s=2e6),
    GpuSample(2, utilization_pct=30.0, memory_utilization_pct=5.0, memory_used_bytes=2 * GiB,
              memory_total_bytes=24 * GiB, temperature_c=50.0),
)

Series = dict[str, list[tuple[dict[str, str], float]]]


def store(samples: tuple[GpuSample, ...] = SAMPLES, usage: Usage | None = USAGE,
          events: list[GpuEvent] | None = None) -> Store:
    result = Store(INVENTORY, capacity=4)
    result.append(Snapshot(1000.0, samples, HostSample(), usage=usage))
    result.add_events(events or [])
    return result


def scrape(source: Store, counters: list[Counter] | None = None, *, pods: bool = False, processes: bool = False,
           drop_labels: frozenset[str] = frozenset()) -> Series:
    registry = CollectorRegistry(auto_describe=False)
    options = ExportOptions(hostname="node", drop_labels=drop_labels, pods=pods, processes=processes)
    registry.register(StoreCollector(source, counters or default_counters(), options))
    text = text_format(registry.collect()).decode()
    return {family.name: [(sample.labels, sample.value) for sample in family.samples] for family in parse_text(text)}


def gpu_labels(info: GpuInfo) -> dict[str, str]:
    return {"gpu": str(info.index), "UUID": info.uuid, "pci_bus_id": info.pci_bus_id, "device": f"nvidia{info.index}",
            "modelName": info.name, "Hostname": "node", "DCGM_FI_DRIVER_VERSION": "550.54.15"}


def of(series: Series, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, value) for labels, value in series.get(name, [])
            if all(labels.get(key) == wanted for key, wanted in match.items())]


def plain(series: Series, name: str) -> dict[str, float]:
    """Per GPU index, the value of its series without MIG or pod labels."""
    return {labels["gpu"]: value for labels, value in series.get(name, [])
            if not {"GPU_I_ID", "pod"} & set(labels)}


# ---------------------------------------------------------------------------------------------- new families


def test_the_new_gpu_families_follow_dcgms_units() -> None:
    found = scrape(store())
    assert plain(found, "DCGM_FI_DEV_MEM_COPY_UTIL") == {"0": 41.0, "2": 5.0}  # percent, as NVML's memory util
    assert plain(found, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") == {"0": 0.93}  # a ratio of time
    assert plain(found, "DCGM_FI_PROF_PCIE_TX_BYTES") == {"0": 2.5e9, "1": 1e6}  # bytes per second
    assert plain(found, "DCGM_FI_PROF_PCIE_RX_BYTES") == {"0": 1.25e9, "1": 2e6}
    # DCGM: (TX + RX KiB/s) / 1000; 2.3e11 B/s = 224,609,375 KiB/s -> 224,609.375.
    assert plain(found, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == {"0": (1.2e11 + 1.1e11) / 1024 / 1000}
    assert plain(found, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")["0"] == 224_609.375


def test_the_default_file_types_the_rates_as_gauges() -> None:
    kinds = {counter.name: counter.kind for counter in default_counters()}
    for name in ("DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
                 "DCGM_FI_PROF_PCIE_RX_BYTES", "nvdash_pod_gpu_allocated",
                 "nvdash_pod_gpu_idle", "nvdash_process_gpu_memory_bytes", "nvdash_process_sm_utilization_ratio"):
        assert kinds[name] == "gauge", name
    # A rate too, but dcgm-exporter's default file types it a counter, and dashboards built on it expect that.
    assert kinds["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == "counter"


# ---------------------------------------------------------------------------------------------- MIG


def test_each_gpu_instance_gets_its_own_series_with_the_parents_labels() -> None:
    found = scrape(store())
    parent = gpu_labels(A100)
    used = of(found, "DCGM_FI_DEV_FB_USED", gpu="1")
    assert [(labels.get("GPU_I_PROFILE"), labels.get("GPU_I_ID"), value) for labels, value in used] == [
        (None, None, 29340.0),  # the GPU's own series stays as it is
        ("3g.20gb", "1", 18109.0),
        ("2g.10gb", "5", 8205.0),  # two compute instances of one GPU instance: one series
        ("1g.5gb", "13", 13.0),
    ]
    assert used[1][0] == {**parent, "GPU_I_PROFILE": "3g.20gb", "GPU_I_ID": "1"}  # UUID: the parent GPU's
    free = {labels.get("GPU_I_ID"): value for labels, value in of(found, "DCGM_FI_DEV_FB_FREE", gpu="1")}
    assert free["1"] == 20096 - 18109  # MiB: the instance's total minus its used
    assert free["13"] == 4864 - 13
    with_total = scrape(store(), parse_counters("DCGM_FI_DEV_FB_TOTAL, gauge, Framebuffer memory total (in MiB).\n"))
    total = {labels.get("GPU_I_ID"): value for labels, value in of(with_total, "DCGM_FI_DEV_FB_TOTAL", gpu="1")}
    assert total == {None: 40 * 1024, "1": 20096, "5": 9984, "13": 4864}


def test_an_instances_activity_is_exported_where_it_is_known() -> None:
    found = scrape(store())
    active = {labels.get("GPU_I_ID"): value for labels, value in of(found, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="1")}
    # 3g.20gb: 62.5 %; the split 2g.10gb: its two compute instances' SMs weighted (14 x 20 + 14 x 60) / 28 = 40 %;
    # 1g.5gb: not reported, so no series.
    assert active == {"1": 0.625, "5": 0.4}


def test_device_wide_readings_stay_on_the_gpus_own_series() -> None:
    found = scrape(store())
    assert [labels.get("GPU_I_ID") for labels, _ in of(found, "DCGM_FI_DEV_GPU_TEMP", gpu="1")] == [None]
    assert [labels.get("GPU_I_ID") for labels, _ in of(found, "DCGM_FI_DEV_POWER_USAGE", gpu="1")] == []


def test_a_lost_gpu_has_no_instance_series() -> None:
    samples = (SAMPLES[0], GpuSample(1, lost=True), SAMPLES[2])
    found = scrape(store(samples))
    assert of(found, "DCGM_FI_DEV_FB_USED", gpu="1") == []
    assert of(found, "nvdash_gpu_lost", gpu="1") == [(gpu_labels(A100), 1.0)]


# ---------------------------------------------------------------------------------------------- pods


def test_pod_labels_and_families_need_the_option() -> None:
    found = scrape(store())
    assert all("pod" not in labels for family in found.values() for labels, _ in family)
    assert "nvdash_pod_gpu_allocated" not in found
    assert "nvdash_pod_gpu_idle" not in found
    assert "nvdash_process_gpu_memory_bytes" not in found


def test_an_allocated_gpu_is_labelled_with_its_pod() -> None:
    found = scrape(store(), pods=True)
    assert of(found, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == [
        ({**gpu_labels(H100), "namespace": "research", "pod": "llm", "container": "trainer"}, 90.0)]


def test_a_shared_gpu_has_one_series_per_pod() -> None:
    found = scrape(store(), pods=True)
    util = of(found, "DCGM_FI_DEV_GPU_UTIL", gpu="2")
    # Replicas GPU-l4::0 (serve-0) and ::1, ::2 (both serve-1): the device's value repeated once per container.
    assert sorted((labels["pod"], value) for labels, value in util) == [("serve-0", 30.0), ("serve-1", 30.0)]
    assert all(labels["namespace"] == "prod" and labels["container"] == "server" for labels, _ in util)


def test_a_mig_allocation_labels_its_instance_and_not_the_gpu() -> None:
    found = scrape(store(), pods=True)
    used = {(labels.get("GPU_I_ID"), labels.get("pod")): value
            for labels, value in of(found, "DCGM_FI_DEV_FB_USED", gpu="1")}
    assert used == {(None, None): 29340.0, ("1", "finetune"): 18109.0, ("5", None): 8205.0,
                    ("13", "notebook"): 13.0}


def test_the_pod_families_list_each_allocation_and_whether_it_is_idle() -> None:
    found = scrape(store(), pods=True)
    allocated = {(labels["pod"], labels.get("GPU_I_ID"), labels["resource"], labels["sharing"]): value
                 for labels, value in found["nvdash_pod_gpu_allocated"]}
    assert allocated == {
        ("llm", None, "nvidia.com/gpu", "whole"): 1.0,
        ("notebook", "13", "nvidia.com/mig-1g.5gb", "mig"): 1.0,
        ("finetune", "1", "nvidia.com/mig-3g.20gb", "mig"): 1.0,
        ("serve-0", None, "nvidia.com/gpu.shared", "shared"): 1.0,
        ("serve-1", None, "nvidia.com/gpu.shared", "shared"): 2.0,  # two replicas of the same GPU
    }  # the allocation of a GPU this node does not have is left out
    labels = next(labels for labels, _ in found["nvdash_pod_gpu_allocated"] if labels["pod"] == "notebook")
    assert labels == {**gpu_labels(A100), "GPU_I_PROFILE": "1g.5gb", "GPU_I_ID": "13", "namespace": "research",
                      "pod": "notebook", "container": "jupyter", "resource": "nvidia.com/mig-1g.5gb",
                      "sharing": "mig"}
    idle = {labels["pod"]: value for labels, value in found["nvdash_pod_gpu_idle"]}
    # A pod with a process on its device is busy; serve-1 runs nothing on the shared L4, notebook nothing in 1g.5gb.
    assert idle == {"llm": 0.0, "notebook": 1.0, "finetune": 0.0, "serve-0": 0.0, "serve-1": 1.0}
    assert {tuple(sorted(labels)) for labels, _ in found["nvdash_pod_gpu_idle"]} == {
        tuple(sorted(labels)) for labels, _ in found["nvdash_pod_gpu_allocated"]}


def test_without_a_usage_reading_the_pod_families_are_empty() -> None:
    found = scrape(store(usage=None), pods=True, processes=True)
    assert found["nvdash_pod_gpu_allocated"] == []
    assert found["nvdash_process_gpu_memory_bytes"] == []
    assert len(found["DCGM_FI_DEV_GPU_UTIL"]) == 2


def test_the_xid_family_keeps_its_error_labels_on_every_pod_series() -> None:
    found = scrape(store(events=[GpuEvent(990.0, 2, "xid", "Xid 13", "warning", 13)]), pods=True)
    xids = of(found, "DCGM_FI_DEV_XID_ERRORS", gpu="2")
    assert sorted((labels["pod"], labels["err_code"], value) for labels, value in xids) == [
        ("serve-0", "13", 13.0), ("serve-1", "13", 13.0)]


# ---------------------------------------------------------------------------------------------- processes


def test_process_families_one_series_per_process() -> None:
    found = scrape(store(), processes=True)
    memory = {labels["pid"]: (labels, value) for labels, value in found["nvdash_process_gpu_memory_bytes"]}
    assert set(memory) == {"101", "201"}  # NVML did not say how much memory 301 holds
    labels, value = memory["101"]
    assert labels == {**gpu_labels(H100), "pid": "101", "process_name": "python3"}
    assert value == 70 * GiB
    labels, value = memory["201"]
    assert labels == {**gpu_labels(A100), "GPU_I_PROFILE": "3g.20gb", "GPU_I_ID": "1", "pid": "201",
                      "process_name": ""}  # in another PID namespace: the host cannot name it
    assert value == 14000 * MiB
    sm = {labels["pid"]: value for labels, value in found["nvdash_process_sm_utilization_ratio"]}
    assert sm == {"101": 0.875, "301": 0.12}  # nvmlProcessUtilizationSample_t.smUtil / 100; none on MIG


def test_process_series_carry_their_pod_with_both_options() -> None:
    found = scrape(store(), processes=True, pods=True)
    pods = {labels["pid"]: (labels.get("namespace"), labels.get("pod"), labels.get("container"))
            for labels, _ in found["nvdash_process_sm_utilization_ratio"]}
    assert pods == {"101": ("research", "llm", "trainer"), "301": ("prod", "serve-0", "server")}


def test_process_names_are_the_executables_base_name() -> None:
    def named(command: str | None) -> str:
        host = None if command is None else HostProcess(1, command=command)
        return process_name(GpuProcess(0, "GPU-0", 1, ("compute",), host=host))

    assert named("/usr/bin/python3.11 -m torch.distributed.run train.py") == "python3.11"
    assert named("ollama serve") == "ollama"
    assert named("") == ""
    assert named(None) == ""


# ---------------------------------------------------------------------------------------------- labels


def test_dropping_labels_keeps_the_ones_that_tell_series_apart() -> None:
    drop = frozenset(set(GPU_LABELS) - {"gpu"}) | {"DCGM_FI_DRIVER_VERSION"}
    found = scrape(store(), pods=True, processes=True, drop_labels=drop)
    assert of(found, "DCGM_FI_DEV_FB_USED", gpu="1", GPU_I_ID="1")[0][0] == {
        "gpu": "1", "GPU_I_PROFILE": "3g.20gb", "GPU_I_ID": "1", "namespace": "research", "pod": "finetune",
        "container": "main"}
    assert {"GPU_I_PROFILE", "GPU_I_ID", "namespace", "pod", "container", "pid", "process_name", "resource",
            "sharing"} <= set(KEPT_LABELS)


def test_a_counters_file_without_the_new_families_exports_none_of_them() -> None:
    counters = parse_counters("DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n")
    found = scrape(store(), counters, pods=True, processes=True)
    assert set(found) == {"DCGM_FI_DEV_FB_USED"}
    assert len(found["DCGM_FI_DEV_FB_USED"]) == 3 + 1 + 3  # 3 GPUs, one more for the shared L4, 3 instances


def test_no_two_series_of_a_family_share_their_labels_and_openmetrics_reads_them() -> None:
    found = scrape(store(events=[GpuEvent(990.0, 2, "xid", "Xid 13", "warning", 13)]), pods=True, processes=True)
    for name, samples in found.items():
        label_sets = [tuple(sorted(labels.items())) for labels, _ in samples]
        assert len(label_sets) == len(set(label_sets)), name
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store(), default_counters(), ExportOptions(hostname="node", pods=True,
                                                                                processes=True), openmetrics=True))
    text = openmetrics_latest(registry).decode()
    parsed = {family.name: family for family in parse_openmetrics(text)}
    assert len(parsed["nvdash_pod_gpu_allocated"].samples) == 5
    assert len(parsed["DCGM_FI_DEV_FB_USED"].samples) == len(found["DCGM_FI_DEV_FB_USED"])
