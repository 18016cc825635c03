"""NVLink maxima: the usable data rate (NVIDIA's published figures) apart from the driver's signalling rate.

Expected numbers are NVIDIA's: H100 NVLink 4 has 18 links at 25 GB/s per direction (900 GB/s both directions);
A100 NVLink 3 has 12 links at 25 GB/s; B200 NVLink 5 has 18 links at 50 GB/s. ``NVML_FI_DEV_NVLINK_GET_SPEED``
answers the signalling rate in MB/s, as ``nvidia-smi nvlink -s`` shows it: 26.562 GB/s (H100), 25.781 GB/s (A100).
"""

from __future__ import annotations

from dataclasses import replace

import pynvml
import pytest

from nvdash.sampling.fake import FakeNvmlLibrary
from nvdash.sampling.fake.profiles import PROFILES
from nvdash.sampling.nvml_source import NvmlSource, install_library
from nvdash.sampling.records import GpuInfo
from tests.unit.conftest import FakeClock, open_source


def _complete(gpus: tuple[GpuInfo, ...], links: int) -> GpuInfo:
    """A GPU whose links are all up (the scenarios take a link down on some GPUs)."""
    return next(gpu for gpu in gpus if gpu.nvlink_links == links)


@pytest.mark.parametrize(
    ("profile", "links", "data_per_link", "signalling_mb_per_s"),
    [
        ("dgx-h100", 18, 25e9, 26562),
        ("dgx-a100", 12, 25e9, 25781),
        ("dgx-b200", 18, 50e9, 53125),
    ],
)
def test_nvlink_maximum_is_the_data_rate_and_the_speed_field_is_the_signalling_rate(
    clock: FakeClock, profile: str, links: int, data_per_link: float, signalling_mb_per_s: int
) -> None:
    for source, _ in open_source(profile, clock):
        gpu = _complete(source.open(), links)
        assert gpu.nvlink_link_bytes_per_s == pytest.approx(data_per_link)
        assert gpu.nvlink_max_bytes_per_s == pytest.approx(links * data_per_link)
        assert gpu.nvlink_link_signalling_bytes_per_s == pytest.approx(signalling_mb_per_s * 1e6)
        assert gpu.nvlink_signalling_max_bytes_per_s == pytest.approx(links * signalling_mb_per_s * 1e6)
        assert gpu.nvlink_speed_from_driver


def test_h100_figures_written_out(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock):
        gpu = _complete(source.open(), 18)
        assert gpu.nvlink_max_bytes_per_s == pytest.approx(450e9)
        assert gpu.nvlink_signalling_max_bytes_per_s == pytest.approx(478.116e9)


def test_a_gpu_with_a_link_down_counts_only_the_links_up(clock: FakeClock) -> None:
    for source, _ in open_source("dgx-h100", clock):
        short = [gpu for gpu in source.open() if 0 < gpu.nvlink_links < 18]
        assert short, "the dgx-h100 scenario has a GPU with a link down"
        for gpu in short:
            assert gpu.nvlink_max_bytes_per_s == pytest.approx(gpu.nvlink_links * 25e9)
            assert gpu.nvlink_signalling_max_bytes_per_s == pytest.approx(gpu.nvlink_links * 26562e6)


def test_without_the_speed_field_the_data_rate_stays_and_the_signalling_rate_is_unknown(clock: FakeClock) -> None:
    fake = FakeNvmlLibrary(replace(PROFILES["dgx-h100"], nvlink_speed_mbps=0), seed=1, clock=clock, latency_scale=0)
    restore = install_library(pynvml, fake)
    source = NvmlSource(pynvml)
    try:
        gpu = _complete(source.open(), 18)
        (speed,) = pynvml.nvmlDeviceGetFieldValues(
            pynvml.nvmlDeviceGetHandleByIndex(gpu.index), [(pynvml.NVML_FI_DEV_NVLINK_GET_SPEED, 0)]
        )
        assert speed.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
        assert gpu.nvlink_max_bytes_per_s == pytest.approx(18 * 25e9)
        assert gpu.nvlink_link_signalling_bytes_per_s is None
        assert gpu.nvlink_signalling_max_bytes_per_s is None
        assert not gpu.nvlink_speed_from_driver
    finally:
        source.close()
        restore()


def test_the_fake_workload_stays_within_the_data_rate(clock: FakeClock) -> None:
    """Over a whole cycle of the workload, no second's NVLink traffic exceeds the links' data rate."""
    for source, fake in open_source("dgx-h100", clock):
        gpus = source.open()
        workload = fake.workload
        peaks = []
        for gpu in gpus:
            assert gpu.nvlink_max_bytes_per_s is not None
            for series in ("nvlink_tx", "nvlink_rx"):
                peak = max(workload.rate_bytes_per_s(gpu.index, series, t / 4) for t in range(2400))
                assert peak <= gpu.nvlink_max_bytes_per_s
                peaks.append(peak)
        assert max(peaks) > 0
