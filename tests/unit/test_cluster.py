"""The cluster model over Prometheus answers, the range step, and the client's failures on real sockets."""

from __future__ import annotations

import math
import socket
import time

import numpy as np
import pytest

from nvdash.cluster.history import MIN_STEP_S, PrometheusHistory, choose_step, quote
from nvdash.cluster.model import (
    GPU_QUERY,
    IDLE_QUERY,
    POD_VALUES_QUERY,
    SEEN_QUERY,
    ClusterPod,
    build_gpus,
    build_pods,
    gpu_health,
    gpu_records,
    gpu_shares,
    mig_slices,
)
from nvdash.cluster.poller import ClusterPoller
from nvdash.cluster.promapi import PrometheusClient, PrometheusError
from nvdash.health.status import Status

MIB = 1024 * 1024
NOW = 1_800_000_000.0


def labels(host: str, gpu: int, name: str | None = None, **extra: str) -> dict[str, str]:
    found = {"Hostname": host, "gpu": str(gpu), "UUID": f"GPU-{host}-{gpu}", "modelName": "NVIDIA H100 80GB HBM3",
             "instance": "10.0.0.1:8000", "job": "nvdash", **extra}
    if name is not None:
        found["__name__"] = name
    return found


HEALTHY = {
    "DCGM_FI_DEV_GPU_UTIL": 73.0, "DCGM_FI_DEV_FB_USED": 40960.0, "DCGM_FI_DEV_FB_FREE": 39980.0,
    "DCGM_FI_DEV_FB_RESERVED": 539.0, "DCGM_FI_DEV_GPU_TEMP": 54.0, "DCGM_FI_DEV_SLOWDOWN_TEMP": 87.0,
    "DCGM_FI_DEV_POWER_USAGE": 512.5, "DCGM_FI_DEV_XID_ERRORS": 0.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 0.0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0, "DCGM_FI_DEV_PCIE_LINK_GEN": 5.0,
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16.0, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16.0,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0, "nvdash_gpu_lost": 0.0,
}


def test_readings_turn_back_into_nvdash_units() -> None:
    info, sample = gpu_records(3, "NVIDIA H100 80GB HBM3", "GPU-x", HEALTHY)
    # dcgm-exporter writes framebuffer sizes in MiB: used + free + reserved is the total.
    assert sample.memory_used_bytes == 40960 * MIB
    assert sample.memory_reserved_bytes == 539 * MIB
    assert info.memory_total_bytes == sample.memory_total_bytes == (40960 + 39980 + 539) * MIB
    assert (sample.utilization_pct, sample.temperature_c, sample.power_w) == (73.0, 54.0, 512.5)
    assert (info.pcie_generation, info.pcie_width, info.temperature_slowdown_c) == (5, 16, 87.0)
    assert sample.remap_pending is False
    assert sample.lost is False


def test_the_enforced_limit_and_the_requested_one_are_kept_apart() -> None:
    # DCGM_FI_DEV_ENFORCED_POWER_LIMIT is what the driver enforces after every limiter (a 450 W cap here);
    # DCGM_FI_DEV_POWER_MGMT_LIMIT the management limit requested (700 W).
    both = {**HEALTHY, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 450.0, "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700.0}
    _info, sample = gpu_records(0, "H100", "GPU-x", both)
    assert (sample.power_limit_w, sample.power_management_limit_w) == (450.0, 700.0)
    # A plain dcgm-exporter whose counters file lists only the management limit: the enforced one falls back to it.
    _info, plain = gpu_records(0, "H100", "GPU-x", {**HEALTHY, "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700.0})
    assert (plain.power_limit_w, plain.power_management_limit_w) == (700.0, 700.0)
    # dcgm-exporter's default counters have neither: unknown, and the GPU is still judged.
    _info, neither = gpu_records(0, "H100", "GPU-x", HEALTHY)
    assert (neither.power_limit_w, neither.power_management_limit_w) == (None, None)
    assert gpu_health(0, "H100", "GPU-x", HEALTHY, NOW).status is Status.OK
    # Read from Prometheus's answer with every other reading.
    current = [(labels("node-a", 0, name), value) for name, value in both.items()]
    (gpu,) = build_gpus(current, [], NOW)
    assert (gpu.value("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"), gpu.value("DCGM_FI_DEV_POWER_MGMT_LIMIT")) == (450.0, 700.0)


def test_a_healthy_gpu_is_ok_and_each_problem_is_found() -> None:
    assert gpu_health(0, "H100", "GPU-x", HEALTHY, NOW).status is Status.OK
    dbe = gpu_health(0, "H100", "GPU-x", {**HEALTHY, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 2.0}, NOW)
    assert dbe.status is Status.CRITICAL
    assert dbe.findings[0].text == "2 uncorrectable ECC errors since the driver loaded"
    pending = gpu_health(0, "H100", "GPU-x", {**HEALTHY, "DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0}, NOW)
    assert pending.status is Status.CRITICAL
    hot = gpu_health(0, "H100", "GPU-x", {**HEALTHY, "DCGM_FI_DEV_GPU_TEMP": 86.0}, NOW)
    assert hot.status is Status.WARNING
    assert "slowdown threshold (87 °C)" in hot.findings[0].text
    # Busy at x8 on an x16 link: downtrained.
    narrow = gpu_health(0, "H100", "GPU-x", {**HEALTHY, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 8.0}, NOW)
    assert narrow.status is Status.WARNING
    assert narrow.findings[0].text == "PCIe Gen5 x16 running at x8"


def test_the_last_xid_counts_as_the_xid_alert_counts_it() -> None:
    # XID 79: the GPU fell off the bus (critical); XID 13: a graphics engine exception, an application's fault.
    fallen = gpu_health(1, "H100", "GPU-x", {**HEALTHY, "DCGM_FI_DEV_XID_ERRORS": 79.0}, NOW)
    assert fallen.status is Status.CRITICAL
    assert fallen.findings[0].text == "last XID 79: GPU fell off the bus"
    app = gpu_health(1, "H100", "GPU-x", {**HEALTHY, "DCGM_FI_DEV_XID_ERRORS": 13.0}, NOW)
    assert app.status is Status.WARNING
    assert app.findings[0].kind == "xid"


def test_a_lost_gpu_and_a_silent_one() -> None:
    lost = gpu_health(2, "H100", "GPU-x", {"nvdash_gpu_lost": 1.0}, NOW)
    assert lost.status is Status.CRITICAL
    assert lost.findings[0].kind == "lost"
    silent = gpu_health(2, "H100", "GPU-x", {}, NOW, reporting=False)
    assert silent.status is Status.WARNING
    assert silent.findings[0].text.startswith("not reporting")


def test_gpus_come_from_the_current_answer_and_the_last_hour() -> None:
    current = [(labels("node-a", gpu, name), value) for gpu in (0, 1) for name, value in HEALTHY.items()]
    current.append((labels("node-b", 0, "DCGM_FI_DEV_GPU_UTIL"), 5.0))
    current.append(({"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0"}, 1.0))  # no Hostname: not a node's GPU
    seen = [labels("node-a", 0), labels("node-a", 1), labels("node-b", 0), labels("node-c", 0)]
    gpus = build_gpus(current, seen, NOW)
    assert [(gpu.hostname, gpu.index, gpu.reporting) for gpu in gpus] == [
        ("node-a", 0, True), ("node-a", 1, True), ("node-b", 0, True), ("node-c", 0, False)]
    first = gpus[0]
    assert first.utilization_pct == 73.0
    assert first.memory_used_bytes == 40960 * MIB
    assert first.memory_total_bytes == (40960 + 39980 + 539) * MIB
    assert first.model == "NVIDIA H100 80GB HBM3"
    assert gpus[3].health.status is Status.WARNING
    assert gpus[2].memory_total_bytes is None  # FB_FREE unknown


def test_pods_join_their_allocation_readings_and_idleness() -> None:
    pod = {"namespace": "research", "pod": "train", "container": "main"}
    allocated = [
        labels("node-a", 0, "nvdash_pod_gpu_allocated", resource="nvidia.com/gpu", sharing="whole", **pod),
        labels("node-c", 0, "nvdash_pod_gpu_allocated", resource="nvidia.com/mig-1g.5gb", sharing="mig",
               GPU_I_PROFILE="1g.5gb", GPU_I_ID="14", namespace="batch", pod="idle-job", container="c"),
        labels("node-a", 1, "nvdash_pod_gpu_allocated", resource="nvidia.com/gpu", sharing="whole"),  # no pod
    ]
    values = [
        (labels("node-a", 0, "DCGM_FI_DEV_GPU_UTIL", **pod), 88.0),
        (labels("node-a", 0, "DCGM_FI_DEV_FB_USED", **pod), 1024.0),
        (labels("node-c", 0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", GPU_I_ID="14", namespace="batch", pod="idle-job",
                container="c"), 0.25),
    ]
    idle = [(labels("node-c", 0, GPU_I_ID="14", namespace="batch", pod="idle-job", container="c"), 1.0)]
    rows = build_pods(allocated, values, idle)
    assert [(row.namespace, row.pod, row.device, row.sharing) for row in rows] == [
        ("batch", "idle-job", "GPU 0 · 1g.5gb #14", "mig"), ("research", "train", "GPU 0", "whole")]
    mig, whole = rows
    assert (whole.utilization_pct, whole.memory_used_bytes, whole.idle) == (88.0, 1024 * MIB, False)
    assert mig.utilization_pct == 25.0  # the instance's graphics-engine activity, a ratio, as a percentage
    assert mig.memory_used_bytes is None
    assert mig.idle is True


HEALTHY_4_9 = {
    # dcgm-exporter 4.9's names for the same readings, in its units: utilization a 0-1 ratio, framebuffer in bytes.
    "DCGM_FI_DEV_GPU_UTIL_RATIO": 0.73, "DCGM_FI_DEV_FB_USED_BYTES": 40960.0 * MIB,
    "DCGM_FI_DEV_FB_FREE_BYTES": 39980.0 * MIB, "DCGM_FI_DEV_FB_RESERVED_BYTES": 539.0 * MIB,
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": 54.0, "DCGM_FI_DEV_SLOWDOWN_TEMP": 87.0, "DCGM_FI_DEV_BOARD_POWER_WATTS": 512.5,
    "DCGM_FI_DEV_XID_ERROR": 0.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0, "DCGM_FI_DEV_ROW_REMAP_PENDING": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_FAILED": 0.0, "DCGM_FI_DEV_PCIE_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5.0,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16.0, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16.0,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0.0, "nvdash_gpu_lost": 0.0,
}


def labels_4_9(host: str, gpu: int, name: str | None = None, **extra: str) -> dict[str, str]:
    """A series' labels as dcgm-exporter 4.9 writes them: the host under ``hostname``."""
    found = labels(host, gpu, name, **extra)
    found["hostname"] = found.pop("Hostname")
    return found


def test_a_node_with_4_9_names_reads_as_one_with_4_8_names() -> None:
    current = [(labels("old", 0, name), value) for name, value in HEALTHY.items()]
    current += [(labels_4_9("new", 0, name), value) for name, value in HEALTHY_4_9.items()]
    # XID 48 on GPU 1 of each: DCGM_FI_DEV_XID_ERRORS in 4.8, DCGM_FI_DEV_XID_ERROR in 4.9.
    current += [(labels("old", 1, "DCGM_FI_DEV_XID_ERRORS"), 48.0),
                (labels_4_9("new", 1, "DCGM_FI_DEV_XID_ERROR"), 48.0)]
    seen = [labels_4_9("new", 2)]
    gpus = build_gpus(current, seen, NOW)
    assert [(gpu.hostname, gpu.index, gpu.reporting) for gpu in gpus] == [
        ("new", 0, True), ("new", 1, True), ("new", 2, False), ("old", 0, True), ("old", 1, True)]
    new, old = gpus[0], gpus[3]
    assert new.values == pytest.approx(old.values)
    assert new.utilization_pct == pytest.approx(73.0)
    assert new.memory_used_bytes == 40960 * MIB
    assert new.memory_total_bytes == (40960 + 39980 + 539) * MIB
    assert new.health == old.health
    assert new.health.status is Status.OK
    assert gpus[1].health.findings[0].text == gpus[4].health.findings[0].text
    assert gpus[1].health.findings[0].text.startswith("last XID 48: ")


def test_a_node_exporting_both_namings_is_one_gpu_with_one_value_per_reading() -> None:
    current = [(labels("both", 0, name), value) for name, value in HEALTHY.items()]
    current += [(labels_4_9("both", 0, name), value) for name, value in HEALTHY_4_9.items()]
    seen = [labels("both", 0), labels_4_9("both", 0)]
    (gpu,) = build_gpus(current, seen, NOW)
    assert gpu.values == pytest.approx(HEALTHY)
    assert gpu.memory_used_bytes == 40960 * MIB


def test_pods_on_a_4_9_node_read_their_devices_in_nvdash_units() -> None:
    pod = {"namespace": "research", "pod": "train", "container": "main"}
    allocated = [labels_4_9("new", 0, "nvdash_pod_gpu_allocated", resource="nvidia.com/gpu", sharing="whole", **pod),
                 labels_4_9("new", 1, "nvdash_pod_gpu_allocated", resource="nvidia.com/mig-3g.20gb", sharing="mig",
                            GPU_I_PROFILE="3g.20gb", GPU_I_ID="2", **pod)]
    values = [(labels_4_9("new", 0, "DCGM_FI_DEV_GPU_UTIL_RATIO", **pod), 0.88),
              (labels_4_9("new", 0, "DCGM_FI_DEV_FB_USED_BYTES", **pod), 1024.0 * MIB),
              (labels_4_9("new", 1, "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", GPU_I_ID="2", **pod), 0.25)]
    idle = [(labels_4_9("new", 1, GPU_I_ID="2", **pod), 1.0)]
    whole, mig = build_pods(allocated, values, idle)
    assert (whole.hostname, whole.device, whole.memory_used_bytes, whole.idle) == ("new", "GPU 0", 1024 * MIB, False)
    assert whole.utilization_pct == pytest.approx(88.0)
    assert (mig.device, mig.utilization_pct, mig.idle) == ("GPU 1 · 3g.20gb #2", 25.0, True)


def test_a_pod_listed_by_two_exporters_of_one_node_is_one_row() -> None:
    # Two nvdash exporters on one node, one with --metrics-compat 4.9: the allocation arrives under both host labels.
    pod = {"namespace": "research", "pod": "train", "container": "main", "resource": "nvidia.com/gpu",
           "sharing": "whole"}
    allocated = [labels("both", 0, "nvdash_pod_gpu_allocated", **pod),
                 labels_4_9("both", 0, "nvdash_pod_gpu_allocated", **pod)]
    (row,) = build_pods(allocated, [], [])
    assert (row.hostname, row.pod, row.device) == ("both", "train", "GPU 0")


def test_queries_name_each_family_under_both_namings() -> None:
    # Each family the overview reads, under 4.8's name and 4.9's; the host under either label.
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_FB_USED_BYTES",
                 "DCGM_FI_DEV_XID_ERROR", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT"):
        assert f"|{name}|" in GPU_QUERY.replace('"', "|")
    assert "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO" in POD_VALUES_QUERY
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in IDLE_QUERY
    assert SEEN_QUERY.startswith("group by (Hostname, hostname, gpu, UUID, modelName) (")
    assert "last_over_time(DCGM_FI_DEV_GPU_TEMP_CELSIUS[1h])" in SEEN_QUERY


def pod(sharing: str, gpu: int = 0, host: str = "n", profile: str = "") -> ClusterPod:
    return ClusterPod(host, "ns", f"p-{sharing}-{gpu}-{profile}", "c", gpu, "GPU-x", "r", sharing, profile)


def test_gpu_shares_count_whole_gpus_mig_slices_and_shared_replicas() -> None:
    pods = [pod("whole", 0), pod("mig", 1, profile="3g.20gb"), pod("mig", 1, profile="1c.3g.20gb"),
            pod("shared", 2), pod("shared", 2), pod("shared", 2, host="m"), pod("vgpu", 3)]
    assert gpu_shares(pods) == pytest.approx([1.0, 3 / 7, 3 / 7, 0.5, 0.5, 1.0, 1.0])
    assert (mig_slices("7g.40gb"), mig_slices("1g.5gb+me"), mig_slices("weird")) == (7, 1, None)


def test_gpu_shares_count_mps_replicas_like_shared_ones() -> None:
    assert gpu_shares([pod("mps", 0), pod("mps", 0), pod("mps", 0)]) == pytest.approx([1 / 3] * 3)


def test_the_step_gives_at_most_about_500_points_and_never_below_a_scrape() -> None:
    assert choose_step(0, 1800) == MIN_STEP_S  # 30 min: 3.6 s wanted, 15 s given
    assert choose_step(0, 6 * 3600) == 60.0  # 43.2 s wanted
    assert choose_step(0, 7 * 86400) == 1800.0  # 1209.6 s wanted
    for seconds in (600, 3600, 12 * 3600, 2 * 86400, 7 * 86400, 90 * 86400):
        assert seconds / choose_step(0, seconds) <= 500


def test_selectors_quote_label_values() -> None:
    assert quote('a"b\\c') == '"a\\"b\\\\c"'
    history = PrometheusHistory(PrometheusClient("http://127.0.0.1:1"), 'node "x"')
    assert history.selector("DCGM_FI_DEV_GPU_UTIL", [0, 3]) == (
        'DCGM_FI_DEV_GPU_UTIL{Hostname="node \\"x\\"", GPU_I_ID="", gpu=~"0|3"}')
    assert history.selector("DCGM_FI_DEV_GPU_UTIL", None, "hostname") == (
        'DCGM_FI_DEV_GPU_UTIL{hostname="node \\"x\\"", GPU_I_ID=""}')
    with pytest.raises(ValueError, match="not read from Prometheus"):
        history.query(["nvlink_bytes_per_s"], 0, 10)


def test_an_unreachable_prometheus_is_one_line(closed_port: int) -> None:
    client = PrometheusClient(f"http://127.0.0.1:{closed_port}", timeout_s=2.0)
    with pytest.raises(PrometheusError) as raised:
        client.instant("up")
    assert str(raised.value) == f"cannot reach Prometheus at {client.url}: Connection refused"


def test_a_prometheus_that_does_not_answer_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepted by the kernel, never answered
        client = PrometheusClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
        began = time.monotonic()
        with pytest.raises(PrometheusError) as raised:
            client.range("up", NOW - 60, NOW, 15)
        assert time.monotonic() - began < 30  # bounded by the timeout, not hanging
    assert str(raised.value) == f"Prometheus at {client.url} did not answer within 0.5 s"


def test_the_poller_keeps_the_last_answer_and_says_why_it_failed(closed_port: int) -> None:
    poller = ClusterPoller(PrometheusClient(f"http://127.0.0.1:{closed_port}", timeout_s=1.0))
    first = poller.refresh()
    assert first.error is not None
    assert "Connection refused" in first.error
    assert first.ok_time_s is None
    assert first.generation == 1
    second = poller.refresh()
    assert second.generation == 2
    assert poller.state() is second


def test_range_points_become_bucket_series_with_gaps() -> None:
    step = 60.0
    times = np.array([NOW, NOW + 60, NOW + 120, NOW + 600], dtype=np.float64)
    mean = np.array([1.0, 2.0, 3.0, 4.0])
    series = PrometheusHistory._series({"mean": (times, mean), "minimum": (times[:3], mean[:3] - 1),
                                        "maximum": (times, mean + 1)}, step)
    # Each point summarises the step before it; the 8-minute silence is a gap (NaN).
    assert list(series.time_s[:3]) == [NOW - 60, NOW, NOW + 60]
    assert math.isnan(series.mean[3])
    assert list(series.mean[[0, 1, 2, 4]]) == [1.0, 2.0, 3.0, 4.0]
    assert math.isnan(series.minimum[-1])  # no minimum at that time
    assert series.maximum[-1] == 5.0


def test_a_pod_on_a_shared_gpu_gets_its_own_share_and_memory_where_the_node_exports_them() -> None:
    assert "nvdash_pod_gpu_sm_share_ratio" in POD_VALUES_QUERY
    assert "nvdash_pod_gpu_memory_bytes" in POD_VALUES_QUERY
    serve = [{"namespace": "prod", "pod": f"serve-{n}", "container": "server"} for n in range(3)]
    allocated = [labels("node-a", 2, "nvdash_pod_gpu_allocated", resource="nvidia.com/gpu.shared", sharing="shared",
                        **pod) for pod in serve]
    values = [(labels("node-a", 2, "DCGM_FI_DEV_GPU_UTIL", **pod), 90.0) for pod in serve]  # repeated per pod
    values += [(labels("node-a", 2, "nvdash_pod_gpu_sm_share_ratio", sharing="shared", **pod), ratio)
               for pod, ratio in zip(serve[:2], (0.45, 0.27), strict=True)]
    values += [(labels("node-a", 2, "nvdash_pod_gpu_memory_bytes", sharing="shared", **pod), mib * MIB)
               for pod, mib in zip(serve[:2], (4000, 2000), strict=True)]
    rows = {row.pod: row for row in build_pods(allocated, values, [])}
    assert [(rows[pod].utilization_pct, rows[pod].sm_share_pct, rows[pod].pod_memory_bytes)
            for pod in ("serve-0", "serve-1", "serve-2")] == [
        (90.0, 45.0, 4000 * MIB), (90.0, 27.0, 2000 * MIB), (90.0, None, None)]  # serve-2's node has no shares


def test_a_mig_pods_share_is_read_from_its_instances_series() -> None:
    pod = {"namespace": "research", "pod": "finetune", "container": "main"}
    allocated = [labels("node-c", 0, "nvdash_pod_gpu_allocated", resource="nvidia.com/mig-3g.20gb", sharing="mig",
                        GPU_I_PROFILE="3g.20gb", GPU_I_ID="1", **pod)]
    values = [(labels("node-c", 0, "nvdash_pod_gpu_sm_share_ratio", GPU_I_PROFILE="3g.20gb", GPU_I_ID="1", **pod),
               0.5),
              (labels("node-c", 0, "nvdash_pod_gpu_sm_share_ratio", GPU_I_PROFILE="1g.5gb", GPU_I_ID="13", **pod),
               0.9)]  # another instance's series: not this allocation's
    (row,) = build_pods(allocated, values, [])
    assert row.sm_share_pct == 50.0
    assert row.pod_memory_bytes is None
