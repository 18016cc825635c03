"""The dashboards the server offers: route, title, builder, and what hardware each needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from bokeh.document import Document

from nvdash.apps import (
    gpu_memory,
    gpu_resources,
    gpu_utilization,
    machine_resources,
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
    AppSpec("/GPU-Resources", gpu_resources.TITLE, gpu_resources.build, Requirement.GPU),
    AppSpec("/PCIe-Throughput", pcie_throughput.TITLE, pcie_throughput.build, Requirement.GPU),
    AppSpec("/NVLink-Throughput", nvlink_throughput.TITLE, nvlink_throughput.build, Requirement.NVLINK),
    AppSpec("/NVLink-Timeline", nvlink_timeline.TITLE, nvlink_timeline.build, Requirement.NVLINK),
    AppSpec("/Machine-Resources", machine_resources.TITLE, machine_resources.build, Requirement.NONE),
)


def unavailable_reason(spec: AppSpec, inventory: Inventory) -> str | None:
    """``None`` when ``spec`` has data on this machine, else a plain sentence saying why not."""
    if spec.requires is Requirement.NONE:
        return None
    if not inventory.has_gpus:
        detail = (inventory.nvml_error or "").strip().rstrip(".")
        return f"No NVIDIA GPU was found: {detail}." if detail else "No NVIDIA GPU was found."
    if spec.requires is Requirement.NVLINK and not inventory.has_nvlink:
        return "None of the GPUs on this machine has NVLink."
    return None


def available_apps(inventory: Inventory) -> list[AppSpec]:
    """The apps worth offering on this machine, in ``APPS`` order."""
    return [spec for spec in APPS if unavailable_reason(spec, inventory) is None]
