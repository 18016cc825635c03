"""Bottleneck hints from a window of rows: each rule's positive and negative case, unknowns, lost GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nvdash.health.hints import Hint, bottleneck_hints, linear_fit
from nvdash.sampling.records import GpuInfo, GpuSample, HostInfo, HostSample, Inventory, Snapshot

GiB = 1024**3
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 80 * GiB, 5, 16, 64e9, 18, 450e9)
INVENTORY = Inventory(host=HostInfo("node", 16, 64 * GiB), gpus=(H100, replace(H100, index=1, uuid="GPU-1")))


def rows(count: int, gpus: tuple[GpuSample, ...] | None = None, cpu: float | None = 20.0, step_s: float = 1.0,
         **per_gpu: float | None) -> list[Snapshot]:
    """``count`` rows one ``step_s`` apart; every GPU has ``per_gpu`` readings unless ``gpus`` is given."""
    def sample(index: int) -> GpuSample:
        values = {"utilization_pct": 90.0, "memory_used_bytes": 20 * GiB, **per_gpu}
        return GpuSample(index, **values)  # type: ignore[arg-type]

    fixed = gpus if gpus is not None else (sample(0), sample(1))
    return [Snapshot(1000.0 + t * step_s, fixed, HostSample(cpu_pct=cpu)) for t in range(count)]


def kinds(hints: list[Hint]) -> list[str]:
    return [hint.kind for hint in hints]


def test_a_busy_machine_with_steady_memory_has_no_hint() -> None:
    assert bottleneck_hints(INVENTORY, rows(60)) == []


def test_no_rows_or_no_gpus_give_no_hint() -> None:
    assert bottleneck_hints(INVENTORY, []) == []
    assert bottleneck_hints(Inventory(host=INVENTORY.host), rows(60)) == []


# --- input pipeline -----------------------------------------------------------------------------------------


def test_gpu_idle_while_host_cpu_saturated_is_input_bound() -> None:
    (hint,) = bottleneck_hints(INVENTORY, rows(60, cpu=97.0, utilization_pct=12.0))
    assert hint.kind == "input"
    assert hint.gpus == (0, 1)
    assert hint.text.startswith("GPU 0, GPU 1 are mostly idle while the host CPU is saturated")
    assert hint.evidence == ("over the last 59 s the host CPU averaged 97 % busy; GPU 0 12 % busy holding 20.0 GiB; "
                             "GPU 1 12 % busy holding 20.0 GiB")


@pytest.mark.parametrize(("cpu", "util", "used_gib"), [
    (60.0, 12.0, 20.0),   # the host has room
    (97.0, 85.0, 20.0),   # the GPU is busy
    (97.0, 0.0, 0.5),     # no job holds the GPU
    (None, 12.0, 20.0),   # CPU unknown
    (97.0, None, 20.0),   # utilization unknown
])
def test_input_bound_needs_a_saturated_host_and_a_starved_gpu_that_holds_a_job(
        cpu: float | None, util: float | None, used_gib: float) -> None:
    found = bottleneck_hints(INVENTORY, rows(60, cpu=cpu, utilization_pct=util, memory_used_bytes=used_gib * GiB))
    assert "input" not in kinds(found)


def test_a_lost_gpu_gives_no_hint() -> None:
    lost = (GpuSample(0, lost=True), GpuSample(1, utilization_pct=90.0, memory_used_bytes=20 * GiB))
    assert bottleneck_hints(INVENTORY, rows(60, gpus=lost, cpu=99.0)) == []


# --- transfer bound -----------------------------------------------------------------------------------------


def test_pcie_near_its_maximum_while_utilization_is_low_is_transfer_bound() -> None:
    hints = bottleneck_hints(INVENTORY, rows(60, utilization_pct=35.0, pcie_rx_bytes_per_s=51.2e9,
                                             pcie_tx_bytes_per_s=1e9))
    assert [h.gpus for h in hints] == [(0,), (1,)]
    hint = hints[0]
    assert hint.kind == "transfer"
    assert hint.text.startswith("GPU 0 looks transfer-bound")
    assert hint.evidence == ("over the last 59 s PCIe RX averaged 51.2 GB/s of 64.0 GB/s (80 %) while utilization "
                             "averaged 35 %")


@pytest.mark.parametrize(("util", "rx"), [(90.0, 51.2e9), (35.0, 20e9), (None, 51.2e9), (35.0, None)])
def test_transfer_bound_needs_a_busy_link_and_an_underused_gpu(util: float | None, rx: float | None) -> None:
    assert "transfer" not in kinds(bottleneck_hints(INVENTORY, rows(60, utilization_pct=util,
                                                                     pcie_rx_bytes_per_s=rx)))


def test_transfer_bound_needs_a_known_link_maximum() -> None:
    inventory = replace(INVENTORY, gpus=tuple(replace(gpu, pcie_max_bytes_per_s=None) for gpu in INVENTORY.gpus))
    assert bottleneck_hints(inventory, rows(60, utilization_pct=35.0, pcie_rx_bytes_per_s=51.2e9)) == []


# --- memory trend -------------------------------------------------------------------------------------------


def growing(per_s: float, start_gib: float, count: int = 121, step_s: float = 1.0,
            reserved: int | None = None) -> list[Snapshot]:
    return [Snapshot(1000.0 + t * step_s, (
        GpuSample(0, utilization_pct=90.0, memory_used_bytes=int(start_gib * GiB + per_s * t * step_s),
                  memory_total_bytes=80 * GiB, memory_reserved_bytes=reserved),
        GpuSample(1, utilization_pct=90.0, memory_used_bytes=20 * GiB)), HostSample(cpu_pct=20.0))
        for t in range(count)]


def test_memory_growing_steadily_gets_a_time_to_full() -> None:
    # 60 GiB used after two minutes, growing 0.1 GiB/s: 20 GiB left is 200 s.
    (hint,) = bottleneck_hints(INVENTORY, growing(0.1 * GiB, 48.0))
    assert hint.kind == "memory"
    assert hint.gpus == (0,)
    assert hint.text == "GPU 0 memory is filling up: full in about 3 min at this rate"
    assert hint.evidence == ("60.0 GiB used of 80.0 GiB available; growing 6.00 GiB/min over the last 2 min "
                             "(least-squares fit, R² 1.00)")


def test_a_ramp_that_has_levelled_off_is_not_filling() -> None:
    def used_gib(t: int) -> float:
        return 20.0 + 0.5 * min(t, 70)  # +0.5 GiB/s for 70 s, then flat at 55 GiB for 50 s

    ramp = [Snapshot(1000.0 + t, (
        GpuSample(0, utilization_pct=90.0, memory_used_bytes=int(used_gib(t) * GiB), memory_total_bytes=80 * GiB),
        GpuSample(1, utilization_pct=90.0, memory_used_bytes=20 * GiB)), HostSample(cpu_pct=20.0))
        for t in range(120)]
    assert linear_fit([(row.time_s, float(row.gpus[0].memory_used_bytes or 0)) for row in ramp]) is not None
    assert bottleneck_hints(INVENTORY, ramp) == [], "the whole window fits a rising line, but it stopped rising"
    assert kinds(bottleneck_hints(INVENTORY, ramp[:70])) == ["memory"], "while it still rises, it is a hint"


def test_reserved_memory_is_not_available_to_fill() -> None:
    (hint,) = bottleneck_hints(INVENTORY, growing(0.1 * GiB, 48.0, reserved=19 * GiB))
    # 60 GiB used of 80 - 19 = 61 GiB, growing 0.1 GiB/s: 10 s left.
    assert hint.text == "GPU 0 memory is filling up: full in about 10 s at this rate"
    assert "of 61.0 GiB available" in hint.evidence


@pytest.mark.parametrize("rows_", [
    growing(0.0, 48.0),                      # flat
    growing(-0.1 * GiB, 60.0),               # shrinking
    growing(0.001 * GiB, 10.0),              # full in days
    growing(0.1 * GiB, 48.0, count=10),      # too short a span to fit
])
def test_memory_trend_needs_a_steady_rise_that_fills_soon(rows_: list[Snapshot]) -> None:
    assert bottleneck_hints(INVENTORY, rows_) == []


def test_a_noisy_memory_trace_is_not_a_trend() -> None:
    noisy = [replace(row, gpus=(replace(row.gpus[0], memory_used_bytes=(70 if t % 2 else 10) * GiB + t * 2**20),
                                row.gpus[1])) for t, row in enumerate(growing(0.0, 0.0))]
    assert bottleneck_hints(INVENTORY, noisy) == []


def test_memory_unknown_in_some_rows_is_left_out_of_the_fit() -> None:
    patchy = [replace(row, gpus=(replace(row.gpus[0], memory_used_bytes=None), row.gpus[1])) if t % 3 == 0 else row
              for t, row in enumerate(growing(0.1 * GiB, 48.0))]
    assert kinds(bottleneck_hints(INVENTORY, patchy)) == ["memory"]


def test_least_squares_fit() -> None:
    fit = linear_fit([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)])
    assert fit is not None
    assert fit == pytest.approx((2.0, 1.0, 1.0))
    assert linear_fit([(1.0, 1.0)]) is None
    assert linear_fit([(1.0, 1.0), (1.0, 2.0)]) is None


# --- NVLink balance -----------------------------------------------------------------------------------------


def nvlink_rows(tx: tuple[float | None, ...], rx: tuple[float | None, ...]) -> list[Snapshot]:
    gpus = tuple(GpuSample(i, utilization_pct=90.0, memory_used_bytes=20 * GiB, nvlink_tx_bytes_per_s=t,
                           nvlink_rx_bytes_per_s=r) for i, (t, r) in enumerate(zip(tx, rx, strict=True)))
    return rows(60, gpus=gpus)


def test_nvlink_traffic_unbalanced_across_gpus() -> None:
    (hint,) = bottleneck_hints(INVENTORY, nvlink_rows((100e9, 20e9), (100e9, 20e9)))
    assert hint.kind == "nvlink"
    assert hint.gpus == (1,)
    assert hint.text.startswith("NVLink traffic is unbalanced: GPU 1 moves less than half of GPU 0's")
    assert hint.evidence == "over the last 59 s TX + RX averaged 200.0 GB/s on GPU 0; GPU 1 40.0 GB/s"


@pytest.mark.parametrize(("tx", "rx"), [
    ((100e9, 90e9), (100e9, 90e9)),     # balanced
    ((10e9, 1e9), (10e9, 1e9)),         # too little traffic to matter
    ((100e9, None), (100e9, 20e9)),     # one GPU unknown: nothing to compare
])
def test_nvlink_balance_needs_real_traffic_and_two_known_gpus(tx: tuple[float | None, ...],
                                                              rx: tuple[float | None, ...]) -> None:
    assert bottleneck_hints(INVENTORY, nvlink_rows(tx, rx)) == []


def test_an_idle_gpu_with_quiet_links_is_not_an_imbalance() -> None:
    gpus = (GpuSample(0, utilization_pct=90.0, nvlink_tx_bytes_per_s=100e9, nvlink_rx_bytes_per_s=100e9),
            GpuSample(1, utilization_pct=0.0, nvlink_tx_bytes_per_s=0.0, nvlink_rx_bytes_per_s=0.0))
    assert bottleneck_hints(INVENTORY, rows(60, gpus=gpus)) == []
    working = (gpus[0], replace(gpus[1], utilization_pct=95.0))
    assert kinds(bottleneck_hints(INVENTORY, rows(60, gpus=working))) == ["nvlink"], "a busy GPU with quiet links"


def test_gpus_without_nvlink_are_not_compared() -> None:
    inventory = replace(INVENTORY, gpus=(H100, replace(H100, index=1, nvlink_links=0, nvlink_max_bytes_per_s=None)))
    assert bottleneck_hints(inventory, nvlink_rows((100e9, 0.0), (100e9, 0.0))) == []


def test_hints_look_only_at_the_recent_window() -> None:
    old = rows(60, cpu=99.0, utilization_pct=5.0)
    recent = [replace(row, time_s=row.time_s + 600) for row in rows(60)]
    assert bottleneck_hints(INVENTORY, old + recent) == []
