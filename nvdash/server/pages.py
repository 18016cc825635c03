"""The server's own pages: the index, index.json, info.json, health, and "not available here"."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, NamedTuple

from jinja2 import Environment, select_autoescape
from tornado.web import RequestHandler

from nvdash.apps import APPS, AppSpec, available_apps, reads_prometheus, unavailable_reason
from nvdash.freshness import banner_text
from nvdash.health.status import GpuHealth
from nvdash.sampling.records import Inventory
from nvdash.server.auth import GuardedHandler
from nvdash.server.field_names import add_clear_names, deprecated_aliases
from nvdash.units import format_bytes, format_rate

_env = Environment(autoescape=select_autoescape(default=True))


def _template(name: str) -> Any:
    text = resources.files("nvdash.server").joinpath("templates").joinpath(name).read_text(encoding="utf-8")
    return _env.from_string(text)


REPLAY_MARK = " (replay)"


def index_json(inventory: Inventory, replay: bool = False, cluster: bool = False,
               local_history: bool = False, notebooks: bool = False) -> dict[str, str]:
    """Each available route mapped to its title, in the registry's order; a replay's titles say so."""
    mark = REPLAY_MARK if replay else ""
    return {spec.route: spec.title + ("" if reads_prometheus(spec, cluster) else mark)
            for spec in available_apps(inventory, cluster, local_history, notebooks)}


def info_json(inventory: Inventory, history: dict[str, Any] | None = None) -> dict[str, Any]:
    """The host and GPUs found at start, why there are none if so, and what the history does. The link maxima are
    named as in ``/api/snapshot.json`` (``pcie_generation_max``, ``nvlink_data_max_bytes_per_s`` beside
    ``nvlink_signalling_max_bytes_per_s``), with the older names as ``deprecated_aliases``."""
    return {
        "mode": "replay" if history and history.get("replay") else "live",
        "history": history,
        "hostname": inventory.host.hostname,
        "driver_version": inventory.driver_version,
        "simulated": inventory.simulated,
        "nvml_error": inventory.nvml_error,
        "gpus": [
            add_clear_names({
                "index": gpu.index,
                "name": gpu.name,
                "uuid": gpu.uuid,
                "memory_total_bytes": gpu.memory_total_bytes,
                "pcie_generation": gpu.pcie_generation,
                "pcie_width": gpu.pcie_width,
                "pcie_max_bytes_per_s": gpu.pcie_max_bytes_per_s,
                "nvlink_links": gpu.nvlink_links,
                "nvlink_max_bytes_per_s": gpu.nvlink_max_bytes_per_s,
                "nvlink_signalling_max_bytes_per_s": gpu.nvlink_signalling_max_bytes_per_s,
                "nvlink_version": gpu.nvlink_version,
                "pci_bus_id": gpu.pci_bus_id,
            })
            for gpu in inventory.gpus
        ],
        "deprecated_aliases": deprecated_aliases(("pcie_generation", "pcie_width", "nvlink_max_bytes_per_s")),
    }


def render_index(
    inventory: Inventory,
    prefix: str,
    interval_s: float,
    live_samples: int,
    profiles: str,
    *,
    health: Sequence[GpuHealth] = (),
    history: str = "off",
    replay: bool = False,
    cluster: bool = False,
    local_history: bool = False,
    notebooks: bool = False,
    stale_since: float | None = None,
) -> str:
    """The bookmarkable HTML index; ``health`` gives each GPU's current status and its first reason; ``stale_since``
    (the newest reading's time, when readings stopped arriving) puts "no new readings since" at the top."""
    by_index = {item.index: item for item in health}
    gpus = [
        {
            "health": _health_cell(by_index.get(gpu.index)),
            "index": gpu.index,
            "name": gpu.name,
            "memory": format_bytes(gpu.memory_total_bytes),
            "pcie": (
                f"Gen{gpu.pcie_generation} x{gpu.pcie_width}, {format_rate(gpu.pcie_max_bytes_per_s)} per direction"
                if gpu.pcie_generation and gpu.pcie_width
                else "n/a"
            ),
            "nvlink": (
                f"{gpu.nvlink_links} links, {format_rate(gpu.nvlink_max_bytes_per_s)} data rate per direction"
                if gpu.has_nvlink
                else "none"
            ),
        }
        for gpu in inventory.gpus
    ]
    count = len(inventory.gpus)
    summary = f"{count} GPU{'s' if count != 1 else ''}"
    if inventory.driver_version:
        summary += f", driver {inventory.driver_version}"
    summary += f"; {inventory.host.cpu_count} CPUs, {format_bytes(inventory.host.memory_total_bytes)} RAM"
    return str(
        _template("index.html").render(
            hostname=inventory.host.hostname,
            summary=summary,
            simulated=inventory.simulated,
            gpus=gpus,
            nvml_error=inventory.nvml_error or "no GPU was found",
            profiles=profiles,
            apps=[{"href": prefix + spec.route, "title": spec.title}
                  for spec in available_apps(inventory, cluster, local_history, notebooks)],
            unavailable=_unavailable_by_reason(inventory, cluster, local_history, notebooks),
            interval=f"{interval_s:g}",
            live_samples=f"{live_samples} samples",
            history=history,
            replay=replay,
            cluster=cluster,
            stale=None if stale_since is None else banner_text(stale_since),
        )
    )


def _health_cell(health: GpuHealth | None) -> dict[str, str]:
    if health is None:
        return {"status": "unknown", "label": "unknown", "reason": "no reading yet"}
    reason = health.findings[0].text if health.findings else ""
    more = len(health.findings) - 1
    if more > 0:
        reason += f" (+{more} more)"
    labels = {"ok": "OK", "warning": "Warning", "critical": "Critical"}
    return {"status": health.status.value, "label": labels[health.status.value], "reason": reason}


def _unavailable_by_reason(inventory: Inventory, cluster: bool = False, local_history: bool = False,
                           notebooks: bool = False) -> list[dict[str, str]]:
    """The dashboards this machine cannot feed, grouped under each reason (a reason is said once)."""
    groups: dict[str, list[str]] = {}
    for spec in APPS:
        reason = unavailable_reason(spec, inventory, cluster, local_history, notebooks)
        if reason is not None:
            groups.setdefault(reason, []).append(spec.title)
    return [{"reason": reason, "titles": ", ".join(titles)} for reason, titles in groups.items()]


def render_unavailable(spec: AppSpec, reason: str, prefix: str) -> str:
    """The page a route that this machine cannot feed answers with."""
    return str(_template("unavailable.html").render(title=spec.title, reason=reason, index=prefix + "/"))


class HtmlHandler(GuardedHandler):
    """Serves a fixed HTML page with a fixed status (to those the server's token admits)."""

    def initialize(self, render: Callable[[], str], status: int = 200) -> None:
        self._render = render
        self._status = status

    def get(self) -> None:
        self.set_status(self._status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self._render())


class JsonAnswer(NamedTuple):
    """A JSON document with its HTTP status (a producer returns one where 200 is not the answer)."""

    body: Any
    status: int


class BadQuery(ValueError):
    """A query argument a JSON route cannot use: a 400 with the one-line message."""


class JsonHandler(GuardedHandler):
    """Serves a JSON document computed on each request (cheap: nothing here touches the hardware).

    ``guarded=False`` serves requests without the token too, for a route that decides itself what they see.
    A producer returning a :class:`JsonAnswer` chooses the status too.
    """

    def initialize(self, produce: Callable[[RequestHandler], Any], guarded: bool = True) -> None:
        self._produce = produce
        self.guarded = guarded

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        try:
            body = self._produce(self)
        except BadQuery as error:
            self.set_status(400)
            body = {"error": str(error)}
        if isinstance(body, JsonAnswer):
            self.set_status(body.status)
            body = body.body
        self.finish(json.dumps(body))
