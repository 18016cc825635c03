"""Cluster Pods: GPU utilization and memory per pod across the cluster (from Prometheus), filtered by the kind of
GPU a pod holds (whole, MIG, shared, vGPU), namespace and pod; the pods holding a GPU while idle; and per-namespace
totals for cost reports.

Every node's nvdash exports its pods' allocations (``nvdash_pod_gpu_allocated``, with ``--metrics-pods``); this
page reads them through the cluster poller's newest state and filters here, in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bokeh.document import Document
from bokeh.layouts import row
from bokeh.models import ColumnDataSource
from bokeh.models.widgets import Div, Select, TableColumn, TextInput

from nvdash.apps.cluster_view import follow_cluster, status_div, status_html
from nvdash.apps.context import AppContext
from nvdash.apps.figures import add_page, data_table, format_bytes, format_pct, text_color
from nvdash.apps.theme import apply_theme, request_arguments
from nvdash.apps.time_range import query_values
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.model import ClusterPod, ClusterState, gpu_shares

if TYPE_CHECKING:
    from bokeh.models.sources import DataDict

TITLE = "Cluster Pods"
ALL = "all"
KINDS: tuple[tuple[Any, str], ...] = (
    (ALL, "every kind of GPU"),
    ("whole", "whole GPU"),
    ("mig", "MIG instance"),
    ("shared", "shared (time-slicing, MPS)"),
    ("vgpu", "vGPU"),
)
KIND_NAMES = dict(KINDS)
NO_PODS = ("No pod holds a GPU in Prometheus's answer. Pods appear when each node's nvdash runs with "
           "--metrics-pods and can read its kubelet's pod-resources socket.")


@dataclass(frozen=True)
class PodFilter:
    """Which allocations to show: a kind of GPU, a namespace, and text the pod's name must contain."""

    kind: str = ALL
    namespace: str = ALL
    pod: str = ""

    def keeps(self, pod: ClusterPod) -> bool:
        """Whether ``pod`` passes every filter."""
        return (self.kind in (ALL, pod.sharing)
                and self.namespace in (ALL, pod.namespace)
                and self.pod.strip().lower() in pod.pod.lower())


def pod_rows(pods: Sequence[ClusterPod], shares: Sequence[float]) -> DataDict:
    """The pods table: one row per allocation."""
    return {
        "node": [pod.hostname for pod in pods],
        "namespace": [pod.namespace for pod in pods],
        "pod": [pod.pod for pod in pods],
        "container": [pod.container for pod in pods],
        "device": [pod.device for pod in pods],
        "kind": [KIND_NAMES.get(pod.sharing, pod.sharing) for pod in pods],
        "share": [f"{share:.2f}" for share in shares],
        "util": [format_pct(pod.utilization_pct, 0) for pod in pods],
        "memory": [format_bytes(pod.memory_used_bytes) for pod in pods],
        "idle": ["idle" if pod.idle else "" for pod in pods],
    }


def namespace_rows(pods: Sequence[ClusterPod], shares: Sequence[float]) -> DataDict:
    """Per namespace: pods, devices, whole-GPU equivalents, share-weighted mean utilization, memory, idle ones."""
    totals: dict[str, dict[str, Any]] = {}
    for pod, share in zip(pods, shares, strict=True):
        total = totals.setdefault(pod.namespace, {"pods": set(), "devices": 0, "share": 0.0, "busy": 0.0,
                                                  "weight": 0.0, "memory": 0.0, "idle": 0.0})
        total["pods"].add(pod.pod)
        total["devices"] += 1
        total["share"] += share
        if pod.utilization_pct is not None:
            total["busy"] += pod.utilization_pct * share
            total["weight"] += share
        total["memory"] += pod.memory_used_bytes or 0.0
        total["idle"] += share if pod.idle else 0.0
    names = sorted(totals)
    return {
        "namespace": names,
        "pods": [len(totals[name]["pods"]) for name in names],
        "devices": [totals[name]["devices"] for name in names],
        "share": [f"{totals[name]['share']:.2f}" for name in names],
        "util": [format_pct(totals[name]["busy"] / totals[name]["weight"], 0) if totals[name]["weight"] else "n/a"
                 for name in names],
        "memory": [format_bytes(totals[name]["memory"]) for name in names],
        "idle": [f"{totals[name]['idle']:.2f}" for name in names],
    }


def shown(state: ClusterState, keep: PodFilter) -> tuple[list[ClusterPod], list[float]]:
    """The allocations passing ``keep`` and their GPU shares (counted over every pod, so filtering keeps them)."""
    shares = gpu_shares(state.pods)
    kept = [(pod, share) for pod, share in zip(state.pods, shares, strict=True) if keep.keeps(pod)]
    return [pod for pod, _ in kept], [share for _, share in kept]


def _columns(specs: Sequence[tuple[str, str, int]]) -> list[TableColumn]:
    return [TableColumn(field=field, title=title, width=width) for field, title, width in specs]


POD_COLUMNS = (("node", "node", 140), ("namespace", "namespace", 120), ("pod", "pod", 220),
               ("container", "container", 120), ("device", "device", 150), ("kind", "kind", 170),
               ("share", "GPU share", 70), ("util", "utilization", 80), ("memory", "memory used", 95),
               ("idle", "30 min", 60))
NAMESPACE_COLUMNS = (("namespace", "namespace", 160), ("pods", "pods", 60), ("devices", "devices", 70),
                     ("share", "GPUs held", 80), ("util", "mean utilization", 110), ("memory", "memory used", 110),
                     ("idle", "GPUs held idle", 110))


def build(doc: Document, ctx: AppContext) -> None:
    """Filters, the pods table, the idle allocations and the per-namespace totals."""
    cluster = ctx.cluster
    if cluster is None:
        raise RuntimeError("the cluster pages need --prometheus")
    _PodsPage(doc, cluster).open()


class _PodsPage:
    def __init__(self, doc: Document, cluster: ClusterRuntime) -> None:
        self.doc = doc
        self.cluster = cluster
        dark = apply_theme(doc)
        given = query_values(request_arguments(doc))
        self.state = ClusterState()
        self.status = status_div(dark)
        self.kind = Select(title="GPU kind", value=given.get("kind", ALL) if given.get("kind") in KIND_NAMES else ALL,
                           options=list[str | tuple[Any, str]](KINDS), width=220)
        every = list[str | tuple[Any, str]]([(ALL, "every namespace")])
        self.namespace = Select(title="namespace", value=ALL, options=every, width=200)
        self.wanted_namespace = given.get("namespace", ALL)
        self.pod = TextInput(title="pod name contains", value=given.get("pod", ""), width=220)
        for widget in (self.kind, self.namespace):
            widget.on_change("value", self._filtered)
        self.pod.on_change("value_input", self._filtered)
        self.note = Div(text="", styles={"color": text_color(dark)}, sizing_mode="stretch_width")
        self.pods = ColumnDataSource(data=pod_rows([], []))
        self.idle = ColumnDataSource(data=pod_rows([], []))
        self.namespaces = ColumnDataSource(data=namespace_rows([], []))
        heading: dict[str, str | None] = {"color": text_color(dark), "font-weight": "bold", "margin-top": "6px"}
        add_page(
            doc, TITLE, self.status,
            row(self.kind, self.namespace, self.pod, sizing_mode="stretch_width"), self.note,
            Div(text="GPU use per pod", styles=heading),
            data_table(self.pods, _columns(POD_COLUMNS), dark, height=260, sizing_mode="stretch_width"),
            Div(text="Allocated but idle for the last 30 min (no process of the pod on it, or 0 % utilization)",
                styles=heading),
            data_table(self.idle, _columns(POD_COLUMNS), dark, height=150, sizing_mode="stretch_width"),
            Div(text="Per namespace", styles=heading),
            data_table(self.namespaces, _columns(NAMESPACE_COLUMNS), dark, height=180, sizing_mode="stretch_width"),
            dark=dark,
        )

    def open(self) -> None:
        follow_cluster(self.doc, self.cluster, self._on_state)

    def _filter(self) -> PodFilter:
        return PodFilter(str(self.kind.value), str(self.namespace.value), str(self.pod.value_input or
                                                                                  self.pod.value or ""))

    def _on_state(self, state: ClusterState) -> None:
        self.state = state
        nodes = len({pod.hostname for pod in state.pods})
        pods = len({(pod.namespace, pod.pod) for pod in state.pods})
        self.status.text = status_html(self.cluster, state, f"{pods} pods hold {len(state.pods)} GPU devices on "
                                                            f"{nodes} nodes")
        namespaces = sorted({pod.namespace for pod in state.pods})
        options = list[str | tuple[Any, str]]([(ALL, "every namespace"), *((name, name) for name in namespaces)])
        if [tuple(option) if isinstance(option, (list, tuple)) else option
                for option in self.namespace.options] != options:
            self.namespace.options = options
        if self.wanted_namespace in namespaces and self.namespace.value == ALL:
            self.namespace.value = self.wanted_namespace  # _filtered redraws
            self.wanted_namespace = ALL
            return
        self._redraw()

    def _filtered(self, _attr: str, _old: Any, _new: Any) -> None:
        self._redraw()

    def _redraw(self) -> None:
        state = self.state
        pods, shares = shown(state, self._filter())
        idle = [(pod, share) for pod, share in zip(pods, shares, strict=True) if pod.idle]
        self.pods.data = pod_rows(pods, shares)
        self.idle.data = pod_rows([pod for pod, _ in idle], [share for _, share in idle])
        self.namespaces.data = namespace_rows(pods, shares)
        if state.ok_time_s is not None and not state.pods:
            self.note.text = NO_PODS
        elif state.pods and not pods:
            self.note.text = "No pod matches these filters."
        else:
            self.note.text = ""
