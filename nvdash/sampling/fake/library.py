"""``FakeNvmlLibrary``: stands in for libnvidia-ml under the real pynvml (``pynvml.nvmlLib``).

pynvml looks each C function up by name with ``getattr`` and calls it with ctypes arguments, so this
object's attributes are callables following the C signatures. A name it lacks raises AttributeError,
which pynvml turns into ``NVMLError_FunctionNotFound``, as with an old driver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from . import constants as c
from .cargs import as_int
from .driver import Call, FakeDriver
from .faults import Fault, FaultState, MigSupport, check_device, check_function, parse_faults
from .listed_processes import parse_clear, parse_process
from .liveness import ProcessLiveness
from .process_file import ProcessFile
from .profiles import PROFILES, Profile, profile_names
from .usage_driver import MIG_HANDLE_FUNCTIONS
from .usage_specs import ProcessSpec
from .workload import Workload

_INIT_FUNCTIONS = frozenset({"nvmlInitWithFlags", "nvmlInit_v2"})
ENTRY_POINTS_SINCE: dict[str, int] = {"nvmlDeviceGetTemperatureV": 565}
"""Entry points by the driver branch that introduced them: a profile with an older driver lacks them, and pynvml
raises ``NVMLError_FunctionNotFound`` as with a real old driver."""


def driver_branch(version: str) -> int:
    """The branch (major number) of a driver version such as ``"550.54.15"``; 0 when it has none."""
    major = version.split(".", 1)[0]
    return int(major) if major.isdigit() else 0
_ERROR_LATENCY_S = 5e-6


class EntryPoint:
    """One C function of the library: an object (not a method) so pynvml can set ``restype`` on it."""

    def __init__(self, name: str, dispatch: Callable[[str, tuple[object, ...]], int | bytes]) -> None:
        self.__name__ = name
        self._dispatch = dispatch

    def __call__(self, *args: object) -> int | bytes:
        return self._dispatch(self.__name__, args)

    def __repr__(self) -> str:
        return f"<fake NVML function {self.__name__}>"


class FakeNvmlLibrary:
    """Fake GPUs of one profile, driven by a seeded workload, with injectable faults and call counts.

    ``clock`` gives seconds (default ``time.time``); the workload's time is the clock minus its reading at
    construction. ``latency_scale`` multiplies every modelled call latency (0: no sleeping at all).
    ``process_file``: the path of a process file to follow (see :mod:`.process_file`); ``proc_root``: where host
    processes are looked up, to stop listing those that exited (see :mod:`.liveness`).
    """

    def __init__(
        self,
        profile: str | Profile,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        latency_scale: float = 1.0,
        *,
        process_file: str | None = None,
        proc_root: str = "/proc",
    ) -> None:
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise ValueError(f"unknown profile {profile!r}; known profiles: {', '.join(profile_names())}")
            profile = PROFILES[profile]
        if not latency_scale >= 0:
            raise ValueError(f"latency_scale must be >= 0, got {latency_scale}")
        self._clock = clock
        self._latency_scale = latency_scale
        self._created_at = clock()
        self._driver = FakeDriver(profile, seed, self._created_at, clock)
        branch = driver_branch(profile.driver_version)
        self._specs = {
            name: spec for name, spec in self._driver.specs().items() if ENTRY_POINTS_SINCE.get(name, 0) <= branch
        }
        self._entry_points = {name: EntryPoint(name, self._dispatch) for name in self._specs}
        self._lock = threading.Lock()
        self._init_count = 0
        self._faults = FaultState()
        self._counts: dict[str, int] = {}
        self._host_hangs: list[Fault] = []
        self.seed = seed
        followed = None if process_file is None else ProcessFile(process_file, self._parse_listed_item, clock)
        self._driver.usage.processes.follow(ProcessLiveness(proc_root, clock), followed)

    def __getattr__(self, name: str) -> EntryPoint:
        entry_points: dict[str, EntryPoint] | None = self.__dict__.get("_entry_points")
        if entry_points is None or name not in entry_points:
            raise AttributeError(f"fake NVML has no function {name!r}")
        return entry_points[name]

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._entry_points]

    @property
    def profile(self) -> Profile:
        """The simulated machine."""
        return self._driver.profile

    @property
    def workload(self) -> Workload:
        """The workload behind every reading; its time is seconds since ``created_at``."""
        return self._driver.workload

    @property
    def created_at(self) -> float:
        """The clock's reading when the library was created: time 0 of the workload and of faults."""
        return self._created_at

    def function_names(self) -> list[str]:
        """The C entry points this fake implements."""
        return sorted(self._specs)

    # Faults

    def fail_init(self, code: int) -> None:
        """Make ``nvmlInitWithFlags``/``nvmlInit_v2`` return ``code`` (0 lets them succeed again)."""
        with self._lock:
            self._faults.init_code = code

    def not_supported(self, function: str, device: int | None = None) -> None:
        """Make ``function`` answer NVML_ERROR_NOT_SUPPORTED on ``device`` (None: on every device)."""
        self._add(Fault("unsupported", function=check_function(function, self._specs), device=self._device(device)))

    def lose_gpu(self, device: int) -> None:
        """From now on every call on ``device`` answers NVML_ERROR_GPU_IS_LOST; event sets get XID 79."""
        self._add(Fault("lose", device=self._device(device)))

    def xid(self, code: int, device: int) -> None:
        """Send XID ``code`` on ``device`` now, with its side effects (see ``faults.parse_faults``)."""
        self._add(Fault("xid", code=code, device=self._device(device)))

    def slow(self, function: str, seconds: float, device: int | None = None) -> None:
        """Make ``function`` take ``seconds`` (not scaled by ``latency_scale``) on ``device`` or on all."""
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        function = check_function(function, self._specs)
        self._add(Fault("slow", function=function, seconds=seconds, device=self._device(device)))

    def drop_fields(self, field_ids: Iterable[int]) -> None:
        """Make ``nvmlDeviceGetFieldValues`` answer these field ids NOT_SUPPORTED, as a driver without them does."""
        with self._lock:
            self._driver.unanswered_fields.update(field_ids)

    def wrap_pcie_counters(self, at_s: float, bits: int = 32) -> None:
        """Make the PCIe byte counters count modulo ``2**bits`` and wrap to 0 at ``at_s`` s after start."""
        self._driver.counters.wrap_pcie(at_s, bits)

    def reload_driver(self, at_s: float) -> None:
        """The driver reloads at ``at_s`` s after start: the PCIe byte and energy counters start over from 0."""
        self._driver.counters.reload(at_s)

    def set_mig_mode(self, gpu: int, enabled: bool) -> None:
        """Turn MIG mode on (with the profile's layout for ``gpu``) or off, now; MIG device handles of a GPU with MIG
        off are no longer valid."""
        self._driver.usage.mig.set_enabled(check_device(gpu, self.profile.gpu_count), enabled)

    def event_wait_returns_at_once(self, at_once: bool = True) -> None:
        """Make ``nvmlEventSetWait_v2`` answer NVML_ERROR_TIMEOUT at once when no event is due (a driver whose
        wait does not block); ``False`` restores the documented blocking wait."""
        self._driver.events.blocking = not at_once

    def apply_faults(self, spec: str) -> None:
        """Apply a compact fault spec (see ``faults.parse_faults``); items with ``@T`` wait until T s after start."""
        faults = parse_faults(spec, self._specs, self.profile.gpu_count, self._mig_support())
        for fault in faults:
            self._add(fault)

    def _mig_support(self) -> MigSupport:
        profile = self.profile
        return MigSupport(profile.name, profile.mig_capable, frozenset(gpu for gpu, _ in profile.mig_layout),
                          tuple((gpu, len(layout)) for gpu, layout in profile.mig_layout))

    def _parse_listed_item(self, item: str) -> ProcessSpec | int:
        """The process of a process file's ``process`` item, or the GPU of its ``clear_processes`` item."""
        kind, *params = (part.strip() for part in item.split(":"))
        if kind == "process":
            return parse_process(params, self.profile.gpu_count, dict(self._mig_support().instances))
        if kind == "clear_processes":
            return parse_clear(params, self.profile.gpu_count)
        raise ValueError("a process file holds only process:UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]] "
                         "and clear_processes:GPU items")

    def host_hangs(self) -> list[Fault]:
        """The ``hang_host`` faults applied: the host reading's to enact (see :mod:`nvdash.sampling.fake.host`)."""
        return list(self._host_hangs)

    def _device(self, device: int | None) -> int | None:
        return None if device is None else check_device(device, self.profile.gpu_count)

    def _add(self, fault: Fault) -> None:
        elapsed = self._clock() - self._created_at
        if fault.device is not None and fault.kind == "name":
            self._driver.names[fault.device] = fault.text
            return
        if fault.process is not None:
            self._driver.usage.processes.add(fault.process, watch=True)
            return
        if fault.device is not None and fault.kind == "clear_processes":
            self._driver.usage.processes.clear_own(fault.device)
            return
        if fault.device is not None and fault.kind in ("xid", "lose"):
            xid = fault.code if fault.kind == "xid" else c.XID_FALLEN_OFF_BUS
            self._driver.inject_xid(fault.device, xid, max(fault.at_s, elapsed))
        if fault.kind == "pcie_wrap":
            self.wrap_pcie_counters(fault.at_s, fault.code)
            return
        if fault.kind == "driver_reload":
            self.reload_driver(fault.at_s)
            return
        if fault.kind == "hang_host":
            self._host_hangs.append(fault)
        elif fault.kind != "xid":
            with self._lock:
                self._faults.add(fault, elapsed)

    # Processes

    def add_process(
        self,
        gpu: int,
        pid: int,
        *,
        kinds: tuple[str, ...] = ("compute",),
        memory_mib: int = 256,
        sm_share: float = 0.0,
        mig: int | None = None,
    ) -> None:
        """List ``pid`` on ``gpu`` from now on (e.g. a real child process a test started)."""
        gpu = check_device(gpu, self.profile.gpu_count)
        if mig is not None and not 0 <= mig < len(self._driver.usage.mig.layout(gpu)):
            raise ValueError(f"GPU {gpu} has no MIG instance {mig}")
        spec = ProcessSpec(gpu, pid, kinds, memory_mib=memory_mib, sm_share=sm_share, mig=mig)
        self._driver.usage.processes.add(spec)

    def run_unprivileged(self) -> None:
        """Answer as NVML answers a non-root caller (see ``UsageFunctions.privileged``)."""
        self._driver.usage.privileged = False

    def remove_process(self, pid: int) -> bool:
        """Stop listing ``pid`` (it exited); False if it was not listed."""
        return self._driver.usage.processes.remove(pid)

    # Accounting

    def call_counts(self) -> dict[str, int]:
        """Calls per entry point so far, failing ones included (a copy)."""
        with self._lock:
            return dict(self._counts)

    def total_calls(self) -> int:
        """All entry-point calls so far."""
        with self._lock:
            return sum(self._counts.values())

    def reset_counts(self) -> None:
        """Start counting from zero."""
        with self._lock:
            self._counts.clear()

    # Dispatch

    def _dispatch(self, name: str, args: tuple[object, ...]) -> int | bytes:
        spec = self._specs[name]
        now = self._clock()
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1
            self._faults.apply_due(now - self._created_at)
            for gpu, enabled in self._faults.take_mig_changes():
                self._driver.usage.mig.set_enabled(gpu, enabled)
            device, code = self._admit(name, spec.device, args)
            slow = self._faults.slow_s(name, None if device < 0 else device)
        if slow is not None:
            latency = slow
        else:
            latency = (spec.latency_s(args) if code == c.NVML_SUCCESS else _ERROR_LATENCY_S) * self._latency_scale
        if latency > 0:
            time.sleep(latency)
        if name == "nvmlErrorString":
            return c.ERROR_STRINGS.get(as_int(args[0]), "Unknown Error").encode()
        if code != c.NVML_SUCCESS:
            return code
        code = spec.run(Call(device, self._clock()), *args)
        if name in _INIT_FUNCTIONS and code == c.NVML_SUCCESS:
            with self._lock:
                self._init_count += 1
        return code

    def _admit(self, name: str, device_kind: str | None, args: tuple[object, ...]) -> tuple[int, int]:
        """(device index or -1, the return code the call ends with unless it is NVML_SUCCESS). Locked."""
        if name in _INIT_FUNCTIONS:
            return -1, self._faults.init_code or c.NVML_SUCCESS
        if name == "nvmlErrorString":
            return -1, c.NVML_SUCCESS
        if self._init_count == 0:
            return -1, c.NVML_ERROR_UNINITIALIZED
        if name == "nvmlShutdown":
            self._init_count -= 1
            return -1, c.NVML_SUCCESS
        device: int | None = -1
        if device_kind == "index":
            index = as_int(args[0])
            device = index if 0 <= index < self.profile.gpu_count else None
        elif device_kind == "handle":
            device = self._driver.device_of(args[0])
            if device is not None and name not in MIG_HANDLE_FUNCTIONS and self._driver.is_mig_handle(args[0]):
                return device, c.NVML_ERROR_NOT_SUPPORTED
        if device is None:
            return -1, c.NVML_ERROR_INVALID_ARGUMENT
        if device >= 0 and self._faults.is_lost(device):
            return device, c.NVML_ERROR_GPU_IS_LOST
        scoped = None if device < 0 else device
        if name in self.profile.unsupported or self._faults.is_unsupported(name, scoped):
            return device, c.NVML_ERROR_NOT_SUPPORTED
        return device, c.NVML_SUCCESS
