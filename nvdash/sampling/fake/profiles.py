"""Machine profiles the fake NVML can impersonate: what each GPU model reports and supports.

Static values come from real ``nvidia-smi -q`` captures of each model (thresholds, power limits, clocks, PCI
ids, bus ids) and from NVML's definitions; ``Profile`` field docstrings say where a value is an assumption.

Health scenario (deterministic: the same timeline for every seed; the seed varies the workload only). Times
are seconds after the library was created.

``dgx-h100``
    - GPU 3: PCIe link trained down to x8 (max x16; generation stays Gen5) for the whole run, which halves
      its PCIe bandwidth.
    - GPU 2: PCIe replay counter rising slowly, about 3 per minute.
    - GPU 1: one correctable DRAM ECC error (volatile and aggregate +1, single-bit-ECC event) at 30 s and
      every 20 s after.
    - GPU 4: at 60 s an uncorrectable ECC error: volatile and aggregate uncorrected +1 with a double-bit-ECC
      event and XID 48, XID 94 (contained) 1 ms later and XID 63 (row remap recorded) 2 ms later, after which
      one uncorrectable row is remapped and pending until reset (for the rest of the run).
    - GPU 0: a thermal episode of 14 s every ~2 min (every n workload cycles, n = round(120 s / cycle)),
      the first at 90 s: the temperature ramps up over 15 s to the GPU max operating temperature, then 2 s
      of SW thermal slowdown, 10 s of HW (thermal) slowdown at the slowdown threshold with clocks under
      half of max, 2 s of SW thermal slowdown, then cools down.
    - Busy GPUs hit SwPowerCap now and then: about one compute step in six draws more than the power limit,
      is held at the limit and loses some clock.
    - GPUs 6 and 7 are outside the job: P8, idle clocks, GpuIdle, PCIe Gen1.
    - NVLink: link 3 of GPU 7 is down (state 0, speed 0, a few recovery errors); link 11 of GPU 5 counts
      CRC flit errors and replays, about 24 per minute.
``dgx-a100``: healthy apart from SwPowerCap steps; GPU 5 carries one correctable remapped row and some
    aggregate correctable errors from before this driver load. GPU 2 is capped out of band at 300 W (its
    management limit stays 400 W): the enforced limit is 300 W and it sits at SwPowerCap in every compute step.
``hgx-h100-hpc``: ``dgx-h100``'s machine, healthy, all GPUs in an FP64-heavy simulation (GPM FP64 activity).
``dgx-b200``: GPU 2 gets a correctable ECC error every 45 s from 40 s; GPU 7 is idle; SwPowerCap steps.
``a100-pcie-2``: healthy; GPU 1 idle.
``a100-mig``: ``a100-pcie-2`` with GPU 0 in MIG mode (3g.20gb, 2g.10gb, two 1g.5gb; the last one empty) and
    both GPUs busy.
``h100-mig``: two of ``dgx-h100``'s GPUs, healthy; GPU 0 in MIG mode with H100 80GB profiles (3g.40gb, 2g.20gb, two
    1g.10gb; the last one empty), GPM per GPU instance (``nvmlGpmMigSampleGet``); GPU 1 whole and busy.

Processes (see ``usage_specs``): one training rank per busy GPU holding 97 % of the job's memory (on
``dgx-h100`` GPU 5's rank reads 37,100 % SM in every 25th utilization sample); ``dgx-h100`` GPU 6 runs an MPS
server with two idle clients; ``t4`` also shows an X server (graphics); ``a100-mig`` has four processes in
three of its instances.
``t4``: pre-Ampere page retirement: two pages retired for multiple single-bit errors before start (none
    pending), matching aggregate correctable counts; power readings hidden by the host. It decodes video
    (NVDEC busy) and encodes a little (NVENC); the datacenter boards have NVDEC but no NVENC.

Video, math mix and violation counters: see the ``Profile`` fields ``nvenc_count`` to ``violation_policies``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import TypeVar

from . import constants as c
from .usage_specs import GHOST_PID_BASE, MigSpec, ProcessSpec, ranks

_T = TypeVar("_T")
_PCIE_LANE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def pcie_bytes_per_s(generation: int, width: int) -> float:
    """Usable bytes/s per direction of a PCIe link: lane rate x lanes x line-code efficiency / 8."""
    if generation <= 2:
        efficiency = 8 / 10
    elif generation <= 5:
        efficiency = 128 / 130
    else:
        efficiency = 242 / 256
    return _PCIE_LANE_GT_PER_S[generation] * 1e9 * width * efficiency / 8


def _lookup(pairs: tuple[tuple[int, _T], ...], gpu: int) -> _T | None:
    for key, value in pairs:
        if key == gpu:
            return value
    return None


@dataclass(frozen=True)
class Scenario:
    """A profile's health timeline, as (GPU, ...) tuples so that profiles stay hashable."""

    pcie_width: tuple[tuple[int, int], ...] = ()
    """(GPU, lanes it trained to) for links that came up narrower than their maximum."""
    pcie_replays_per_min: tuple[tuple[int, float], ...] = ()
    correctable_ecc: tuple[tuple[int, tuple[float, float]], ...] = ()
    """(GPU, (first error s, seconds between errors))."""
    uncorrectable_ecc: tuple[tuple[int, float], ...] = ()
    """(GPU, s): XID 48 + 94 + 63 and a pending remapped row (Ampere+) or a pending retired page."""
    thermal_episodes: tuple[tuple[int, float], ...] = ()
    """(GPU, start of the first episode s); episodes repeat every ~2 min."""
    nvlink_down: tuple[tuple[int, int], ...] = ()
    """(GPU, link) that is inactive for the whole run."""
    nvlink_crc_per_min: tuple[tuple[int, tuple[int, float]], ...] = ()
    """(GPU, (link, CRC flit errors per minute))."""
    ecc_history: tuple[tuple[int, tuple[int, int]], ...] = ()
    """(GPU, (aggregate corrected, aggregate uncorrected)) from before this driver load."""
    remapped_history: tuple[tuple[int, int], ...] = ()
    """(GPU, rows remapped for correctable errors before this driver load)."""
    retired_sbe_pages: tuple[tuple[int, int], ...] = ()
    """(GPU, pages retired for multiple single-bit errors before start); pre-Ampere only."""
    power_caps: tuple[tuple[int, float], ...] = ()
    """(GPU, W): a limiter outside the driver (out-of-band capping by the BMC) holds the GPU below its
    management limit; the enforced limit is the lower of the two, and the power draw respects it."""

    def width(self, gpu: int) -> int | None:
        """The trained PCIe width of ``gpu`` if it is below the maximum."""
        return _lookup(self.pcie_width, gpu)

    def replays_per_min(self, gpu: int) -> float:
        """PCIe replays per minute of ``gpu``."""
        return _lookup(self.pcie_replays_per_min, gpu) or 0.0

    def correctable(self, gpu: int) -> tuple[float, float] | None:
        """(first s, period s) of ``gpu``'s correctable ECC errors."""
        return _lookup(self.correctable_ecc, gpu)

    def uncorrectable(self, gpu: int) -> float | None:
        """When ``gpu`` gets its uncorrectable ECC error."""
        return _lookup(self.uncorrectable_ecc, gpu)

    def thermal(self, gpu: int) -> float | None:
        """Start of ``gpu``'s first thermal episode."""
        return _lookup(self.thermal_episodes, gpu)

    def link_down(self, gpu: int) -> int | None:
        """The inactive NVLink of ``gpu``."""
        return _lookup(self.nvlink_down, gpu)

    def link_crc(self, gpu: int) -> tuple[int, float] | None:
        """(link, CRC errors per minute) of ``gpu``."""
        return _lookup(self.nvlink_crc_per_min, gpu)

    def history(self, gpu: int) -> tuple[int, int]:
        """Aggregate (corrected, uncorrected) ECC errors of ``gpu`` from before this driver load."""
        return _lookup(self.ecc_history, gpu) or (0, 0)

    def remapped_before(self, gpu: int) -> int:
        """Rows of ``gpu`` remapped for correctable errors before this driver load."""
        return _lookup(self.remapped_history, gpu) or 0

    def retired_sbe(self, gpu: int) -> int:
        """Pages of ``gpu`` retired for multiple single-bit errors before start."""
        return _lookup(self.retired_sbe_pages, gpu) or 0

    def power_cap(self, gpu: int) -> float | None:
        """The out-of-band power cap of ``gpu`` in W, if any."""
        return _lookup(self.power_caps, gpu)


@dataclass(frozen=True)
class Profile:
    """One simulated machine: ``gpu_count`` identical GPUs and the driver that reports them."""

    name: str
    description: str
    gpu_count: int
    gpu_name: str = ""
    driver_version: str = "550.54.15"
    architecture: int = 0
    """``nvmlDeviceArchitecture_t``."""
    memory_total_mib: int = 0
    memory_reserved_mib: int = 0
    """Memory the driver keeps for itself: reported as used by ``nvmlDeviceGetMemoryInfo``."""
    pci_device_id: int = 0
    """``nvmlPciInfo_t.pciDeviceId``: device id << 16 | vendor id 0x10DE."""
    pci_subsystem_id: int = 0
    pci_locations: tuple[tuple[int, int], ...] = ()
    """(bus, device) of each GPU on PCI domain 0."""
    numa_nodes: tuple[int, ...] = ()
    """CPU socket each GPU hangs off."""
    pcie_switches: tuple[int, ...] = ()
    """PCIe switch each GPU sits behind; GPUs with the same number share it."""
    shared_switch_level: int = c.NVML_TOPOLOGY_MULTIPLE
    """``nvmlGpuTopologyLevel_t`` between two GPUs behind the same switch."""
    pcie_generation: int = 4
    pcie_width: int = 16
    pcie_byte_counters: bool = False
    """Whether the ``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES`` fields are supported."""
    nvlink_links: int = 0
    nvlink_version: int = c.NVML_NVLINK_VERSION_INVALID
    """``nvmlNvlinkVersion_t`` (an enum: 5 is NVLink 3.1, 6 is 4.0, 7 is 5.0)."""
    nvlink_speed_mbps: int = 0
    """Per-link, per-direction signalling rate as ``NVML_FI_DEV_NVLINK_GET_SPEED`` answers it (MBps, 10^6 B/s).
    ``nvidia-smi nvlink -s`` shows it as GB/s: 25.781 GB/s (A100), 26.562 GB/s (H100), 53.125 GB/s (B200); the
    usable data rate (25, 25, 50 GB/s) is below it by the line encoding."""
    nvlink_link_bytes_per_s: float = 0.0
    """Usable data rate per direction, per link (below the signalling rate): the workload's ceiling."""
    nvswitch_buses: tuple[int, ...] = ()
    """PCI bus of each NVSwitch chip on domain 0; empty without NVSwitch."""
    nvswitch_pci_device_id: int = 0
    temperature_shutdown_c: int = 0
    temperature_slowdown_c: int = 0
    temperature_gpu_max_c: int = 0
    """GPU max operating temperature: above it the driver applies SW thermal slowdown."""
    temperature_memory_max_c: int = 0
    """HBM max operating temperature; 0: no memory sensor (GDDR boards answer NOT_SUPPORTED)."""
    power_limit_w: float = 0.0
    """Default power limit, also the management limit (nobody changed it); the enforced limit is the same
    unless the scenario caps the GPU (``Scenario.power_caps``)."""
    power_min_limit_w: float = 0.0
    power_max_limit_w: float = 0.0
    clock_max_mhz: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Max clocks by ``nvmlClockType_t``: graphics, SM, memory, video."""
    clock_idle_mhz: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Clocks in P8 (idle), same order."""
    clock_step_mhz: float = 15.0
    """Spacing of the supported graphics clocks."""
    fan_count: int = 0
    """0: passively cooled, fan queries answer NOT_SUPPORTED."""
    gpm_supported: bool = False
    row_remapping: bool = False
    """Ampere and later remap rows; older GPUs retire pages."""
    unsupported: frozenset[str] = field(default_factory=frozenset)
    """Entry points that answer ``NVML_ERROR_NOT_SUPPORTED`` on every GPU."""
    idle_gpus: frozenset[int] = field(default_factory=frozenset)
    """GPUs outside the training job."""
    power_idle_w: float = 0.0
    temperature_idle_c: float = 30.0
    temperature_load_c: float = 75.0
    scenario: Scenario = field(default_factory=Scenario)
    sm_count: int = 0
    """Streaming multiprocessors of the whole GPU (``nvmlDeviceAttributes_t.multiprocessorCount``)."""
    mig_capable: bool = False
    """Whether the GPU supports MIG (A100, H100, B200): MIG mode queries answer instead of NOT_SUPPORTED."""
    mig_layout: tuple[tuple[int, tuple[MigSpec, ...]], ...] = ()
    """(GPU, its instances) for each GPU in MIG mode."""
    processes: tuple[ProcessSpec, ...] = ()
    nvenc_count: int = 0
    """Video encoder engines (NVENC); 0: ``nvmlDeviceGetEncoderUtilization`` answers NOT_SUPPORTED."""
    nvdec_count: int = 0
    """Video decoder engines (NVDEC); 0: ``nvmlDeviceGetDecoderUtilization`` answers NOT_SUPPORTED."""
    decode_pct: tuple[float, float] = (0.0, 0.0)
    """Mean NVDEC busy share (%) during compute steps and during the data-loader stall: the job's data loader
    decodes video on NVDEC (as DALI does), hardest while the GPUs wait for it."""
    encode_pct: float = 0.0
    """Mean NVENC busy share (%) of a GPU in the job (e.g. a remote desktop or a stream being encoded)."""
    math_mix: tuple[float, float, float] = (0.004, 0.16, 0.09)
    """Share of SM-active time the SMs spend in non-tensor FP64, FP32 and FP16 math (GPM FP64/FP32/FP16_UTIL):
    by default a mixed-precision training job, whose heavy math runs on the tensor cores."""
    violation_policies: frozenset[int] = frozenset(range(c.NVML_PERF_POLICY_RELIABILITY))
    """``nvmlPerfPolicyType_t`` values ``nvmlDeviceGetViolationStatus`` answers; others answer NOT_SUPPORTED.
    NVML does not list which GPUs count which policy: the fake counts RELIABILITY from Hopper on only."""

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

    def pcie_width_of(self, gpu: int) -> int:
        """Lanes the link of ``gpu`` trained to."""
        return self.scenario.width(gpu) or self.pcie_width

    def enforced_limit_w(self, gpu: int) -> float:
        """The limit the driver enforces: the management limit or the scenario's lower cap."""
        cap = self.scenario.power_cap(gpu)
        return self.power_limit_w if cap is None else min(cap, self.power_limit_w)

    def nvswitch_of(self, link: int) -> int:
        """The NVSwitch chip a GPU's ``link`` goes to (links spread evenly over the chips)."""
        return link * len(self.nvswitch_buses) // self.nvlink_links


def gpu_uuid(profile_name: str, seed: int, index: int) -> str:
    """A stable UUID in NVML's ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` form."""
    digest = hashlib.sha256(f"{profile_name}:{seed}:{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


_ALL_VIOLATION_POLICIES = frozenset(range(c.NVML_PERF_POLICY_RELIABILITY + 1))
_TWO_SOCKETS = (0, 0, 0, 0, 1, 1, 1, 1)
_PAIRS = (0, 0, 1, 1, 2, 2, 3, 3)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            name="dgx-h100",
            driver_version="570.133.20",
            description="DGX H100: 8 x H100 SXM 80GB on NVLink 4 (18 links each); GPUs 6 and 7 idle",
            gpu_count=8,
            gpu_name="NVIDIA H100 80GB HBM3",
            architecture=c.NVML_DEVICE_ARCH_HOPPER,
            memory_total_mib=81559,
            memory_reserved_mib=519,
            pci_device_id=0x233010DE,
            pci_subsystem_id=0x16C110DE,
            pci_locations=tuple((bus, 0) for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)),
            numa_nodes=_TWO_SOCKETS,
            # Each GPU has a PCIe switch of its own (shared with its NIC), so two GPUs meet at the socket.
            pcie_switches=(0, 1, 2, 3, 4, 5, 6, 7),
            pcie_generation=5,
            pcie_byte_counters=True,
            nvlink_links=18,
            nvlink_version=c.NVML_NVLINK_VERSION_4_0,
            nvlink_speed_mbps=26562,
            nvlink_link_bytes_per_s=25e9,
            nvswitch_buses=(0x05, 0x06, 0x07, 0x08),
            nvswitch_pci_device_id=0x22A310DE,
            temperature_shutdown_c=92,
            temperature_slowdown_c=89,
            temperature_gpu_max_c=87,
            temperature_memory_max_c=95,
            power_limit_w=700.0,
            power_min_limit_w=200.0,
            power_max_limit_w=700.0,
            clock_max_mhz=(1980, 1980, 2619, 1545),
            clock_idle_mhz=(345, 345, 2619, 765),
            gpm_supported=True,
            row_remapping=True,
            idle_gpus=frozenset({6, 7}),
            power_idle_w=70.0,
            temperature_idle_c=33.0,
            temperature_load_c=78.0,
            scenario=Scenario(
                pcie_width=((3, 8),),
                pcie_replays_per_min=((2, 3.0),),
                correctable_ecc=((1, (30.0, 20.0)),),
                uncorrectable_ecc=((4, 60.0),),
                thermal_episodes=((0, 90.0),),
                nvlink_down=((7, 3),),
                nvlink_crc_per_min=((5, (11, 24.0)),),
                ecc_history=((1, (4, 0)),),
            ),
            sm_count=132,
            mig_capable=True,
            nvdec_count=7,
            decode_pct=(25.0, 60.0),
            violation_policies=_ALL_VIOLATION_POLICIES,
            processes=(
                *ranks(range(6), garbage_on=5),
                # GPU 6 serves inference through MPS: the control daemon's server and two idle clients.
                ProcessSpec(6, GHOST_PID_BASE + 600, memory_mib=32, sm_share=0.0),
                ProcessSpec(6, GHOST_PID_BASE + 601, ("compute", "mps"), memory_mib=2048, sm_share=0.5),
                ProcessSpec(6, GHOST_PID_BASE + 602, ("compute", "mps"), memory_mib=3072, sm_share=0.5),
            ),
        ),
        Profile(
            name="dgx-a100",
            description="DGX A100: 8 x A100 SXM4 80GB on NVLink 3 (12 links each), all in the job",
            gpu_count=8,
            gpu_name="NVIDIA A100-SXM4-80GB",
            architecture=c.NVML_DEVICE_ARCH_AMPERE,
            memory_total_mib=81920,
            memory_reserved_mib=763,
            pci_device_id=0x20B210DE,
            pci_subsystem_id=0x147F10DE,
            pci_locations=tuple((bus, 0) for bus in (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)),
            numa_nodes=_TWO_SOCKETS,
            pcie_switches=_PAIRS,
            pcie_generation=4,
            nvlink_links=12,
            nvlink_version=c.NVML_NVLINK_VERSION_3_1,
            nvlink_speed_mbps=25781,
            nvlink_link_bytes_per_s=23.5e9,
            # Six NVSwitch chips on the baseboard; their bus numbers are plausible, not from a capture.
            nvswitch_buses=(0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9),
            nvswitch_pci_device_id=0x1AF110DE,
            temperature_shutdown_c=92,
            temperature_slowdown_c=89,
            temperature_gpu_max_c=85,
            temperature_memory_max_c=95,
            power_limit_w=400.0,
            power_min_limit_w=100.0,
            power_max_limit_w=400.0,
            clock_max_mhz=(1410, 1410, 1593, 1290),
            clock_idle_mhz=(210, 210, 1593, 585),
            row_remapping=True,
            power_idle_w=55.0,
            temperature_idle_c=28.0,
            temperature_load_c=70.0,
            scenario=Scenario(ecc_history=((5, (11, 0)),), remapped_history=((5, 1),), power_caps=((2, 300.0),)),
            sm_count=108,
            mig_capable=True,
            nvdec_count=5,
            processes=ranks(range(8)),
        ),
        Profile(
            name="dgx-b200",
            driver_version="570.133.20",
            description="DGX B200: 8 x B200 180GB on NVLink 5 (18 links each); GPU 7 idle",
            gpu_count=8,
            gpu_name="NVIDIA B200",
            architecture=c.NVML_DEVICE_ARCH_BLACKWELL,
            memory_total_mib=183359,
            memory_reserved_mib=728,
            pci_device_id=0x290110DE,
            pci_subsystem_id=0x199910DE,
            pci_locations=tuple((bus, 0) for bus in (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)),
            numa_nodes=_TWO_SOCKETS,
            pcie_switches=_PAIRS,
            pcie_generation=5,
            pcie_byte_counters=True,
            nvlink_links=18,
            nvlink_version=c.NVML_NVLINK_VERSION_5_0,
            nvlink_speed_mbps=53125,
            nvlink_link_bytes_per_s=50e9,
            # Two NVLink 5 switch chips; bus numbers plausible. Their PCI device id was not found in any
            # public capture, so only the vendor (0x10DE) is filled in.
            nvswitch_buses=(0x04, 0x05),
            nvswitch_pci_device_id=0x000010DE,
            # Derived from a B200 capture in T.Limit form (39 C with 49 C headroom; shutdown -5, slowdown -3,
            # GPU max 0 relative to the limit). The memory maximum (95 C) is assumed as for HBM3 on H100.
            temperature_shutdown_c=93,
            temperature_slowdown_c=91,
            temperature_gpu_max_c=88,
            temperature_memory_max_c=95,
            power_limit_w=1000.0,
            power_min_limit_w=200.0,
            power_max_limit_w=1000.0,
            clock_max_mhz=(1965, 1965, 3996, 1965),
            clock_idle_mhz=(120, 120, 3996, 600),
            clock_step_mhz=7.5,
            gpm_supported=True,
            row_remapping=True,
            idle_gpus=frozenset({7}),
            power_idle_w=140.0,
            temperature_idle_c=28.0,
            temperature_load_c=72.0,
            scenario=Scenario(correctable_ecc=((2, (40.0, 45.0)),)),
            sm_count=148,
            mig_capable=True,
            nvdec_count=7,
            violation_policies=_ALL_VIOLATION_POLICIES,
            processes=ranks(range(7)),
        ),
        Profile(
            name="a100-pcie-2",
            description="2 x A100 PCIe 40GB, no NVLink, no PCIe byte counters; GPU 1 idle",
            gpu_count=2,
            gpu_name="NVIDIA A100-PCIE-40GB",
            architecture=c.NVML_DEVICE_ARCH_AMPERE,
            memory_total_mib=40960,
            memory_reserved_mib=423,
            pci_device_id=0x20F110DE,
            pci_subsystem_id=0x145F10DE,
            pci_locations=((0x3B, 0), (0xAF, 0)),
            numa_nodes=(0, 1),
            pcie_switches=(0, 1),
            pcie_generation=4,
            temperature_shutdown_c=92,
            temperature_slowdown_c=89,
            temperature_gpu_max_c=85,
            temperature_memory_max_c=95,
            power_limit_w=250.0,
            power_min_limit_w=150.0,
            power_max_limit_w=250.0,
            clock_max_mhz=(1410, 1410, 1215, 1290),
            clock_idle_mhz=(210, 210, 1215, 585),
            row_remapping=True,
            idle_gpus=frozenset({1}),
            power_idle_w=35.0,
            temperature_idle_c=31.0,
            temperature_load_c=72.0,
            sm_count=108,
            mig_capable=True,
            nvdec_count=5,
            processes=ranks((0,)),
        ),
        Profile(
            name="t4",
            description="1 x Tesla T4 as some cloud hosts expose it: no NVLink, no byte counters, no power",
            gpu_count=1,
            gpu_name="Tesla T4",
            architecture=c.NVML_DEVICE_ARCH_TURING,
            memory_total_mib=15360,
            memory_reserved_mib=255,
            pci_device_id=0x1EB810DE,
            pci_subsystem_id=0x12A210DE,
            pci_locations=((0x00, 0x1E),),
            numa_nodes=(0,),
            pcie_switches=(0,),
            pcie_generation=3,
            temperature_shutdown_c=96,
            temperature_slowdown_c=93,
            temperature_gpu_max_c=85,
            power_limit_w=70.0,
            power_min_limit_w=60.0,
            power_max_limit_w=70.0,
            clock_max_mhz=(1590, 1590, 5001, 1470),
            clock_idle_mhz=(300, 300, 405, 540),
            unsupported=frozenset({"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"}),
            power_idle_w=10.0,
            temperature_idle_c=32.0,
            temperature_load_c=75.0,
            scenario=Scenario(ecc_history=((0, (37, 0)),), retired_sbe_pages=((0, 2),)),
            sm_count=40,
            nvenc_count=1,
            nvdec_count=2,
            decode_pct=(55.0, 70.0),
            encode_pct=6.0,
            processes=(*ranks((0,)), ProcessSpec(0, GHOST_PID_BASE + 900, ("graphics",), memory_mib=23)),
        ),
        Profile(
            name="none",
            description="A driver that loads but reports no GPU",
            gpu_count=0,
        ),
    )
}


_A100_MIG_LAYOUT = (
    MigSpec("3g.20gb", gpu_instance_id=1, placement_start=4),
    MigSpec("2g.10gb", gpu_instance_id=5, placement_start=0),
    MigSpec("1g.5gb", gpu_instance_id=13, placement_start=2),
    MigSpec("1g.5gb", gpu_instance_id=14, placement_start=3),
)
"""A valid A100 40GB layout using all 7 compute slices and all 8 memory slices."""
PROFILES["a100-mig"] = replace(
    PROFILES["a100-pcie-2"],
    name="a100-mig",
    description="2 x A100 PCIe 40GB; GPU 0 in MIG mode (3g.20gb, 2g.10gb, 2 x 1g.5gb), GPU 1 whole",
    idle_gpus=frozenset(),
    mig_layout=((0, _A100_MIG_LAYOUT),),
    processes=(
        ProcessSpec(0, GHOST_PID_BASE + 200, memory_mib=14000, mig=0),
        ProcessSpec(0, GHOST_PID_BASE + 201, memory_mib=4096, mig=0),
        ProcessSpec(0, GHOST_PID_BASE + 210, memory_mib=8192, mig=1),
        ProcessSpec(0, GHOST_PID_BASE + 220, memory_mib=3000, mig=2),
        *ranks((1,)),
    ),
)


PROFILES["hgx-h100-hpc"] = replace(
    PROFILES["dgx-h100"],
    name="hgx-h100-hpc",
    description="HGX H100: 8 x H100 SXM running an FP64 simulation code on all GPUs; healthy",
    idle_gpus=frozenset(),
    scenario=Scenario(),
    decode_pct=(0.0, 0.0),
    math_mix=(0.55, 0.12, 0.0),
    processes=ranks(range(8)),
)


_H100_MIG_LAYOUT = (
    MigSpec("3g.40gb", gpu_instance_id=2, placement_start=4),
    MigSpec("2g.20gb", gpu_instance_id=3, placement_start=0),
    MigSpec("1g.10gb", gpu_instance_id=9, placement_start=2),
    MigSpec("1g.10gb", gpu_instance_id=10, placement_start=3),
)
"""A valid H100 80GB layout using all 7 compute slices and all 8 memory slices."""
PROFILES["h100-mig"] = replace(
    PROFILES["dgx-h100"],
    name="h100-mig",
    description="2 x H100 SXM 80GB; GPU 0 in MIG mode (3g.40gb, 2g.20gb, 2 x 1g.10gb) with GPM per instance",
    gpu_count=2,
    pci_locations=PROFILES["dgx-h100"].pci_locations[:2],
    numa_nodes=(0, 0),
    pcie_switches=(0, 1),
    gpm_supported=True,
    idle_gpus=frozenset(),
    scenario=Scenario(),
    decode_pct=(0.0, 0.0),
    mig_layout=((0, _H100_MIG_LAYOUT),),
    processes=(
        # Instance work (see fake.gpm): 3g.40gb 0.6 + 0.25 of the job, 2g.20gb 0.5, the first 1g.10gb all of it.
        ProcessSpec(0, GHOST_PID_BASE + 300, memory_mib=24000, sm_share=0.6, mig=0),
        ProcessSpec(0, GHOST_PID_BASE + 301, memory_mib=6144, sm_share=0.25, mig=0),
        ProcessSpec(0, GHOST_PID_BASE + 310, memory_mib=12288, sm_share=0.5, mig=1),
        ProcessSpec(0, GHOST_PID_BASE + 320, memory_mib=5000, sm_share=1.0, mig=2),
        *ranks((1,)),
    ),
)


def profile_names() -> list[str]:
    """Names accepted by ``--simulate``, sorted."""
    return sorted(PROFILES)


PROFILES["vgpu"] = replace(
    PROFILES["a100-pcie-2"],
    name="vgpu",
    description="2 x A100 PCIe 40GB shared as vGPU slices (HAMi, GPU-Manager): 2 processes on GPU 0, 1 on GPU 1",
    idle_gpus=frozenset(),
    processes=(
        ProcessSpec(0, GHOST_PID_BASE + 300, memory_mib=3000, sm_share=0.5),
        ProcessSpec(0, GHOST_PID_BASE + 301, memory_mib=1000, sm_share=0.2),
        ProcessSpec(1, GHOST_PID_BASE + 310, memory_mib=2048, sm_share=0.3),
    ),
)


TIMESLICED_SM_SHARES = (0.5, 0.3, 0.1)
"""The parts of GPU 0's work that each of the ``timesliced`` profile's three processes does."""
PROFILES["timesliced"] = replace(
    PROFILES["a100-pcie-2"],
    name="timesliced",
    description="2 x A100 PCIe 40GB shared: GPU 0 time-sliced by three processes (50 %, 30 %, 10 % of its work), "
    "GPU 1 serving two MPS clients",
    idle_gpus=frozenset(),
    processes=(
        *(ProcessSpec(0, GHOST_PID_BASE + 300 + n, memory_mib=mib, sm_share=share)
          for n, (share, mib) in enumerate(zip(TIMESLICED_SM_SHARES, (12000, 8000, 4000), strict=True))),
        # GPU 1: the MPS control daemon's server and two clients, each running most of the GPU's work at once.
        ProcessSpec(1, GHOST_PID_BASE + 310, memory_mib=32, sm_share=0.0),
        ProcessSpec(1, GHOST_PID_BASE + 311, ("compute", "mps"), memory_mib=6144, sm_share=0.7),
        ProcessSpec(1, GHOST_PID_BASE + 312, ("compute", "mps"), memory_mib=3072, sm_share=0.6),
    ),
)
