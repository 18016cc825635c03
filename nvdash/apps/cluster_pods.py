"""Cluster Pods: GPU utilization and memory per pod across the cluster (from Prometheus), filtered by the kind of
GPU a pod holds (whole, MIG, time-sliced, MPS, vGPU), namespace and pod; the pods holding a GPU while idle;
per-namespace totals for cost reports; and the chosen pod's SM share and memory over a past range.

Every node's nvdash exports its pods' allocations (``nvdash_pod_gpu_allocated``, with ``--metrics-pods``), shares
(``nvdash_pod_gpu_sm_share_ratio``, ``nvdash_pod_gpu_memory_bytes``), quotas and quota findings; this page reads them
through the cluster poller's newest state and filters here, in Python, and a pod's timelines with range queries. On a
single node without Prometheus it reads the same from the node itself: its newest snapshot's allocations, shares and
quota findings, the pods its history file recorded over the chosen range, and their timelines from that file.

The three filters live in the page's URL (``?kind=mps&namespace=team&pod=infer``, with ``range``/``from``/``to``):
a bookmark reopens the same view, and choosing updates the URL.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any, Protocol, cast

from bokeh.document import Document
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, CustomJS
from bokeh.models.widgets import Div, Select, TableColumn

from nvdash.apps.cluster_view import ERROR_COLOR, clock_text, follow_cluster, status_div, status_html
from nvdash.apps.context import AppContext
from nvdash.apps.figures import add_page, data_table, format_bytes, format_pct, text_color, timeline_range
from nvdash.apps.pod_timelines import PodRangeBackend, PodSource, PodTimelines
from nvdash.apps.theme import apply_theme, request_arguments
from nvdash.apps.time_range import CUSTOM, REPLACE_URL_JS, TimeRangeControl, query_values
from nvdash.cluster import ClusterRuntime
from nvdash.cluster.model import UNALLOCATED, ClusterPod, ClusterState, gpu_shares
from nvdash.cluster.node_pods import node_pods
from nvdash.cluster.pod_history import PrometheusPodHistory
from nvdash.history.pod_history import LocalPodHistory
from nvdash.history.query import SqliteHistory
from nvdash.sampling.records import Snapshot
from nvdash.store import Store

if TYPE_CHECKING:
    from bokeh.models.sources import DataDict

TITLE = "Cluster Pods"
ALL = "all"
KINDS: tuple[tuple[Any, str], ...] = (
    (ALL, "every kind of GPU"),
    ("whole", "whole GPU"),
    ("mig", "MIG instance"),
    ("shared", "time-sliced"),
    ("mps", "MPS"),
    ("vgpu", "vGPU (GPU-Manager, HAMi)"),
)
KIND_NAMES = dict(KINDS)
SHOWN_KINDS = {**KIND_NAMES, UNALLOCATED: "not allocated"}
FLAGS = {"memory_over_quota": "memory over quota", "compute_over_quota": "compute above the core quota",
         "quota_unused": "quota never used", "unallocated_use": "use on a GPU nobody was allocated"}
"""The quota findings' flags in the pods table (:data:`nvdash.health.quotas.FINDING_KINDS`)."""
NO_PODS = ("No pod holds a GPU in Prometheus's answer. Pods appear when each node's nvdash runs with "
           "--metrics-pods and can read its kubelet's pod-resources socket.")
NO_LOCAL_PODS = ("No pod holds a GPU of this node now, and its history recorded none over this range. Pods appear "
                 "when nvdash can read the kubelet's pod-resources socket.")
REFRESH_RANGE_MS = 30_000
"""A relative range (last 6 h) is asked again this often, so its end stays "now"."""


@dataclass(frozen=True)
class PodFilter:
    """Which allocations to show: a kind of GPU, a namespace and a pod (``all``: any)."""

    kind: str = ALL
    namespace: str = ALL
    pod: str = ALL

    def keeps(self, pod: ClusterPod) -> bool:
        """Whether ``pod`` passes every filter."""
        return (self.kind in (ALL, pod.sharing)
                and self.namespace in (ALL, pod.namespace)
                and self.pod in (ALL, "", pod.pod))

    def query(self) -> dict[str, str]:
        """The URL's query arguments for this filter (``all`` left out)."""
        return {name: value for name, value in (("kind", self.kind), ("namespace", self.namespace),
                                                ("pod", self.pod)) if value not in (ALL, "")}


def filter_of(arguments: dict[str, str]) -> PodFilter:
    """The filter a page's URL asks for (an unknown kind: every kind)."""
    kind = arguments.get("kind", ALL)
    return PodFilter(kind if kind in KIND_NAMES else ALL, arguments.get("namespace") or ALL,
                     arguments.get("pod") or ALL)


def pod_choices(pods: Sequence[ClusterPod], keep: PodFilter) -> list[tuple[str, str]]:
    """The pod menu: every pod passing the kind and namespace filters, by name (``namespace/pod`` shown when every
    namespace is listed)."""
    found = sorted({(pod.namespace, pod.pod) for pod in pods
                    if keep.kind in (ALL, pod.sharing) and keep.namespace in (ALL, pod.namespace)})
    choices = [(ALL, "every pod")]
    seen: set[str] = set()
    for namespace, name in found:
        if name not in seen:
            seen.add(name)
            choices.append((name, name if keep.namespace != ALL else f"{namespace}/{name}"))
    return choices


def quota_text(pod: ClusterPod) -> str:
    """``30 % · 4.0 GiB``: the container's core and memory quota (empty without one)."""
    parts = ([format_pct(pod.core_quota_pct, 0)] if pod.core_quota_pct is not None else []) + (
        [format_bytes(pod.memory_quota_bytes)] if pod.memory_quota_bytes is not None else [])
    return " · ".join(parts)


def flag_text(pod: ClusterPod) -> str:
    """``⚑ memory over quota`` for each quota finding holding now."""
    return ", ".join(f"\u2691 {FLAGS.get(kind, kind)}" for kind in pod.findings)


def pod_rows(pods: Sequence[ClusterPod], shares: Sequence[float]) -> DataDict:
    """The pods table: one row per allocation."""
    return {
        "node": [pod.hostname for pod in pods],
        "namespace": [pod.namespace for pod in pods],
        "pod": [pod.pod for pod in pods],
        "container": [pod.container for pod in pods],
        "device": [pod.device for pod in pods],
        "kind": [SHOWN_KINDS.get(pod.sharing, pod.sharing) for pod in pods],
        "share": [f"{share:.2f}" for share in shares],
        "util": [format_pct(pod.utilization_pct, 0) for pod in pods],
        "memory": [format_bytes(pod.memory_used_bytes) for pod in pods],
        "pod_sm": [format_pct(pod.sm_share_pct, 0) for pod in pods],
        "pod_memory": [format_bytes(pod.pod_memory_bytes) for pod in pods],
        "quota": [quota_text(pod) for pod in pods],
        "flags": [flag_text(pod) for pod in pods],
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


POD_COLUMNS = (("node", "node", 100), ("namespace", "namespace", 110), ("pod", "pod", 140),
               ("container", "container", 100), ("device", "device", 140), ("kind", "kind", 110),
               ("share", "GPU share", 70), ("util", "utilization", 75), ("memory", "memory used", 90),
               ("pod_sm", "pod's SM", 70), ("pod_memory", "pod's memory", 90), ("quota", "quota", 100),
               ("flags", "quota flags", 200), ("idle", "30 min", 50))
"""Field, title and width: 1,345 px in all, so the table fits a 1,400 px window."""
NAMESPACE_COLUMNS = (("namespace", "namespace", 160), ("pods", "pods", 60), ("devices", "devices", 70),
                     ("share", "GPUs held", 80), ("util", "mean utilization", 110), ("memory", "memory used", 110),
                     ("idle", "GPUs held idle", 110))


URL_JS = REPLACE_URL_JS
"""Keeps the page's URL on the chosen kind, namespace and pod (the server's view of them, in the pod menu's tags:
one source, whichever widget changed first), so a bookmark reopens them."""
LOCAL_POD_WINDOW_S = 7 * 86_400.0
"""On a single node, the pods offered are those the history recorded over this long."""
LOCAL_REFRESH_MS = 30_000
CHOOSE_POD = "Choose a pod to see its SM share and memory over time."
CHOOSE_HEIGHT = 40
"""Pixels the timelines' place takes while no pod is chosen (the sentence only)."""
TIMELINES_HEIGHT = 460
"""Pixels of the chosen pod's two timelines."""


TABLE_ROW_PX = 28
TABLE_MIN_ROWS, TABLE_MAX_ROWS = 2, 10


def table_height(rows: int) -> int:
    """A table's height for ``rows`` rows: no white space under a few, a scrollbar beyond ten."""
    return TABLE_ROW_PX * (1 + max(TABLE_MIN_ROWS, min(rows, TABLE_MAX_ROWS))) + 6


def build(doc: Document, ctx: AppContext) -> None:
    """Filters, the pods table, the idle allocations, the per-namespace totals and the chosen pod's timelines."""
    if ctx.cluster is not None:
        _PodsPage(doc, ctx, ClusterPods(ctx.cluster)).open()
        return
    if isinstance(ctx.history, SqliteHistory):
        _PodsPage(doc, ctx, LocalPods(LocalPodHistory(ctx.history), ctx)).open()
        return
    raise RuntimeError("the pods page needs --prometheus, or this node's history")


class PodsSource(Protocol):
    """Where the page's pods and their timelines come from."""

    timelines: PodSource
    executor: Executor | None
    cluster: ClusterRuntime | None

    def follow(self, doc: Document, on_state: Callable[[ClusterState], None]) -> None: ...

    def range_changed(self, start_s: float, end_s: float) -> None: ...


class ClusterPods:
    """The cluster's pods from the poller; timelines from Prometheus."""

    def __init__(self, cluster: ClusterRuntime) -> None:
        self.cluster: ClusterRuntime | None = cluster
        self.timelines: PodSource = PrometheusPodHistory(cluster.client, cluster.scope)
        self.executor: Executor | None = cluster.executor

    def follow(self, doc: Document, on_state: Callable[[ClusterState], None]) -> None:
        assert self.cluster is not None
        follow_cluster(doc, self.cluster, on_state)

    def range_changed(self, start_s: float, end_s: float) -> None:
        """Nothing: the cluster's pods are those allocated now."""


class LocalPods:
    """This node's pods: its newest snapshot's (allocations, shares, quota findings) and those its history recorded
    over the chosen range (the last 7 days until one is chosen), the history read off the event loop."""

    def __init__(self, history: LocalPodHistory, ctx: AppContext) -> None:
        self.cluster: ClusterRuntime | None = None
        self.history = history
        self.timelines: PodSource = history
        self.executor: Executor | None = ctx.history_executor
        self.store: Store = ctx.store
        self.clock = ctx.clock
        self.generation = 0
        self.window: tuple[float, float] | None = None
        """The chosen range; ``None``: the last 7 days."""
        self._reload: Callable[[], None] | None = None

    def state(self, latest: Snapshot | None, window: tuple[float, float] | None) -> ClusterState:
        """The node's pods now and over ``window`` (blocking: reads the history)."""
        now = self.clock()
        start, end = window if window is not None else (now - LOCAL_POD_WINDOW_S, now)
        pods = node_pods(latest, self.store.inventory.host.hostname, self.history.units(start, end))
        self.generation += 1
        return ClusterState(time_s=now, pods=pods, ok_time_s=now, generation=self.generation)

    def follow(self, doc: Document, on_state: Callable[[ClusterState], None]) -> None:
        async def load() -> None:
            latest, window = self.store.latest(), self.window
            try:
                state = await asyncio.get_running_loop().run_in_executor(self.executor, self.state, latest, window)
            except Exception as error:  # a damaged file: said on the page, tried again
                on_state(ClusterState(error=str(error), generation=-1))
                return
            on_state(state)

        def again() -> None:
            doc.add_next_tick_callback(cast("Callable[[], None]", load))

        self._reload = again
        again()
        doc.add_periodic_callback(again, LOCAL_REFRESH_MS)

    def range_changed(self, start_s: float, end_s: float) -> None:
        """List the pods recorded over the newly chosen range."""
        if self.window != (start_s, end_s):
            self.window = (start_s, end_s)
            if self._reload is not None:
                self._reload()

    def describe(self, state: ClusterState) -> str:
        """The status line: where the pods come from, how many, and when read."""
        now = {(pod.namespace, pod.pod) for pod in state.pods if pod.resource or pod.sm_share_pct is not None}
        every = {(pod.namespace, pod.pod) for pod in state.pods}
        span = "the last 7 days" if self.window is None else "the chosen range"
        updated = f" · updated {clock_text(state.ok_time_s)}" if state.ok_time_s is not None else ""
        return (f"From this node's history ({self.history.history.describe()}) and its newest readings · "
                f"{len(now)} pods hold a GPU now, {len(every)} over {span}{updated}")


class _PodsPage:
    def __init__(self, doc: Document, ctx: AppContext, source: PodsSource) -> None:
        self.doc = doc
        self.source = source
        dark = apply_theme(doc)
        self.wanted = filter_of(query_values(request_arguments(doc)))
        self.state = ClusterState()
        self.status = status_div(dark)
        self.kind = Select(title="GPU type", value=self.wanted.kind, options=list[str | tuple[Any, str]](KINDS),
                           width=220)
        every = list[str | tuple[Any, str]]([(ALL, "every namespace")])
        self.namespace = Select(title="namespace", value=ALL, options=every, width=200)
        self.pod = Select(title="pod", value=ALL, options=list[str | tuple[Any, str]]([(ALL, "every pod")]),
                          width=260)
        self.kind.on_change("value", self._filtered)
        self.namespace.on_change("value", self._filtered)
        self.pod.on_change("value", self._pod_picked)
        self.pod.js_on_change("tags", CustomJS(args={"names": ["kind", "namespace", "pod"]}, code=URL_JS))
        self.note = Div(text="", styles={"color": text_color(dark)}, sizing_mode="stretch_width")
        self.pods = ColumnDataSource(data=pod_rows([], []), name="pods")
        self.idle = ColumnDataSource(data=pod_rows([], []), name="idle-pods")
        self.namespaces = ColumnDataSource(data=namespace_rows([], []))
        self.backend = PodRangeBackend(source.timelines)
        x_range = timeline_range()
        self.timelines = PodTimelines(x_range)
        page_ctx = dataclasses.replace(ctx, history=self.backend, history_executor=source.executor, past_only=True)
        self.control = TimeRangeControl(doc, page_ctx, self.timelines, x_range, dark=dark)
        self.choose = Div(text=CHOOSE_POD, styles={"color": text_color(dark)})
        self.holder = column(self.choose, sizing_mode="stretch_width", height=CHOOSE_HEIGHT)
        heading: dict[str, str | None] = {"color": text_color(dark), "font-weight": "bold", "margin-top": "6px"}
        self.pod_table = data_table(self.pods, _columns(POD_COLUMNS), dark, height=table_height(0),
                                    sizing_mode="stretch_width")
        self.idle_table = data_table(self.idle, _columns(POD_COLUMNS), dark, height=table_height(0),
                                     sizing_mode="stretch_width")
        self.namespace_table = data_table(self.namespaces, _columns(NAMESPACE_COLUMNS), dark, height=table_height(0),
                                          sizing_mode="stretch_width")
        self.timelines.on_shown = self._range_shown
        add_page(
            doc, TITLE, self.status,
            row(self.kind, self.namespace, self.pod, sizing_mode="stretch_width"), self.note,
            Div(text="GPU use per pod", styles=heading),
            self.pod_table,
            Div(text="The chosen pod over time", styles=heading),
            row(*self.control.widgets(), sizing_mode="stretch_width"), self.holder,
            Div(text="Allocated but idle for the last 30 min (no process of the pod on it, or 0 % utilization)",
                styles=heading),
            self.idle_table,
            Div(text="Per namespace", styles=heading),
            self.namespace_table,
            dark=dark,
        )

    def open(self) -> None:
        self.source.follow(self.doc, self._on_state)
        self.doc.add_periodic_callback(self._refresh_range, REFRESH_RANGE_MS)

    def _filter(self) -> PodFilter:
        return PodFilter(str(self.kind.value), str(self.namespace.value), str(self.pod.value))

    def _status(self, state: ClusterState) -> str:
        nodes = len({pod.hostname for pod in state.pods})
        pods = len({(pod.namespace, pod.pod) for pod in state.pods})
        if self.source.cluster is not None:
            text = status_html(self.source.cluster, state, f"{pods} pods hold {len(state.pods)} GPU devices on "
                                                           f"{nodes} nodes")
            return text if text.startswith("<") else f"From {text}"  # a failure is said in red, as it is
        if state.error is not None:
            return f'<span style="color:{ERROR_COLOR}"><b>Reading the history failed:</b> {escape(state.error)}</span>'
        return escape(cast("LocalPods", self.source).describe(state))

    def _on_state(self, state: ClusterState) -> None:
        self.state = state
        self.status.text = self._status(state)
        namespaces = sorted({pod.namespace for pod in state.pods} | ({self.wanted.namespace} - {ALL}))
        _set_options(self.namespace, [(ALL, "every namespace"), *((name, name) for name in namespaces)])
        if self.wanted.namespace in namespaces and self.namespace.value == ALL:
            self.namespace.value = self.wanted.namespace  # _filtered redraws
        self.wanted = dataclasses.replace(self.wanted, namespace=ALL)
        self._redraw()

    def _pod_menu(self) -> None:
        keep = self._filter()
        choices = pod_choices(self.state.pods, keep)
        names = [value for value, _label in choices]
        wanted = self.wanted.pod
        if wanted != ALL and wanted not in names and keep.namespace != ALL:
            choices.append((wanted, wanted))  # a bookmarked pod that holds no GPU now: its past is still shown
            names.append(wanted)
        _set_options(self.pod, choices)
        if wanted in names and self.pod.value == ALL:
            self.wanted = dataclasses.replace(self.wanted, pod=ALL)
            self.pod.value = wanted  # _pod_picked shows it
        elif self.pod.value not in names:
            self.pod.value = ALL

    def _filtered(self, _attr: str, _old: Any, _new: Any) -> None:
        self._redraw()

    def _pod_picked(self, _attr: str, _old: Any, new: Any) -> None:
        pod = str(new)
        if pod != ALL and self.namespace.value == ALL:
            found = next((item.namespace for item in self.state.pods if item.pod == pod), None)
            if found is not None:
                self.namespace.value = found
        self._redraw()

    def _redraw(self) -> None:
        self._pod_menu()
        query = [[name, value] for name, value in self._filter().query().items()]
        if self.pod.tags != query:
            self.pod.tags = query
        state = self.state
        pods, shares = shown(state, self._filter())
        idle = [(pod, share) for pod, share in zip(pods, shares, strict=True) if pod.idle]
        self.pods.data = pod_rows(pods, shares)
        self.idle.data = pod_rows([pod for pod, _ in idle], [share for _, share in idle])
        self.namespaces.data = namespace_rows(pods, shares)
        for table, count in ((self.pod_table, len(pods)), (self.idle_table, len(idle)),
                             (self.namespace_table, len(self.namespaces.data["namespace"]))):
            height = table_height(count)
            if table.height != height:
                table.height = height
        if state.ok_time_s is not None and not state.pods:
            self.note.text = NO_PODS if self.source.cluster is not None else NO_LOCAL_PODS
        elif state.pods and not pods:
            self.note.text = "No pod matches these filters."
        else:
            self.note.text = ""
        self._show_pod()

    def _show_pod(self) -> None:
        namespace, pod = str(self.namespace.value), str(self.pod.value)
        if ALL in (pod, namespace):
            if self.backend.pod:
                self.backend.namespace = self.backend.pod = ""
                self.holder.children = [self.choose]
                self.holder.height = CHOOSE_HEIGHT
            return
        if (namespace, pod) == (self.backend.namespace, self.backend.pod):
            return
        self.backend.namespace, self.backend.pod = namespace, pod
        self.holder.children = [self.timelines.layout]
        self.holder.height = TIMELINES_HEIGHT
        if self.control.time_range is None:
            self.control.open()
        else:
            self.control.reload()

    def _range_shown(self, start_s: float, end_s: float) -> None:
        self.source.range_changed(start_s, end_s)

    def _refresh_range(self) -> None:
        shown_range = self.control.time_range
        if shown_range is not None and shown_range.label != CUSTOM and self.backend.pod:
            self.control.choose(shown_range.label)


def _set_options(select: Select, options: list[tuple[str, str]]) -> None:
    """Replace ``select``'s options only when they changed (each change is a message to the browser)."""
    current = [tuple(option) if isinstance(option, (list, tuple)) else (option, option) for option in select.options]
    if current != options:
        select.options = list[str | tuple[Any, str]](options)
