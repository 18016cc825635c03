"""The ``shares`` list of ``/api/processes.json``, from hand-built snapshots carrying the sampler's shares."""

from __future__ import annotations

from typing import Any

from nvdash.sampling.records import GpuSample, HostInfo, HostSample, Inventory, Snapshot
from nvdash.sampling.share_records import OwnerShare, ShareOwner, UnitShares
from nvdash.sampling.usage_records import Usage
from nvdash.server.usage_json import processes_json
from nvdash.store import Store

MiB = 1024 * 1024
INVENTORY = Inventory(host=HostInfo(hostname="node", cpu_count=4, memory_total_bytes=1 << 34))
SERVE = OwnerShare(ShareOwner("pod", "prod", "serve-0", "server"), sm_pct=45.0, fraction=0.5,
                   memory_bytes=4000 * MiB, power_w=100.0, energy_j=5000.0, gpm_sm_active_pct=40.0, processes=2)
BARE = OwnerShare(ShareOwner("process", pid=4242), sm_pct=27.0, fraction=0.3, memory_bytes=None, power_w=60.0,
                  energy_j=3000.0, gpm_sm_active_pct=None, processes=1)
L4 = UnitShares(gpu_index=2, gpu_uuid="GPU-l4", unit="GPU-l4", sharing="shared", window_s=2.0, utilization_pct=90.0,
                owners=(SERVE, BARE), unattributed_sm_pct=18.0, unattributed_memory_bytes=500 * MiB,
                unattributed_power_w=40.0, unattributed_energy_j=2000.0, measured=True)
MEMORY_ONLY = UnitShares(gpu_index=1, gpu_uuid="GPU-a100", unit="MIG-big", sharing="mig", window_s=0.0,
                         utilization_pct=None, owners=(OwnerShare(
                             ShareOwner("container", container="0123456789ab"), None, None, 1000 * MiB, None, 0.0,
                             None, 1),),
                         unattributed_sm_pct=None, unattributed_memory_bytes=None, unattributed_power_w=None,
                         unattributed_energy_j=0.0, measured=False)


USAGE = Usage(time_s=100.0)


def document(shares: tuple[UnitShares, ...], usage: Usage | None = USAGE) -> dict[str, Any]:
    store = Store(INVENTORY, capacity=2)
    store.append(Snapshot(100.0, (GpuSample(2),), HostSample(), usage=usage, shares=shares))
    return processes_json(store)


def test_each_unit_lists_its_owners_parts_and_the_unattributed_rest() -> None:
    doc = document((L4, MEMORY_ONLY))
    assert doc["shares"] == [
        {"gpu": 2, "uuid": "GPU-l4", "unit": "GPU-l4", "sharing": "shared", "window_s": 2.0, "utilization_pct": 90.0,
         "measured": True,
         "owners": [
             {"kind": "pod", "namespace": "prod", "pod": "serve-0", "container": "server", "pid": None,
              "label": "prod/serve-0/server", "sm_pct": 45.0, "fraction": 0.5, "memory_bytes": 4000 * MiB,
              "power_w": 100.0, "energy_j": 5000.0, "gpm_sm_active_pct": 40.0, "processes": 2},
             {"kind": "process", "namespace": None, "pod": None, "container": None, "pid": 4242, "label": "pid 4242",
              "sm_pct": 27.0, "fraction": 0.3, "memory_bytes": None, "power_w": 60.0, "energy_j": 3000.0,
              "gpm_sm_active_pct": None, "processes": 1}],
         "unattributed": {"sm_pct": 18.0, "memory_bytes": 500 * MiB, "power_w": 40.0, "energy_j": 2000.0}},
        {"gpu": 1, "uuid": "GPU-a100", "unit": "MIG-big", "sharing": "mig", "window_s": 0.0, "utilization_pct": None,
         "measured": False,
         "owners": [
             {"kind": "container", "namespace": None, "pod": None, "container": "0123456789ab", "pid": None,
              "label": "container 0123456789ab", "sm_pct": None, "fraction": None, "memory_bytes": 1000 * MiB,
              "power_w": None, "energy_j": 0.0, "gpm_sm_active_pct": None, "processes": 1}],
         "unattributed": {"sm_pct": None, "memory_bytes": None, "power_w": None, "energy_j": 0.0}},
    ]


def test_the_owners_and_the_unattributed_add_up_to_the_unit() -> None:
    (unit,) = document((L4,))["shares"]
    owners = unit["owners"]
    assert sum(owner["sm_pct"] for owner in owners) + unit["unattributed"]["sm_pct"] == unit["utilization_pct"]
    assert sum(owner["sm_pct"] for owner in owners) <= unit["utilization_pct"]
    assert sum(owner["power_w"] for owner in owners) + unit["unattributed"]["power_w"] == 200.0
    assert sum(owner["energy_j"] for owner in owners) + unit["unattributed"]["energy_j"] == 10_000.0


def test_no_usage_reading_yet_means_no_shares() -> None:
    assert document((), usage=None)["shares"] == []
    assert document(())["shares"] == []
