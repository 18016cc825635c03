"""GPU Processes and GPU Memory's MIG rows, built on bare documents from snapshots carrying hand-made usage."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from bokeh.core.validation import check_integrity
from bokeh.document import Document
from bokeh.models import ColumnDataSource, FactorRange, Model, Plot, Row
from bokeh.models.widgets import DataTable, Div, Select, TableColumn, TextInput

from nvdash.apps import APPS, AppContext, Requirement, gpu_memory, gpu_processes, process_notes
from nvdash.apps.process_memory import FREE, OTHER, PROCESS, TOP_PROCESSES, UNATTRIBUTED, memory_columns
from nvdash.apps.process_table import ProcessFilter, format_runtime
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot
from nvdash.sampling.usage_records import (
    CgroupIdentity,
    GpuProcess,
    GpuUsage,
    HostProcess,
    MigInstance,
    PodDevice,
    PodResources,
    Usage,
)
from nvdash.store import Store
from tests.unit.test_apps import assert_floats, models, tick, values

M = TypeVar("M", bound=Model)
GiB = 1024**3
NAN = math.nan
NOW = 1002.0

HOST = HostInfo(hostname="node", cpu_count=16, memory_total_bytes=64 * GiB)
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 80 * GiB, 5, 16, 63e9, 18, 450e9)
A100 = GpuInfo(1, "NVIDIA A100-SXM4-40GB", "GPU-1", 40 * GiB, 4, 16, 31.5e9, 12, 300e9)
L4 = GpuInfo(2, "NVIDIA L4", "GPU-2", 24 * GiB, 4, 16, 31.5e9, 0, None)
INVENTORY = Inventory(host=HOST, gpus=(H100, A100, L4), driver_version="550.54")

MIG_A = MigInstance(1, "MIG-a", 1, 0, "3g.20gb", memory_used_bytes=7 * GiB, memory_total_bytes=20 * GiB)
MIG_B = MigInstance(1, "MIG-b", 2, 0, "2g.10gb", memory_used_bytes=1 * GiB, memory_total_bytes=10 * GiB)
CONTAINERD_ID = "0123456789ab" + "c" * 52
DOCKER_ID = "fedcba987654" + "d" * 52
LONG_COMMAND = "python -m torch.distributed.run --nproc-per-node 8 " + "--flag value " * 10

TRAINER = GpuProcess(
    0, "GPU-0", 4242, ("compute",), 20 * GiB, sm_pct=85.0,
    host=HostProcess(4242, "alice", "python train.py --epochs 100", cpu_pct=150.0, rss_bytes=8 * GiB,
                     started_s=NOW - (3 * 3600 + 12 * 60 + 5),
                     cgroup=CgroupIdentity("containerd", CONTAINERD_ID, pod_uid="uid-1", qos="guaranteed")),
    pod_namespace="training", pod_name="trainer-0", container_name="trainer")
VIEWER = GpuProcess(
    0, "GPU-0", 4343, ("graphics", "compute"), 4 * GiB, sm_pct=5.0,
    host=HostProcess(4343, "bob", LONG_COMMAND, cpu_pct=2.5, rss_bytes=GiB, started_s=NOW - 45))
HIDDEN = GpuProcess(0, "GPU-0", 999, ("compute",), 2 * GiB)
SERVER = GpuProcess(
    1, "GPU-1", 5000, ("compute",), 6 * GiB, mig_uuid="MIG-a", mig_profile="3g.20gb",
    host=HostProcess(5000, "carol", "tritonserver --model-repository=/models", cpu_pct=40.0, rss_bytes=3 * GiB,
                     started_s=NOW - 600, cgroup=CgroupIdentity("docker", DOCKER_ID, pod_uid="uid-2")),
    pod_namespace="inference", pod_name="server-1", container_name="triton")
MPS_CLIENT = GpuProcess(
    1, "GPU-1", 5001, ("mps",), GiB // 2, mig_uuid="MIG-b", mig_profile="2g.10gb",
    host=HostProcess(5001, "carol", "python serve.py", started_s=NOW - 90000,
                     cgroup=CgroupIdentity(slurm_job="4711")))

PODS = PodResources(devices=(
    PodDevice("training", "trainer-0", "trainer", "nvidia.com/gpu", "GPU-0", "whole"),
    PodDevice("inference", "server-1", "triton", "nvidia.com/mig-3g.20gb", "MIG-a", "mig"),
    PodDevice("notebooks", "jupyter-3", "notebook", "nvidia.com/gpu.shared", "GPU-2::1", "shared"),
    PodDevice("research", "sweep-7", "worker", "nvidia.com/mig-2g.10gb", "MIG-c", "mig"),
), available=True, status="The kubelet lists 4 GPU devices allocated to pods.")

USAGE = Usage(
    NOW,
    gpus=(GpuUsage(0, "GPU-0", mig_enabled=False, process_utilization=True),
          GpuUsage(1, "GPU-1", mig_enabled=True, instances=(MIG_B, MIG_A)),
          GpuUsage(2, "GPU-2", processes_readable=False)),
    processes=(HIDDEN, SERVER, VIEWER, MPS_CLIENT, TRAINER),
    pods=PODS,
)


def snapshot(time_s: float, usage: Usage | None, gpu0_gib: float = 30) -> Snapshot:
    return Snapshot(time_s, (
        GpuSample(0, memory_used_bytes=int(gpu0_gib * GiB), memory_total_bytes=80 * GiB),
        GpuSample(1, memory_used_bytes=10 * GiB, memory_total_bytes=40 * GiB),
        GpuSample(2, memory_used_bytes=5 * GiB, memory_total_bytes=24 * GiB),
    ), HostSample(), usage=usage)


def make_ctx(*rows: Snapshot) -> AppContext:
    store = Store(INVENTORY, capacity=100)
    for row in rows or (snapshot(1001.0, None), snapshot(NOW, USAGE)):
        store.append(row)
    return AppContext(store=store, interval_s=1.0)


class Page:
    """A GPU Processes document and its parts, found by name."""

    def __init__(self, ctx: AppContext) -> None:
        self.doc = Document()
        gpu_processes.build(self.doc, ctx)

    def named(self, name: str, kind: type[M]) -> M:
        found = self.doc.select_one({"name": name})
        assert isinstance(found, kind), name
        return found

    @property
    def table(self) -> ColumnDataSource:
        return self.named("processes", ColumnDataSource)

    def column(self, name: str) -> list[Any]:
        return values(self.table, name)

    def choose(self, name: str, value: str) -> None:
        """Pick a value in a filter, as the browser would (the change callbacks run)."""
        if name == "command":
            self.named("filter-command", TextInput).value_input = value
            return
        select = self.named(f"filter-{name}", Select)
        assert isinstance(select.options, list)
        assert value in [option if isinstance(option, str) else option and option[0] for option in select.options]
        select.value = value


# --- the registry ---------------------------------------------------------------------------------------


def test_gpu_processes_follows_gpu_memory_and_needs_a_gpu() -> None:
    routes = [spec.route for spec in APPS]
    assert routes.index("/GPU-Processes") == routes.index("/GPU-Memory") + 1
    spec = APPS[routes.index("/GPU-Processes")]
    assert (spec.title, spec.requires) == ("GPU Processes", Requirement.GPU)


# --- the table ------------------------------------------------------------------------------------------


def test_table_rows_are_formatted_for_reading() -> None:
    data = gpu_processes.columns(USAGE)
    assert data["pid"] == [4242, 4343, 999, 5000, 5001], "by GPU, then the largest memory holder first"
    assert data["gpu"] == [0, 0, 0, 1, 1]
    assert data["mig"] == ["", "", "", "3g.20gb GI 1 / CI 0", "2g.10gb GI 2 / CI 0"]
    assert data["user"] == ["alice", "bob", "not visible from here", "carol", "carol"]
    assert data["container"] == ["containerd 0123456789ab", "", "", "docker fedcba987654", "Slurm job 4711"]
    assert data["container_full"][:4] == [f"trainer containerd {CONTAINERD_ID}", "", "", f"triton docker {DOCKER_ID}"]
    assert data["pod"] == ["trainer-0", "", "", "server-1", ""]
    assert data["namespace"] == ["training", "", "", "inference", ""]
    assert data["type"] == ["compute", "compute+graphics", "compute", "compute", "MPS"]
    assert data["memory"] == ["20.0 GiB", "4.0 GiB", "2.0 GiB", "6.0 GiB", "512.0 MiB"]
    assert_floats(data["memory_bytes"], [20 * GiB, 4 * GiB, 2 * GiB, 6 * GiB, GiB / 2])
    assert data["sm"] == ["85.0 %", "5.0 %", "not reported", "not reported", "not reported"]
    assert_floats(data["sm_pct"], [85.0, 5.0, NAN, NAN, NAN])
    assert data["cpu"] == ["150.0 %", "2.5 %", "n/a", "40.0 %", "n/a"]
    assert data["rss"] == ["8.0 GiB", "1.0 GiB", "n/a", "3.0 GiB", "n/a"]
    assert data["runtime"] == ["3h 12m", "45 s", "n/a", "10m 0s", "1d 1h"]
    assert_floats(data["runtime_s"], [3 * 3600 + 12 * 60 + 5, 45, NAN, 600, 90000])
    assert data["command"][0] == data["command_full"][0] == "python train.py --epochs 100"
    assert data["command"][2] == "not visible from here"
    assert data["command_full"][1] == LONG_COMMAND
    assert len(data["command"][1]) == 80
    assert data["command"][1].endswith("…")
    assert LONG_COMMAND.startswith(data["command"][1][:-1])


def test_runtime_reads_in_the_largest_units() -> None:
    assert [format_runtime(s) for s in (0, 45.7, 61, 3600 * 3 + 12 * 60 + 59, 86400 * 2 + 3 * 3600, None, -5)] == [
        "0 s", "45 s", "1m 1s", "3h 12m", "2d 3h", "n/a", "0 s"]


@pytest.mark.parametrize(("keep", "pids"), [
    (ProcessFilter(gpu=1), [5000, 5001]),
    (ProcessFilter(gpu=2), []),
    (ProcessFilter(user="carol"), [5000, 5001]),
    (ProcessFilter(user="not visible from here"), [999]),
    (ProcessFilter(namespace="training"), [4242]),
    (ProcessFilter(pod="server-1"), [5000]),
    (ProcessFilter(text="TRAIN.py"), [4242]),
    (ProcessFilter(text="python"), [4242, 4343, 5001]),
    (ProcessFilter(gpu=0, text="python", user="bob"), [4343]),
    (ProcessFilter(gpu=1, namespace="training"), []),
])
def test_filters_keep_the_matching_rows(keep: ProcessFilter, pids: list[int]) -> None:
    assert gpu_processes.columns(USAGE, keep)["pid"] == pids


def test_page_shows_the_latest_usage_and_filters_through_its_widgets() -> None:
    page = Page(make_ctx())
    assert page.doc.title == "GPU Processes"
    assert page.column("pid") == [4242, 4343, 999, 5000, 5001]
    (table,) = [t for t in models(page.doc, DataTable) if t.name == "process-table"]
    assert table.sortable
    assert [column.field for column in table.columns][:4] == ["gpu", "mig", "pid", "user"]
    assert all(column.visible for column in table.columns), "processes run on MIG, in containers and in pods"
    assert page.named("filter-user", Select).options == ["all", "alice", "bob", "carol", "not visible from here"]
    assert page.named("filter-namespace", Select).options == ["all", "inference", "training"]
    assert page.named("filter-pod", Select).options == ["all", "server-1", "trainer-0"]
    assert page.named("count", Div).text == "showing 5 of 5"

    page.choose("gpu", "0")
    assert page.column("pid") == [4242, 4343, 999]
    page.choose("user", "bob")
    assert page.column("pid") == [4343]
    assert page.named("count", Div).text == "showing 1 of 5"
    page.choose("user", "all")
    page.choose("command", "EPOCHS")
    assert page.column("pid") == [4242]
    page.choose("command", "")
    page.choose("gpu", "all")
    page.choose("namespace", "inference")
    assert page.column("pid") == [5000]
    page.choose("namespace", "all")
    page.choose("pod", "trainer-0")
    assert page.column("user") == ["alice"]


# --- memory by process ----------------------------------------------------------------------------------


def _bars(snap: Snapshot) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    return memory_columns(INVENTORY.gpus, snap)


def _segments(data: dict[str, list[Any]], row: str) -> list[dict[str, Any]]:
    return [{name: data[name][i] for name in data} for i, r in enumerate(data["row"]) if r == row]


def test_memory_bars_add_up_to_the_used_memory_and_name_the_top_processes() -> None:
    segments, labels = _bars(snapshot(NOW, USAGE))
    assert labels["row"] == ["GPU 0", "GPU 1", "GPU 1 / MIG 3g.20gb (GI 1)", "GPU 1 / MIG 2g.10gb (GI 2)", "GPU 2"]
    assert labels["label"][0] == "30.0 / 80.0 GiB, 3 processes"
    gpu0 = _segments(segments, "GPU 0")
    assert [s["part"] for s in gpu0] == [PROCESS, PROCESS, PROCESS, UNATTRIBUTED, FREE]
    assert [s["pid"] for s in gpu0[:3]] == ["4242", "4343", "999"]
    assert [s["user"] for s in gpu0[:3]] == ["alice", "bob", "not visible from here"]
    assert gpu0[0]["command"] == "python train.py --epochs 100"
    assert gpu0[0]["memory"] == "20.0 GiB (25.0 %)"
    assert gpu0[0]["inside"] == "4242 alice", "a wide segment names its process"
    assert gpu0[2]["inside"] == "", "a narrow one leaves that to the hover"
    used = sum(s["bytes"] for s in gpu0 if s["part"] != FREE)
    assert used == 30 * GiB
    assert gpu0[3]["bytes"] == 30 * GiB - (20 + 4 + 2) * GiB
    assert gpu0[4]["bytes"] == 50 * GiB
    assert [s["left"] for s in gpu0[1:]] == pytest.approx([s["right"] for s in gpu0[:-1]]), "segments meet"
    assert gpu0[-1]["right"] == pytest.approx(100.0)

    mig_a = _segments(segments, "GPU 1 / MIG 3g.20gb (GI 1)")
    assert [(s["part"], s["bytes"]) for s in mig_a] == [(PROCESS, 6 * GiB), (UNATTRIBUTED, GiB), (FREE, 13 * GiB)]
    assert mig_a[0]["left"] == 0.0
    assert mig_a[0]["right"] == pytest.approx(30.0), "against the instance's own 20 GiB"

    gpu2 = _segments(segments, "GPU 2")
    assert [(s["part"], s["bytes"]) for s in gpu2] == [(UNATTRIBUTED, 5 * GiB), (FREE, 19 * GiB)]
    assert gpu2[0]["command"] == "used memory (NVML did not list the processes)"


def test_the_small_tail_is_grouped_as_other() -> None:
    many = tuple(replace(TRAINER, pid=100 + n, gpu_memory_bytes=(10 - n) * GiB) for n in range(TOP_PROCESSES + 2))
    segments, _ = _bars(snapshot(NOW, replace(USAGE, processes=many), gpu0_gib=70))
    gpu0 = _segments(segments, "GPU 0")
    assert [s["pid"] for s in gpu0[:TOP_PROCESSES]] == [str(100 + n) for n in range(TOP_PROCESSES)]
    other = gpu0[TOP_PROCESSES]
    assert (other["part"], other["bytes"], other["command"]) == (OTHER, (4 + 3) * GiB, "2 smaller processes")
    assert sum(s["bytes"] for s in gpu0 if s["part"] != FREE) == 70 * GiB


def test_more_process_memory_than_used_leaves_no_negative_part() -> None:
    segments, _ = _bars(snapshot(NOW, USAGE, gpu0_gib=25))
    gpu0 = _segments(segments, "GPU 0")
    assert gpu0[3]["bytes"] == 0
    assert gpu0[4]["bytes"] == (80 - 26) * GiB
    assert gpu0[-1]["right"] == pytest.approx(100.0)


def test_before_the_first_reading_the_page_says_it_is_collecting() -> None:
    page = Page(make_ctx(snapshot(1000.0, None)))
    status = page.named("status", Div).text
    assert "Collecting processes..." in status
    assert page.column("pid") == []
    assert page.named("count", Div).text == ""
    segments = page.named("memory-segments", ColumnDataSource)
    assert values(segments, "row") == ["GPU 0", "GPU 0", "GPU 1", "GPU 1", "GPU 2", "GPU 2"]
    assert values(segments, "part") == [UNATTRIBUTED, FREE] * 3
    assert values(segments, "command")[0] == "used memory (processes not read yet)"
    assert values(page.named("memory-labels", ColumnDataSource), "label") == [
        "30.0 / 80.0 GiB", "10.0 / 40.0 GiB", "5.0 / 24.0 GiB"]
    assert not page.named("idle-table", DataTable).visible
    assert not page.named("process-table", DataTable).visible, "no empty table and filters before a reading"
    assert not page.named("filters", Row).visible


def test_the_first_reading_replaces_the_collecting_state() -> None:
    ctx = make_ctx(snapshot(1000.0, None))
    page = Page(ctx)
    ctx.store.append(snapshot(1001.0, USAGE))
    tick(page.doc)
    assert "Collecting" not in page.named("status", Div).text
    assert page.named("process-table", DataTable).visible
    assert page.named("filters", Row).visible
    assert page.column("pid") == [4242, 4343, 999, 5000, 5001]
    assert page.named("count", Div).text == "showing 5 of 5"


def test_an_empty_store_says_it_is_collecting() -> None:
    empty = Page(AppContext(Store(INVENTORY, capacity=10), interval_s=1.0))
    assert "Collecting processes..." in empty.named("status", Div).text


# --- status and idle allocations ------------------------------------------------------------------------


def test_status_names_the_kubelet_answer_and_what_nvml_left_out() -> None:
    assert process_notes.status_lines(USAGE) == [
        "5 processes on 2 GPUs.",
        "The kubelet lists 4 GPU devices allocated to pods.",
        "NVML would not list the processes of GPU 2: their used memory shows as not attributed.",
        'GPU 1 does not report per-process utilization: SM % reads "not reported".',
        "1 process not visible from here (another PID namespace, or exited): user, command and host figures "
        "unknown.",
    ]
    quiet = Usage(NOW, gpus=(GpuUsage(0, "GPU-0", process_utilization=True),))
    assert process_notes.status_lines(quiet) == ["No process is using a GPU.", "Kubernetes pod lookup is off."]


def test_idle_allocations_are_listed_with_their_gpu() -> None:
    data = process_notes.idle_columns(USAGE)
    assert data == {
        "namespace": ["notebooks", "research"],
        "pod": ["jupyter-3", "sweep-7"],
        "container": ["notebook", "worker"],
        "resource": ["nvidia.com/gpu.shared", "nvidia.com/mig-2g.10gb"],
        "device": ["GPU-2::1", "MIG-c"],
        "gpu": ["GPU 2", ""],
        "type": ["shared", "MIG"],
    }
    page = Page(make_ctx())
    assert page.named("idle-table", DataTable).visible
    assert values(page.named("idle", ColumnDataSource), "pod") == ["jupyter-3", "sweep-7"]


def test_no_idle_allocation_is_said_in_words() -> None:
    busy = replace(USAGE, pods=replace(PODS, devices=PODS.devices[:2]))
    page = Page(make_ctx(snapshot(NOW, busy)))
    assert not page.named("idle-table", DataTable).visible
    assert page.named("idle-note", Div).text == "None: every GPU allocated to a pod runs a process of that pod."
    off = Page(make_ctx(snapshot(NOW, replace(USAGE, pods=PodResources()))))
    assert off.named("idle-note", Div).text == "Not known without the kubelet's list of pods (see the status above)."


# --- live updates ---------------------------------------------------------------------------------------


def test_a_new_reading_changes_the_table_and_keeps_the_filters() -> None:
    ctx = make_ctx()
    page = Page(ctx)
    page.choose("user", "bob")
    assert page.column("pid") == [4343]
    assert tick(page.doc) == [], "nothing new, nothing sent"

    newcomer = replace(VIEWER, pid=4444, gpu_index=2, gpu_uuid="GPU-2", gpu_memory_bytes=3 * GiB)
    later = replace(USAGE, time_s=NOW + 2, processes=(TRAINER, newcomer))
    ctx.store.append(snapshot(NOW + 2, later))
    tick(page.doc)
    assert page.named("filter-user", Select).value == "bob"
    assert page.named("filter-user", Select).options == ["all", "alice", "bob"]
    assert page.column("pid") == [4444]
    assert page.column("gpu") == [2]
    assert page.named("count", Div).text == "showing 1 of 2"
    page.choose("user", "all")
    assert page.column("pid") == [4242, 4444]
    assert page.column("runtime") == ["3h 12m", "47 s"]
    assert page.named("filter-user", Select).options == ["all", "alice", "bob"], "carol has gone"
    segments = page.named("memory-segments", ColumnDataSource)
    assert [p for p, r in zip(values(segments, "pid"), values(segments, "row"), strict=True) if r == "GPU 2"] == [
        "4444", "", ""]

    ctx.store.append(snapshot(NOW + 3, later, gpu0_gib=40))
    tick(page.doc)
    bars = page.named("memory-segments", ColumnDataSource)
    gpu0 = _segments({name: values(bars, name) for name in bars.data}, "GPU 0")
    assert gpu0[1]["bytes"] == 20 * GiB, "the memory bars follow every snapshot"


def test_columns_nobody_has_a_value_in_are_hidden() -> None:
    ctx = make_ctx()
    page = Page(ctx)
    (table,) = [t for t in models(page.doc, DataTable) if t.name == "process-table"]
    plain = replace(VIEWER, pid=7, gpu_index=1, gpu_uuid="GPU-1")
    ctx.store.append(snapshot(NOW + 2, replace(USAGE, processes=(VIEWER, plain))))
    tick(page.doc)
    hidden = [column.field for column in table.columns if not column.visible]
    assert hidden == ["mig", "container", "pod", "namespace"]


def test_a_selected_value_that_disappears_stays_selectable() -> None:
    ctx = make_ctx()
    page = Page(ctx)
    page.choose("pod", "server-1")
    ctx.store.append(snapshot(NOW + 2, replace(USAGE, processes=(TRAINER,))))
    tick(page.doc)
    assert page.named("filter-pod", Select).options == ["all", "server-1", "trainer-0"]
    assert page.column("pid") == []


@pytest.mark.parametrize("forged", [None, 7, ["alice"], {"x": 1}])
def test_a_forged_filter_value_filters_nothing_and_updates_go_on(forged: object) -> None:
    """Select's value takes anything a client's PATCH-DOC sends; a value that is no option must not break the
    page's updates."""
    ctx = make_ctx()
    page = Page(ctx)
    unfiltered = page.column("pid")
    assert len(unfiltered) == len(USAGE.processes)
    page.named("filter-user", Select).value = forged
    assert page.column("pid") == unfiltered
    newcomer = replace(VIEWER, pid=4444, gpu_index=2, gpu_uuid="GPU-2", gpu_memory_bytes=3 * GiB)
    ctx.store.append(snapshot(NOW + 2, replace(USAGE, time_s=NOW + 2, processes=(TRAINER, newcomer))))
    tick(page.doc)
    assert page.column("pid") == [4242, 4444]
    assert page.named("filter-user", Select).options == ["all", "alice", "bob"]


def test_the_document_is_valid() -> None:
    page = Page(make_ctx())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        issues = check_integrity(list(page.doc.roots))
    assert issues.error == []
    assert issues.warning == []
    (plot,) = models(page.doc, Plot)
    assert isinstance(plot.y_range, FactorRange)
    assert list(plot.y_range.factors) == list(reversed(values(page.named("memory-labels", ColumnDataSource), "row")))
    assert all(isinstance(column, TableColumn) for table in models(page.doc, DataTable) for column in table.columns)


# --- GPU Memory: MIG rows -------------------------------------------------------------------------------


def test_gpu_memory_shows_each_mig_instance_under_its_gpu() -> None:
    ctx = make_ctx(snapshot(1000.0, None))
    doc = Document()
    gpu_memory.build(doc, ctx)
    (source,) = models(doc, ColumnDataSource)
    (plot,) = models(doc, Plot)
    assert values(source, "gpu") == ["GPU 0", "GPU 1", "GPU 2"]

    ctx.store.append(snapshot(1001.0, USAGE))
    tick(doc)
    assert values(source, "gpu") == ["GPU 0", "GPU 1", "GPU 1 / MIG 3g.20gb (GI 1)", "GPU 1 / MIG 2g.10gb (GI 2)",
                                     "GPU 2"]
    assert isinstance(plot.y_range, FactorRange)
    assert list(plot.y_range.factors) == list(reversed(values(source, "gpu")))
    assert_floats(values(source, "used_bytes"), [30 * GiB, 10 * GiB, 7 * GiB, GiB, 5 * GiB])
    assert_floats(values(source, "total_bytes"), [80 * GiB, 40 * GiB, 20 * GiB, 10 * GiB, 24 * GiB])
    assert_floats(values(source, "used_pct"), [37.5, 25.0, 35.0, 10.0, 100 * 5 / 24])
    assert values(source, "label")[1:4] == ["10.0 / 40.0 GiB (25 %)", "7.0 / 20.0 GiB (35 %)",
                                            "1.0 / 10.0 GiB (10 %)"]
    assert values(source, "description")[2] == "1: NVIDIA A100-SXM4-40GB / MIG 3g.20gb GI 1 / CI 0 (MIG-a)"
    assert values(source, "reserved")[2] == "n/a"

    ctx.store.append(snapshot(1002.0, replace(USAGE, gpus=(GpuUsage(1, "GPU-1", mig_enabled=False),))))
    tick(doc)
    assert values(source, "gpu") == ["GPU 0", "GPU 1", "GPU 2"], "MIG off: the instance rows go"


def test_compute_instances_sharing_a_gpu_instance_get_their_own_rows() -> None:
    halves = (replace(MIG_A, uuid="MIG-x", profile="1c.3g.20gb"),
              replace(MIG_A, uuid="MIG-y", profile="1c.3g.20gb", compute_instance_id=1))
    usage = replace(USAGE, gpus=(GpuUsage(1, "GPU-1", mig_enabled=True, instances=halves),))
    data = gpu_memory.columns(INVENTORY.gpus, snapshot(NOW, usage))
    assert data["gpu"][2:4] == ["GPU 1 / MIG 1c.3g.20gb (GI 1, CI 0)", "GPU 1 / MIG 1c.3g.20gb (GI 1, CI 1)"]
