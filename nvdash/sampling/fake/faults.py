"""Injected faults: their compact text form (for an environment variable) and the set in force."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from .listed_processes import parse_clear, parse_process
from .usage_specs import ProcessSpec

_MAX_XID = 1000
FaultKind = Literal[
    "lose", "slow", "unsupported", "fail_init", "xid", "hang_host", "name", "process",
    "pcie_wrap", "driver_reload", "mig", "clear_processes",
]
PCIE_WRAP_BITS = 32
"""The width ``pcie_wrap`` wraps the PCIe byte counters at unless told (the hardware counter on some GPUs)."""
PCIE_WRAP_BITS_RANGE = (8, 64)
NAME_LIMIT = 95
"""The longest product name NVML returns (its name buffer holds 96 bytes with the terminating NUL)."""

SPEC_SYNTAX = (
    "expected ITEM[;ITEM...], each ITEM one of lose:DEVICE, slow:FUNCTION:SECONDS[:DEVICE], "
    "unsupported:FUNCTION[:DEVICE], fail_init:CODE, xid:CODE:DEVICE, hang_host:PATH, name:DEVICE:TEXT "
    "(percent-encoded), process:UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]], clear_processes:DEVICE, "
    "pcie_wrap[:BITS], driver_reload or mig:DEVICE:on|off, optionally "
    "followed by @SECONDS after start (process: its work starts then; name and clear_processes: from the start)"
)


@dataclass(frozen=True)
class MigSupport:
    """What ``mig:DEVICE:on|off`` may ask of a profile: whether its GPUs support MIG and which have a MIG layout."""

    profile: str
    capable: bool
    layouts: frozenset[int] = frozenset()
    instances: tuple[tuple[int, int], ...] = ()
    """(GPU, number of MIG instances of its layout) for each GPU with a layout."""


@dataclass(frozen=True)
class Fault:
    """One fault; ``device`` None means every device. ``at_s``: seconds after the library was created.

    ``code`` is the NVML return code of ``fail_init``, the XID of ``xid`` and the PID of ``process``; ``path`` is
    the file whose existence holds a ``hang_host``.
    """

    kind: FaultKind
    function: str | None = None
    device: int | None = None
    seconds: float = 0.0
    code: int = 0
    at_s: float = 0.0
    path: str | None = None
    text: str = ""
    """The product name of ``name``."""
    enabled: bool = False
    """The MIG mode ``mig`` turns to."""
    process: ProcessSpec | None = None
    """The process ``process`` lists (see :mod:`.listed_processes`)."""


def check_function(function: str, functions: Collection[str]) -> str:
    """``function`` if the fake implements it, else ValueError (catches typos in fault specs)."""
    if function not in functions:
        raise ValueError(f"unknown NVML function {function!r}")
    return function


def check_device(device: int, gpu_count: int) -> int:
    """``device`` if it is a valid index, else ValueError."""
    if not 0 <= device < gpu_count:
        raise ValueError(f"device {device} out of range: the profile has {gpu_count} GPU(s)")
    return device


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} {text!r} must be a finite number >= 0")
    return value


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not an integer") from None


def _mig(params: list[str], gpu_count: int, mig: MigSupport | None, at_s: float) -> Fault:
    device = check_device(_integer(params[0], "device"), gpu_count)
    if params[1] not in ("on", "off"):
        raise ValueError(f"MIG mode {params[1]!r} must be on or off")
    enabled = params[1] == "on"
    if mig is None or not mig.capable:
        name = "this profile" if mig is None else f"profile {mig.profile!r}"
        raise ValueError(f"{name} has GPUs without MIG support")
    if enabled and device not in mig.layouts:
        raise ValueError(f"profile {mig.profile!r} has no MIG layout for GPU {device} to turn on")
    return Fault("mig", device=device, enabled=enabled, at_s=at_s)


def _pcie_wrap(params: list[str], at_s: float) -> Fault:
    bits = _integer(params[0], "bits") if params else PCIE_WRAP_BITS
    low, high = PCIE_WRAP_BITS_RANGE
    if not low <= bits <= high:
        raise ValueError(f"bits {bits} must be {low} to {high}")
    return Fault("pcie_wrap", code=bits, at_s=at_s)


def _parse_item(item: str, functions: Collection[str], gpu_count: int, mig: MigSupport | None = None) -> Fault:
    body, at_sign, at_text = item.partition("@")
    at_s = _number(at_text.strip(), "time") if at_sign else 0.0
    kind, *params = (part.strip() for part in body.split(":"))
    if kind == "hang_host":
        path = body.partition(":")[2].strip()
        if not path:
            raise ValueError("hang_host needs the path of the file that holds the hang")
        return Fault("hang_host", path=path, at_s=at_s)
    if kind == "lose" and len(params) == 1:
        return Fault("lose", device=check_device(_integer(params[0], "device"), gpu_count), at_s=at_s)
    if kind == "slow" and len(params) in (2, 3):
        device = check_device(_integer(params[2], "device"), gpu_count) if len(params) == 3 else None
        return Fault(
            "slow",
            function=check_function(params[0], functions),
            seconds=_number(params[1], "seconds"),
            device=device,
            at_s=at_s,
        )
    if kind == "unsupported" and len(params) in (1, 2):
        device = check_device(_integer(params[1], "device"), gpu_count) if len(params) == 2 else None
        return Fault("unsupported", function=check_function(params[0], functions), device=device, at_s=at_s)
    if kind == "fail_init" and len(params) == 1:
        code = _integer(params[0], "code")
        if code <= 0:
            raise ValueError(f"code {code} must be a positive NVML error code")
        return Fault("fail_init", code=code, at_s=at_s)
    if kind == "xid" and len(params) == 2:
        code = _integer(params[0], "XID")
        if not 0 < code < _MAX_XID:
            raise ValueError(f"XID {code} must be between 1 and {_MAX_XID - 1}")
        return Fault("xid", code=code, device=check_device(_integer(params[1], "device"), gpu_count), at_s=at_s)
    if kind == "pcie_wrap" and len(params) <= 1:
        return _pcie_wrap(params, at_s)
    if kind == "driver_reload" and not params:
        return Fault("driver_reload", at_s=at_s)
    if kind == "mig" and len(params) == 2:
        return _mig(params, gpu_count, mig, at_s)
    if kind in ("name", "clear_processes") and at_sign:
        raise ValueError(f"{kind} applies from the start: it takes no @SECONDS")
    if kind == "name" and len(params) == 2:
        text = unquote(params[1], errors="strict")
        if not 0 < len(text.encode()) <= NAME_LIMIT:
            raise ValueError(f"a name must be 1 to {NAME_LIMIT} bytes once decoded")
        return Fault("name", device=check_device(_integer(params[0], "device"), gpu_count), text=text)
    if kind == "process":
        spec = parse_process(params, gpu_count, dict(mig.instances) if mig is not None else {}, busy_from_s=at_s)
        return Fault("process", code=spec.pid, device=spec.gpu, process=spec)
    if kind == "clear_processes":
        return Fault("clear_processes", device=parse_clear(params, gpu_count))
    raise ValueError("unknown fault or wrong number of fields")


_COUNTER_FAULTS = ("pcie_wrap", "driver_reload")


def _check_counter_faults(fault: Fault, earlier: list[Fault]) -> None:
    """The simulated counters hold one wrap or one reload (a wrapped counter does not restart): refuse a second."""
    if fault.kind not in _COUNTER_FAULTS:
        return
    for other in earlier:
        if other.kind == fault.kind:
            raise ValueError(f"only one {fault.kind} per spec")
        if other.kind in _COUNTER_FAULTS:
            raise ValueError("pcie_wrap and driver_reload cannot be combined")


def parse_faults(
    spec: str, functions: Collection[str], gpu_count: int, mig: MigSupport | None = None
) -> list[Fault]:
    """Parse e.g. ``"lose:3@5;slow:nvmlDeviceGetUtilizationRates:2@0;unsupported:nvmlDeviceGetPowerUsage"``.

    ``xid:CODE:DEVICE`` sends XID ``CODE`` to the event sets registered for ``DEVICE`` (with the counter
    changes a real driver shows for 48, 63, 64, 94 and 95); ``lose:DEVICE`` also sends XID 79. ``hang_host:PATH``
    makes the host reading, on the sampler's own thread, block while the file ``PATH`` exists (a stuck sampler:
    NVML calls run in a pool and cannot stall the sweeps); ``PATH`` may not hold ``;`` or ``@``.
    ``name:DEVICE:TEXT`` makes ``DEVICE`` report the percent-decoded TEXT as its product name, and
    ``process:DEVICE:PID`` lists the (real, host-visible) process PID on it: tests feed odd or hostile text
    through them (names with markup, a started process's command line) to a server they run as a subprocess;
    ``process`` also takes an SM share, memory, kinds and a MIG instance, and ``clear_processes:DEVICE`` removes the
    profile's own processes (see :mod:`.listed_processes`).
    ``pcie_wrap[:BITS]`` makes the PCIe byte counters count modulo ``2**BITS`` (default 32) from 0 at ``@SECONDS``
    (so they wrap every ``2**BITS`` bytes moved); ``driver_reload`` reloads the driver at ``@SECONDS`` (the PCIe byte
    and energy counters start over from 0); ``mig:DEVICE:on|off`` turns ``DEVICE``'s MIG mode on (with the profile's
    layout for it) or off, on a profile ``mig`` says supports MIG. A spec holds at most one of ``pcie_wrap`` and
    ``driver_reload``.

    Raises ValueError with a one-line message naming the bad item; nothing is applied then.
    """
    faults: list[Fault] = []
    for raw in spec.split(";"):
        item = raw.strip()
        if not item:
            continue
        try:
            fault = _parse_item(item, functions, gpu_count, mig)
            _check_counter_faults(fault, faults)
        except ValueError as error:
            raise ValueError(f"bad NVML fault {item!r}: {error}; {SPEC_SYNTAX}") from None
        faults.append(fault)
    return faults


class FaultState:
    """The faults in force and those scheduled for later. Not locked: its owner serialises access."""

    def __init__(self) -> None:
        self.init_code = 0
        self._lost: set[int] = set()
        self._unsupported: set[tuple[str, int | None]] = set()
        self._slow: dict[tuple[str, int | None], float] = {}
        self._pending: list[Fault] = []
        self._mig_changes: list[tuple[int, bool]] = []

    def add(self, fault: Fault, elapsed_s: float) -> None:
        """Put ``fault`` in force now if its time has come, else keep it until ``apply_due`` sees it has."""
        if fault.at_s <= elapsed_s:
            self._apply(fault)
        else:
            self._pending.append(fault)

    def apply_due(self, elapsed_s: float) -> None:
        """Put in force every scheduled fault whose time is at or before ``elapsed_s``."""
        if not self._pending:
            return
        due = [fault for fault in self._pending if fault.at_s <= elapsed_s]
        self._pending = [fault for fault in self._pending if fault.at_s > elapsed_s]
        for fault in sorted(due, key=lambda fault: fault.at_s):
            self._apply(fault)

    def _apply(self, fault: Fault) -> None:
        if fault.kind == "lose" and fault.device is not None:
            self._lost.add(fault.device)
        elif fault.kind == "unsupported" and fault.function is not None:
            self._unsupported.add((fault.function, fault.device))
        elif fault.kind == "slow" and fault.function is not None:
            self._slow[(fault.function, fault.device)] = fault.seconds
        elif fault.kind == "fail_init":
            self.init_code = fault.code
        elif fault.kind == "mig" and fault.device is not None:
            self._mig_changes.append((fault.device, fault.enabled))
        # "xid" faults are events, delivered by the driver's event sets; "hang_host" is the host reading's (see
        # nvdash.sampling.fake.host); "name", "process", "clear_processes", "pcie_wrap" and
        # "driver_reload" change the driver.

    def take_mig_changes(self) -> list[tuple[int, bool]]:
        """The (GPU, MIG mode) changes come due since the last call, in their order, for the owner to make."""
        changes, self._mig_changes = self._mig_changes, []
        return changes

    def is_lost(self, device: int | None) -> bool:
        """Whether ``device`` has fallen off the bus."""
        return device in self._lost

    def is_unsupported(self, function: str, device: int | None) -> bool:
        """Whether ``function`` was made to answer NOT_SUPPORTED on ``device`` (or on every device)."""
        return (function, None) in self._unsupported or (function, device) in self._unsupported

    def slow_s(self, function: str, device: int | None) -> float | None:
        """The injected duration of ``function`` on ``device``, the device's own setting first."""
        return self._slow.get((function, device), self._slow.get((function, None)))
