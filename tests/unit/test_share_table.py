"""The shares table of GPU Processes: rows built from hand-made ``UnitShares`` records, and the page showing them."""

from __future__ import annotations

import math
from dataclasses import replace

from bokeh.models import ColumnDataSource
from bokeh.models.widgets import DataTable, Div

from nvdash.apps.share_table import share_columns
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.units import format_energy, format_power
from tests.unit.test_apps import tick
from tests.unit.test_apps_processes import NOW, USAGE, Page, make_ctx, snapshot

GiB = 1024**3
MiB = 1024**2
NAN = math.nan

TRAINER = OwnerShare(ShareOwner("pod", "training", "trainer-0", "trainer"), sm_pct=60.0, fraction=60 / 90,
                     memory_bytes=20 * GiB, power_w=200.0, energy_j=7200.0, gpm_sm_active_pct=None, processes=2)
VIEWER = OwnerShare(ShareOwner("process", pid=4343), sm_pct=20.0, fraction=20 / 90, memory_bytes=4 * GiB,
                    power_w=60.0, energy_j=2500.0, gpm_sm_active_pct=None, processes=1)
TRITON = OwnerShare(ShareOwner("pod", "inference", "server-1", "triton"), sm_pct=40.0, fraction=1.0,
                    memory_bytes=6 * GiB, power_w=50.0, energy_j=1.5e6, gpm_sm_active_pct=30.0, processes=1)
HOLDER = OwnerShare(ShareOwner("container", container="0123456789ab"), sm_pct=None, fraction=None,
                    memory_bytes=GiB, power_w=None, energy_j=0.0, gpm_sm_active_pct=None, processes=1)

GPU0 = UnitShares(0, "GPU-0", "GPU-0", "shared", 2.0, 90.0, (VIEWER, TRAINER), 10.0, 512 * MiB, 30.0, 950.0, True)
MIG_A = UnitShares(1, "GPU-1", "MIG-a", "mig", 2.0, 40.0, (TRITON,), 0.0, None, 5.0, 100.0, True)
MIG_B = UnitShares(1, "GPU-1", "MIG-b", "mig", 2.0, 12.5, (), 12.5, 13 * MiB, 20.0, 4000.0, True)
IDLE = UnitShares(2, "GPU-2", "GPU-2", "whole", 2.0, 0.0, (), 0.0, 0, 35.0, 9000.0, True)
MEMORY_ONLY = UnitShares(3, "GPU-3", "GPU-3", "whole", 2.0, None, (HOLDER,), None, None, None, 0.0, False)
SHARES = (MIG_B, IDLE, MIG_A, MEMORY_ONLY, GPU0)


def test_each_owner_then_the_unattributed_rest_per_unit() -> None:
    data = share_columns(SHARES, USAGE)
    assert data["unit"] == ["GPU 0"] * 3 + ["GPU 1 / MIG 3g.20gb (GI 1)"] * 2 + ["GPU 1 / MIG 2g.10gb (GI 2)"] + [
        "GPU 3"] * 2
    assert data["sharing"] == ["shared"] * 3 + ["MIG"] * 3 + ["whole GPU"] * 2
    assert data["owner"] == ["training/trainer-0/trainer", "pid 4343", "unattributed",
                             "inference/server-1/triton", "unattributed", "unattributed",
                             "container 0123456789ab", "unattributed"]
    assert data["sm"] == ["60.0 %", "20.0 %", "10.0 %", "40.0 %", "0.0 %", "12.5 %", "n/a", "n/a"]
    assert data["memory"] == ["20.0 GiB", "4.0 GiB", "512.0 MiB", "6.0 GiB", "n/a", "13.0 MiB", "1.0 GiB", "n/a"]
    assert data["power"] == ["200.0 W", "60.0 W", "30.0 W", "50.0 W", "5.0 W", "20.0 W", "n/a", "n/a"]
    assert data["energy"] == ["7.2 kJ", "2.5 kJ", "950 J", "1.5 MJ", "100 J", "4.0 kJ", "0 J", "0 J"]
    assert data["processes"] == ["2", "1", "", "1", "", "", "1", ""]
    assert data["memory_bytes"][:3] == [20 * GiB, 4 * GiB, 512 * MiB]
    assert data["energy_j"] == [7200.0, 2500.0, 950.0, 1.5e6, 100.0, 4000.0, 0.0, 0.0]
    assert math.isnan(data["sm_pct"][6])
    assert math.isnan(data["power_w"][7])


def test_an_idle_unowned_gpu_has_no_rows_and_no_reading_names_mig_by_uuid() -> None:
    assert share_columns((IDLE,), USAGE)["owner"] == []
    assert share_columns((MIG_A,), None)["unit"] == ["GPU 1 / MIG-a", "GPU 1 / MIG-a"]


def test_energy_and_power_read_in_honest_units() -> None:
    assert [format_energy(j) for j in (0.4, 999.0, 1000.0, 3.6e6, 2.5e9, None, NAN)] == [
        "0 J", "999 J", "1.0 kJ", "3.6 MJ", "2.5 GJ", "n/a", "n/a"]
    assert [format_power(w) for w in (0.0, 699.95, None)] == ["0.0 W", "700.0 W", "n/a"]


def test_the_page_shows_the_shares_and_follows_new_snapshots() -> None:
    ctx = make_ctx(snapshot(1001.0, None), replace(snapshot(NOW, USAGE), shares=SHARES))
    page = Page(ctx)
    source = page.named("shares", ColumnDataSource)
    table = page.named("share-table", DataTable)
    assert table.visible
    assert page.named("share-title", Div).visible
    assert list(source.data["owner"]) == share_columns(SHARES, USAGE)["owner"]
    assert list(source.data["energy"])[:3] == ["7.2 kJ", "2.5 kJ", "950 J"]
    assert [column.field for column in table.columns] == ["unit", "sharing", "owner", "sm_pct", "memory_bytes",
                                                          "power_w", "energy_j", "processes"]

    later = replace(GPU0, owners=(replace(TRAINER, energy_j=7600.0), VIEWER), unattributed_energy_j=1010.0)
    ctx.store.append(replace(snapshot(NOW + 1, USAGE), shares=(later,)))
    tick(page.doc)
    assert list(source.data["owner"]) == ["training/trainer-0/trainer", "pid 4343", "unattributed"]
    assert list(source.data["energy"]) == ["7.6 kJ", "2.5 kJ", "1.0 kJ"]
    assert tick(page.doc) == [], "nothing new, nothing sent"

    ctx.store.append(replace(snapshot(NOW + 2, USAGE), shares=(IDLE,)))
    tick(page.doc)
    assert list(source.data["owner"]) == []
    assert not table.visible
    assert not page.named("share-title", Div).visible
