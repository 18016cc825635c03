"""Machine profiles the fake NVML can impersonate: what each GPU model reports and supports."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

_PCIE_LANE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def pcie_bytes_per_s(generation: int, width: int) -> float:
    """Usable bytes/s per direction of a PCIe link: lane rate x lanes x line-code efficiency / 8."""
    efficiency = 8 / 10 if generation <= 2 else 128 / 130
    return _PCIE_LANE_GT_PER_S[generation] * 1e9 * width * efficiency / 8


@dataclass(frozen=True)
class Profile:
    """One simulated machine: ``gpu_count`` identical GPUs and the driver that reports them."""

    name: str
    description: str
    gpu_count: int
    gpu_name: str = ""
    driver_version: str = "550.54.15"
    memory_total_mib: int = 0
    memory_reserved_mib: int = 0
    """Memory the driver keeps for itself: reported as used by ``nvmlDeviceGetMemoryInfo``."""
    pcie_generation: int = 4
    pcie_width: int = 16
    nvlink_links: int = 0
    nvlink_version: int = 0
    nvlink_link_bytes_per_s: float = 0.0
    """Per direction, per link."""
    pcie_byte_counters: bool = False
    """Whether the ``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES`` fields are supported."""
    unsupported: frozenset[str] = field(default_factory=frozenset)
    """Entry points that answer ``NVML_ERROR_NOT_SUPPORTED`` on every GPU."""
    idle_gpus: frozenset[int] = field(default_factory=frozenset)
    """GPUs outside the training job."""
    power_idle_w: float = 0.0
    power_max_w: float = 0.0
    temperature_idle_c: float = 30.0
    temperature_load_c: float = 75.0

    @property
    def memory_total_bytes(self) -> int:
        """Total framebuffer memory of one GPU."""
        return self.memory_total_mib * 1024 * 1024

    @property
    def memory_reserved_bytes(self) -> int:
        """Driver-reserved framebuffer memory of one GPU."""
        return self.memory_reserved_mib * 1024 * 1024

    @property
    def pcie_max_bytes_per_s(self) -> float:
        """Per-direction maximum of the PCIe link."""
        return pcie_bytes_per_s(self.pcie_generation, self.pcie_width)

    @property
    def nvlink_max_bytes_per_s(self) -> float:
        """Per-direction maximum summed over all links (0 without NVLink)."""
        return self.nvlink_links * self.nvlink_link_bytes_per_s


def gpu_uuid(profile_name: str, seed: int, index: int) -> str:
    """A stable UUID in NVML's ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` form."""
    digest = hashlib.sha256(f"{profile_name}:{seed}:{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            name="dgx-h100",
            description="DGX H100: 8 x H100 SXM 80GB on NVLink 4 (18 links each); GPUs 6 and 7 idle",
            gpu_count=8,
            gpu_name="NVIDIA H100 80GB HBM3",
            memory_total_mib=81559,
            memory_reserved_mib=519,
            pcie_generation=5,
            nvlink_links=18,
            nvlink_version=4,
            nvlink_link_bytes_per_s=25e9,
            pcie_byte_counters=True,
            idle_gpus=frozenset({6, 7}),
            power_idle_w=70.0,
            power_max_w=700.0,
            temperature_idle_c=33.0,
            temperature_load_c=78.0,
        ),
        Profile(
            name="a100-pcie-2",
            description="2 x A100 PCIe 40GB, no NVLink, no PCIe byte counters; GPU 1 idle",
            gpu_count=2,
            gpu_name="NVIDIA A100-PCIE-40GB",
            memory_total_mib=40960,
            memory_reserved_mib=423,
            pcie_generation=4,
            idle_gpus=frozenset({1}),
            power_idle_w=35.0,
            power_max_w=250.0,
            temperature_idle_c=31.0,
            temperature_load_c=72.0,
        ),
        Profile(
            name="t4",
            description="1 x Tesla T4 as some cloud hosts expose it: no NVLink, no byte counters, no power",
            gpu_count=1,
            gpu_name="Tesla T4",
            memory_total_mib=15360,
            memory_reserved_mib=255,
            pcie_generation=3,
            unsupported=frozenset({"nvmlDeviceGetPowerUsage"}),
            power_idle_w=10.0,
            power_max_w=70.0,
            temperature_idle_c=32.0,
            temperature_load_c=75.0,
        ),
        Profile(
            name="none",
            description="A driver that loads but reports no GPU",
            gpu_count=0,
        ),
    )
}


def profile_names() -> list[str]:
    """Names accepted by ``--simulate``, sorted."""
    return sorted(PROFILES)
