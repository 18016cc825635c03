"""GPU Accounting, built on bare documents over an accountant fed hand-made snapshots and a job-mapping directory."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor
from html import unescape
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

import pytest
from bokeh.document import Document
from bokeh.model import Model
from bokeh.models import ColumnDataSource
from bokeh.models.widgets import DataTable, Div, Select, TextInput
from bokeh.server.callbacks import NextTickCallback, PeriodicCallback

from nvdash.accounting.accountant import Accountant
from nvdash.accounting.report import AccountingBook
from nvdash.apps import APPS, AppContext, Requirement, gpu_accounting
from nvdash.apps.accounting_table import NO_WASTE, csv_href, gpu_list
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot
from nvdash.sampling.usage_records import Usage
from nvdash.store import Store
from tests.unit.test_apps import models, tick

M = TypeVar("M", bound=Model)
GiB = 1024**3
T0 = 1_700_000_000.0
HOST = HostInfo(hostname="node", cpu_count=16, memory_total_bytes=64 * GiB)
INVENTORY = Inventory(host=HOST, gpus=(GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-a", 80 * GiB, 5, 16, 63e9, 18, 450e9),
                                       GpuInfo(1, "NVIDIA H100 80GB HBM3", "GPU-b", 80 * GiB, 5, 16, 63e9, 18, 450e9)))


class Names:
    def user(self, uid: int) -> str | None:
        return {1000: "alice", 1001: "bob"}.get(uid)

    def group_of(self, user: str) -> str | None:
        return {"alice": "physics", "bob": "chemistry"}.get(user)


def snapshot(time_s: float, energy_mj: int, usage: Usage) -> Snapshot:
    """GPU 0 busy (100 %), GPU 1 allocated at 0 % with no energy reading after the first."""
    busy = GpuSample(index=0, utilization_pct=100.0, memory_used_bytes=GiB, energy_mj=energy_mj)
    idle = GpuSample(index=1, utilization_pct=0.0, memory_used_bytes=GiB // 2,
                     energy_mj=0 if time_s == T0 else None)
    return Snapshot(time_s=time_s, gpus=(busy, idle), host=HostSample(), usage=usage)


@pytest.fixture
def book(tmp_path: Path) -> AccountingBook:
    """Job 555 (alice) on GPU 0 and job 777 (bob) on GPU 1, for one second: 2 J on GPU 0."""
    (tmp_path / "0").write_text("555 1000\n")
    (tmp_path / "1").write_text("777 1001\n")
    accountant = Accountant({0: "GPU-a", 1: "GPU-b"}, job_mapping_dir=tmp_path, names=Names(), idle_after_s=1.0)
    usage = Usage(time_s=T0)
    accountant.step(snapshot(T0, 0, usage))
    accountant.step(snapshot(T0 + 1, 2_000, usage))
    return AccountingBook(accountant, clock=lambda: T0 + 2)


def context(book: AccountingBook | None, executor: ThreadPoolExecutor | None = None) -> AppContext:
    return AppContext(store=Store(INVENTORY, capacity=10), interval_s=1.0, accounting=book, history_executor=executor)


def page(ctx: AppContext) -> Document:
    doc = Document()
    gpu_accounting.build(doc, ctx)
    return doc


def named(doc: Document, kind: type[M], name: str) -> M:
    (found,) = [model for model in models(doc, kind) if model.name == name]
    return found


def source(doc: Document, name: str) -> ColumnDataSource:
    return named(doc, ColumnDataSource, name)


def select(doc: Document, name: str) -> Select:
    return named(doc, Select, name)


def text_input(doc: Document, name: str) -> TextInput:
    return named(doc, TextInput, name)


def csv_link(doc: Document) -> str:
    return str(named(doc, Div, "csv").text)


def status(doc: Document) -> str:
    return str(named(doc, Div, "status").text)


def test_the_page_is_offered_after_gpu_processes_for_machines_with_gpus() -> None:
    routes = [spec.route for spec in APPS]
    assert routes.index("/GPU-Accounting") == routes.index("/GPU-Processes") + 1
    spec = APPS[routes.index("/GPU-Accounting")]
    assert (spec.title, spec.requires) == ("GPU Accounting", Requirement.GPU)


def test_table_shows_each_jobs_hours_energy_and_memory(book: AccountingBook) -> None:
    doc = page(context(book))
    assert doc.title == "GPU Accounting"
    data = source(doc, "accounting").data
    assert list(data["key"]) == ["555", "777"]
    assert list(data["kinds"]) == ["slurm", "slurm"]
    assert list(data["gpus"]) == ["0", "1"]
    assert list(data["gpu_hours"]) == pytest.approx([1 / 3600, 1 / 3600])
    assert list(data["busy_hours"]) == pytest.approx([1 / 3600, 0.0])
    assert list(data["wasted_hours"]) == pytest.approx([0.0, 1 / 3600])
    assert list(data["efficiency_pct"]) == pytest.approx([100.0, 0.0])
    assert list(data["utilization_pct"]) == pytest.approx([100.0, 0.0])
    assert list(data["energy_kwh"]) == pytest.approx([2 / 3.6e6, 0.0])
    assert list(data["energy_text"]) == ["0.000", "0.000*"], "GPU 1's energy was not read: marked incomplete"
    assert list(data["peak_memory_bytes"]) == [GiB, GiB // 2]
    assert list(data["peak_memory_text"]) == ["1.0 GiB", "512.0 MiB"]
    table = named(doc, DataTable, "accounting-table")
    assert table.sortable
    assert [column.title for column in table.columns] == [
        "owner", "kind", "GPUs", "GPU-hours", "busy h", "wasted h", "efficiency %", "energy kWh", "mean util %",
        "peak memory", "power cap %", "thermal %", "start", "end"]
    totals = [model.text for model in models(doc, Div) if "Range totals" in model.text]
    assert totals == ["<b>Range totals:</b> 0.001 GPU-hours · 0.000 busy · 0.000 wasted · 0.000 kWh "
                      "(* energy counted over part of the time only)<br>Lost to throttling: power cap - · thermal -"
                      ], "no counter read"
    assert named(doc, Div, "totals").height == 52, "two lines of 26 px: the throttling gets its own line"
    assert status(doc).startswith("in memory since this server started (no history) · last 7 days · 2 jobs · ")


def test_waste_summary_names_the_idle_job_and_the_allocations_idle_now(book: AccountingBook) -> None:
    doc = page(context(book))
    waste = source(doc, "waste").data
    assert list(waste["owner"]) == ["777"]
    assert list(waste["wasted"]) == pytest.approx([1 / 3600])
    idle = source(doc, "idle-now").data
    # Both jobs run no process on their GPU (the usage reading has none): allocated and idle for 1 s.
    assert list(idle["gpu"]) == [0, 1]
    assert list(idle["unit"]) == ["GPU-a", "GPU-b"]
    assert list(idle["owner"]) == ["555 (slurm, alice)", "777 (slurm, bob)"]
    assert list(idle["reason"]) == ["no process", "no process"]
    assert list(idle["idle_min"]) == pytest.approx([0.0, 0.0])
    table = named(doc, DataTable, "idle-table")
    assert table.visible
    notes = [model.text for model in models(doc, Div) if "idle for" in model.text]
    assert notes == ["2 allocations idle for 1 s or more, longest first."]


def test_group_by_regroups_and_the_csv_link_follows_the_controls(book: AccountingBook) -> None:
    doc = page(context(book))
    assert csv_link(doc) == ('<a href="api/accounting.csv?range=7d&amp;by=job" style="color:#1565c0" download>'
                             "Download CSV</a>")
    select(doc, "by").value = "user"
    assert list(source(doc, "accounting").data["key"]) == ["alice", "bob"]
    assert "range=7d&amp;by=user" in csv_link(doc)
    select(doc, "by").value = "namespace"
    assert list(source(doc, "accounting").data["key"]) == ["chemistry", "physics"], "equal hours: by name"
    assert list(source(doc, "accounting").data["gpus"]) == ["1", "0"]
    select(doc, "by").value = "pod"
    assert list(source(doc, "accounting").data["key"]) == [], "no pods: Slurm jobs only"
    assert list(source(doc, "waste").data["owner"]) == [NO_WASTE]
    select(doc, "range").value = "30d"
    assert "range=30d&amp;by=pod" in csv_link(doc)
    assert status(doc).startswith("in memory since this server started (no history) · last 30 days · 0 pods · ")


def test_custom_range_shows_its_fields_links_from_to_and_says_what_is_wrong_in_one_line(
        book: AccountingBook) -> None:
    doc = page(context(book))
    start, end = text_input(doc, "from"), text_input(doc, "to")
    assert (start.visible, end.visible) == (False, False)
    select(doc, "range").value = "custom"
    assert (start.visible, end.visible) == (True, True)
    assert status(doc).startswith("custom range: type a from time (ISO 8601 or Unix seconds) and press Enter; ")
    assert "every hour it touches" in status(doc)
    assert csv_link(doc) == "", "no link to a range that cannot be read"
    start.value = "yesterday at noon"
    text = unescape(status(doc))
    assert text == ('<span style="color:#c62828">bad range: \'yesterday at noon\' is not a time: use ISO 8601 '
                    "(2026-11-21T08:00:00Z) or Unix seconds</span>")
    assert "\n" not in text
    assert "Traceback" not in text
    start.value = str(int(T0 + 10))
    end.value = str(int(T0 - 10))
    assert "bad range: from is after to" in status(doc)
    assert list(source(doc, "accounting").data["key"]) == ["555", "777"], "the last good report stays"
    start.value, end.value = "2023-11-14T22:00:00Z", str(int(T0 + 5))
    assert list(source(doc, "accounting").data["key"]) == ["555", "777"]
    href = csv_link(doc).split('"')[1].replace("&amp;", "&")
    assert urlsplit(href).path == "api/accounting.csv"
    assert parse_qs(urlsplit(href).query) == {"from": ["2023-11-14T22:00:00Z"], "to": [str(int(T0 + 5))],
                                              "by": ["job"]}
    assert "%3A" in href, "the times are URL-encoded"
    start.value, end.value = str(int(T0 + 7200)), str(int(T0 + 10800))
    assert list(source(doc, "accounting").data["key"]) == [], "nothing in a later hour (tallies are hourly)"


def test_csv_href_encodes_each_choice() -> None:
    assert csv_href("today", "namespace") == "api/accounting.csv?range=today&by=namespace"
    assert csv_href("custom", "user", "2026-11-21 08:00", "") == \
        "api/accounting.csv?from=2026-11-21+08%3A00&by=user"


def test_gpu_list_joins_neighbours() -> None:
    assert gpu_list([3, 0, 1, 2, 6, 7, 9]) == "0-3, 6-7, 9"
    assert gpu_list([]) == ""


def test_periodic_refresh_shows_new_tallies(book: AccountingBook) -> None:
    doc = page(context(book))
    assert book.accountant is not None
    book.accountant.step(snapshot(T0 + 2, 3_000, Usage(time_s=T0)))
    tick(doc)
    data = source(doc, "accounting").data
    assert list(data["gpu_hours"]) == pytest.approx([2 / 3600, 2 / 3600])
    assert list(data["energy_kwh"]) == pytest.approx([3 / 3.6e6, 0.0])
    (callback,) = doc.session_callbacks
    assert isinstance(callback, PeriodicCallback)
    assert callback.period == 30_000


def test_with_an_executor_the_report_is_read_off_the_loop(book: AccountingBook, executor: ThreadPoolExecutor) -> None:
    doc = page(context(book, executor))
    assert status(doc) == "loading …"
    assert list(source(doc, "accounting").data["key"]) == []
    pending = [callback for callback in doc.session_callbacks if isinstance(callback, NextTickCallback)]
    assert len(pending) == 1
    asyncio.run(pending[0].callback())  # type: ignore[arg-type]
    assert list(source(doc, "accounting").data["key"]) == ["555", "777"]
    assert "2 jobs" in status(doc)


def test_without_accounting_the_page_is_one_note() -> None:
    doc = page(context(None))
    assert doc.title == "GPU Accounting"
    assert [model.text for model in models(doc, Div)] == ["This server keeps no GPU accounting."]
    assert doc.session_callbacks == []
    assert not list(doc.select({"type": ColumnDataSource}))


def test_the_table_shows_the_share_of_gpu_time_lost_to_the_power_cap_and_to_heat(tmp_path: Path) -> None:
    """Job 4242 on GPU 0 over 10 s: its power-cap counter rose 0.14 s and its thermal one 0.02 s a second; job 777
    on GPU 1, whose counters NVML never gave (a dash, not 0)."""
    (tmp_path / "0").write_text("4242 1000\n")
    (tmp_path / "1").write_text("777 1001\n")
    accountant = Accountant({0: "GPU-a", 1: "GPU-b"}, job_mapping_dir=tmp_path, names=Names())
    usage = Usage(time_s=T0)
    for second in range(11):
        throttled = GpuSample(index=0, utilization_pct=100.0, violation_power_ns=140_000_000 * second,
                              violation_thermal_ns=20_000_000 * second)
        accountant.step(Snapshot(time_s=T0 + second, gpus=(throttled, GpuSample(index=1, utilization_pct=50.0)),
                                 host=HostSample(), usage=usage))
    doc = page(context(AccountingBook(accountant, clock=lambda: T0 + 20)))
    data = source(doc, "accounting").data
    assert list(data["key"]) == ["4242", "777"]
    assert data["power_cap_pct"][0] == pytest.approx(14.0)
    assert data["thermal_pct"][0] == pytest.approx(2.0)
    assert math.isnan(data["power_cap_pct"][1]), "never read: shown as a dash"
    assert math.isnan(data["thermal_pct"][1])
    columns = {column.field: column for column in named(doc, DataTable, "accounting-table").columns}
    assert (columns["power_cap_pct"].title, columns["thermal_pct"].title) == ("power cap %", "thermal %")
    assert columns["power_cap_pct"].formatter.nan_format == "-"
