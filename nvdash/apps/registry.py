"""The dashboards the server offers: route, title, builder, and what hardware each needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from bokeh.document import Document

from nvdash.apps import (
    cluster_accounting,
    cluster_fleet,
    cluster_nodes,
    cluster_pods,
    gpu_accounting,
    gpu_details,
    gpu_health,
    gpu_memory,
    gpu_processes,
    gpu_resources,
    gpu_topology,
    gpu_utilization,
    machine_resources,
    notebook_memory,
    nvlink_throughput,
    nvlink_timeline,
    pcie_throughput,
)
from nvdash.apps.context import AppContext
from nvdash.sampling.records import Inventory


class Requirement(Enum):
    """The hardware an app needs to have anything to show."""

    NONE = "none"
    GPU = "gpu"
    NVLINK = "nvlink"
    TOPOLOGY = "topology"
    """At least two GPUs and NVML's answer on how they are connected."""
    PROMETHEUS = "prometheus"
    """A Prometheus to ask about the cluster (``--prometheus URL``)."""
    POD_HISTORY = "pod_history"
    """Pods' past shares: the cluster's from a Prometheus, or this node's from its history file."""
    NOTEBOOKS = "notebooks"
    """The kernels of the Jupyter server that started nvdash (``--jupyter-kernels``), joined to the GPU processes
    (process readings on)."""


@dataclass(frozen=True)
class AppSpec:
    """One dashboard: its URL route, its title, the function that fills a document, and its needs."""

    route: str
    title: str
    build: Callable[[Document, AppContext], None]
    requires: Requirement


APPS: tuple[AppSpec, ...] = (
    AppSpec("/GPU-Utilization", gpu_utilization.TITLE, gpu_utilization.build, Requirement.GPU),
    AppSpec("/GPU-Memory", gpu_memory.TITLE, gpu_memory.build, Requirement.GPU),
    AppSpec("/GPU-Processes", gpu_processes.TITLE, gpu_processes.build, Requirement.GPU),
    AppSpec("/GPU-Accounting", gpu_accounting.TITLE, gpu_accounting.build, Requirement.GPU),
    AppSpec("/GPU-Resources", gpu_resources.TITLE, gpu_resources.build, Requirement.GPU),
    AppSpec("/GPU-Health", gpu_health.TITLE, gpu_health.build, Requirement.GPU),
    AppSpec("/GPU-Details", gpu_details.TITLE, gpu_details.build, Requirement.GPU),
    AppSpec("/PCIe-Throughput", pcie_throughput.TITLE, pcie_throughput.build, Requirement.GPU),
    AppSpec("/NVLink-Throughput", nvlink_throughput.TITLE, nvlink_throughput.build, Requirement.NVLINK),
    AppSpec("/NVLink-Timeline", nvlink_timeline.TITLE, nvlink_timeline.build, Requirement.NVLINK),
    AppSpec("/GPU-Topology", gpu_topology.TITLE, gpu_topology.build, Requirement.TOPOLOGY),
    AppSpec("/Machine-Resources", machine_resources.TITLE, machine_resources.build, Requirement.NONE),
    AppSpec("/Cluster-Nodes", cluster_nodes.TITLE, cluster_nodes.build, Requirement.PROMETHEUS),
    AppSpec("/Cluster-Fleet", cluster_fleet.TITLE, cluster_fleet.build, Requirement.PROMETHEUS),
    AppSpec("/Cluster-Pods", cluster_pods.TITLE, cluster_pods.build, Requirement.POD_HISTORY),
    AppSpec("/Cluster-Accounting", cluster_accounting.TITLE, cluster_accounting.build, Requirement.PROMETHEUS),
    AppSpec("/GPU-Memory-by-Notebook", notebook_memory.TITLE, notebook_memory.build, Requirement.NOTEBOOKS),
)
NO_PROMETHEUS = "The cluster pages read every node's readings from Prometheus: start nvdash with --prometheus URL."
NO_POD_HISTORY = ("The pods page reads pods from Prometheus (--prometheus URL), or on a Kubernetes node from this "
                  "node's history file: it needs the kubelet's pod-resources socket (--kubelet-socket), process "
                  "readings (--process-interval above 0) and the history (not --no-history).")
NO_NOTEBOOKS = ("The notebooks page shows the GPU memory of a Jupyter server's kernels: it is offered when JupyterLab "
                "starts nvdash (--jupyter-kernels) with process readings on (--process-interval above 0).")


def unavailable_reason(spec: AppSpec, inventory: Inventory, cluster: bool = False,
                       local_history: bool = False, notebooks: bool = False) -> str | None:
    """``None`` when ``spec`` has data on this machine (or, for a cluster page, when a Prometheus is given; for the
    pods page, a Prometheus or, on a Kubernetes node, this node's history: ``local_history``; for the notebooks
    page, a Jupyter server's kernels and process readings: ``notebooks``), else a plain sentence saying why not."""
    if spec.requires is Requirement.NONE:
        return None
    if spec.requires is Requirement.NOTEBOOKS:
        return None if notebooks else NO_NOTEBOOKS
    if spec.requires is Requirement.PROMETHEUS:
        return None if cluster else NO_PROMETHEUS
    if spec.requires is Requirement.POD_HISTORY:
        return None if cluster or local_history else NO_POD_HISTORY
    if not inventory.has_gpus:
        detail = (inventory.nvml_error or "").strip().rstrip(".")
        return f"No NVIDIA GPU was found: {detail}." if detail else "No NVIDIA GPU was found."
    if spec.requires is Requirement.NVLINK and not inventory.has_nvlink:
        return "None of the GPUs on this machine has NVLink."
    if spec.requires is Requirement.TOPOLOGY:
        if len(inventory.gpus) < 2:
            return "This machine has a single GPU: there is no GPU-to-GPU topology to show."
        if not inventory.topology:
            return "NVML did not say how the GPUs on this machine are connected."
    return None


def available_apps(inventory: Inventory, cluster: bool = False, local_history: bool = False,
                   notebooks: bool = False) -> list[AppSpec]:
    """The apps worth offering on this machine, in ``APPS`` order."""
    return [spec for spec in APPS if unavailable_reason(spec, inventory, cluster, local_history, notebooks) is None]


def reads_prometheus(spec: AppSpec, cluster: bool) -> bool:
    """Whether ``spec`` shows Prometheus's readings rather than this node's (no stale banner, no replay mark)."""
    return spec.requires is Requirement.PROMETHEUS or (spec.requires is Requirement.POD_HISTORY and cluster)
