"""Turning level changes between readings into events: ECC increments, throttling episodes, link changes...

``EventDetector`` keeps what it saw per GPU, so it can debounce: a throttling episode ends only after its bit
stayed clear for ``settle_s``, and a counter that keeps rising gives one event per ``coalesce_s`` with the sum of
the increments. ``detect_events`` compares just two snapshots (no debouncing). Both are cheap enough for the
sampler thread: a few comparisons per GPU and per NVLink link.

The first reading of a GPU is a baseline and gives no events: the health status already shows its levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvdash.health.clock_events import GPU_IDLE, THERMAL, is_set, throttling_reasons
from nvdash.health.clock_events import SW_POWER_CAP as SW_POWER_CAP_BIT
from nvdash.sampling.records import GpuEvent, GpuInfo, GpuSample, Inventory, NvLinkSample, Snapshot

DEFAULT_SETTLE_S = 5.0
"""How long a throttling bit must stay clear before its episode counts as ended."""
DEFAULT_COALESCE_S = 60.0
"""After a counter's event, further increments within this time are summed into one later event."""
BUSY_UTIL_PCT = 10.0
"""Utilization at or above which a GPU counts as busy (an idle GPU may lower its PCIe generation)."""

INCREMENT_MARK = " rose by "
"""Every counter event's message reads ``<counter> rose by <n> (now <total>)``."""


def increment_subject(event: GpuEvent) -> str | None:
    """The counter a counter-increment event is about (``"corrected ECC errors"``), else ``None``."""
    return event.counter


def format_duration(seconds: float) -> str:
    """``"12 s"``, ``"3 min 5 s"``, ``"2 h 10 min"``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@dataclass(slots=True)
class _Episode:
    name: str
    start_s: float
    clear_since_s: float | None = None


@dataclass(frozen=True, slots=True)
class _Counter:
    subject: str
    kind: str
    severity: str


@dataclass(slots=True)
class _Pending:
    delta: int
    total: int
    counter: _Counter


@dataclass(slots=True)
class _GpuState:
    lost: bool = False
    error: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    last_emit_s: dict[str, float] = field(default_factory=dict)
    pending: dict[str, _Pending] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    episodes: dict[int, _Episode] = field(default_factory=dict)
    links: dict[int, bool] = field(default_factory=dict)
    ever_active: set[int] = field(default_factory=set)
    pcie_width: int | None = None
    pcie_gen_low: bool | None = None


@dataclass(slots=True)
class _Sweep:
    """One GPU's part of one observation: its state, its index, the time, and the events found."""

    state: _GpuState
    gpu: int
    now: float
    out: list[GpuEvent]

    def emit(self, kind: str, message: str, severity: str = "info", counter: str | None = None) -> None:
        self.out.append(GpuEvent(self.now, self.gpu, kind, message, severity, counter=counter))


_FLAGS: tuple[tuple[str, str, str, str, str], ...] = (
    # (field, kind, severity when set, message when set, message when cleared)
    ("remap_pending", "remap", "critical", "row remapping pending: reset the GPU", "row remapping no longer pending"),
    ("remap_failure", "remap", "critical", "row remapping failed: the GPU needs service",
     "row remapping failure cleared"),
    ("retired_pages_pending", "ecc", "warning", "page retirement pending: reset the GPU or reload the driver",
     "page retirement no longer pending"),
)

_COUNTERS: dict[str, _Counter] = {
    "ecc_corrected_volatile": _Counter("corrected ECC errors", "ecc", "warning"),
    "ecc_uncorrected_volatile": _Counter("uncorrectable ECC errors", "ecc", "critical"),
    "retired_pages_sbe": _Counter("pages retired for single-bit errors", "ecc", "warning"),
    "retired_pages_dbe": _Counter("pages retired for double-bit errors", "ecc", "critical"),
    "remapped_rows_corrected": _Counter("rows remapped for corrected errors", "remap", "warning"),
    "remapped_rows_uncorrected": _Counter("rows remapped for uncorrectable errors", "remap", "critical"),
    "pcie_replay_count": _Counter("PCIe replays", "pcie", "warning"),
}

_AGGREGATE_FALLBACKS: tuple[tuple[str, str], ...] = (
    # ECC aggregate counters stand in for the volatile ones on drivers that report only those.
    ("ecc_corrected_aggregate", "ecc_corrected_volatile"),
    ("ecc_uncorrected_aggregate", "ecc_uncorrected_volatile"),
)


def _crc(link: NvLinkSample) -> int | None:
    if link.crc_flit_errors is None and link.crc_data_errors is None:
        return None
    return (link.crc_flit_errors or 0) + (link.crc_data_errors or 0)


def _busy(sample: GpuSample) -> bool:
    if sample.utilization_pct is None or is_set(sample.clock_event_reasons, GPU_IDLE):
        return False
    return sample.utilization_pct >= BUSY_UTIL_PCT


class EventDetector:
    """Remembers each GPU's last readings and reports what changed; call ``observe`` once per sweep.

    Also callable as ``detector(previous, current)``, the sampler's event-deriver shape (it keeps its own
    history, so ``previous`` is not needed).
    """

    def __init__(
        self, inventory: Inventory, *, settle_s: float = DEFAULT_SETTLE_S, coalesce_s: float = DEFAULT_COALESCE_S
    ) -> None:
        self._infos: dict[int, GpuInfo] = {info.index: info for info in inventory.gpus}
        self._settle_s = settle_s
        self._coalesce_s = coalesce_s
        self._states: dict[int, _GpuState] = {}

    def __call__(self, _previous: Snapshot | None, current: Snapshot) -> list[GpuEvent]:
        return self.observe(current)

    def observe(self, snapshot: Snapshot) -> list[GpuEvent]:
        """The events between the last observed snapshot and ``snapshot``."""
        events: list[GpuEvent] = []
        for sample in snapshot.gpus:
            state = self._states.get(sample.index)
            baseline = state is None
            if state is None:
                state = self._states[sample.index] = _GpuState()
            sweep = _Sweep(state, sample.index, snapshot.time_s, [])
            self._gpu(sweep, sample)
            if not baseline:  # the first reading of a GPU only sets what later readings compare with
                events.extend(sweep.out)
        return events

    def _gpu(self, sweep: _Sweep, sample: GpuSample) -> None:
        state = sweep.state
        if sample.lost != state.lost:
            state.lost = sample.lost
            if sample.lost:
                sweep.emit("lost", "GPU lost: it stopped answering (fallen off the bus?)", "critical")
            else:
                sweep.emit("lost", "GPU answers again")
        if sample.lost:
            return
        if sample.error != state.error:
            if sample.error is not None:
                sweep.emit("health", f"reading failed: {sample.error}", "warning")
            state.error = sample.error
        info = self._infos.get(sample.index)
        self._flags(sweep, sample)
        self._counters(sweep, sample)
        self._throttling(sweep, sample)
        self._pcie(sweep, sample, info)
        self._nvlink(sweep, sample, info)
        self._flush(sweep)

    @staticmethod
    def _flags(sweep: _Sweep, sample: GpuSample) -> None:
        for name, kind, severity, set_text, clear_text in _FLAGS:
            value: bool | None = getattr(sample, name)
            if value is None:
                continue
            old = sweep.state.flags.get(name)
            sweep.state.flags[name] = value
            if old is not None and old != value:
                sweep.emit(kind, set_text if value else clear_text, severity if value else "info")

    def _counters(self, sweep: _Sweep, sample: GpuSample) -> None:
        for name, counter in _COUNTERS.items():
            self._count(sweep, name, counter, getattr(sample, name))
        for name, volatile in _AGGREGATE_FALLBACKS:
            silent = getattr(sample, volatile) is not None or volatile in sweep.state.counters
            self._count(sweep, name, _COUNTERS[volatile], getattr(sample, name), silent=silent)
        for link in sample.nvlinks:
            for key, value, what in (("crc", _crc(link), "CRC errors"), ("replay", link.replay_errors, "replays"),
                                     ("recovery", link.recovery_errors, "recoveries")):
                counter = _Counter(f"NVLink link {link.link} {what}", "link", "warning")
                self._count(sweep, f"nvlink{link.link}/{key}", counter, value)

    def _count(self, sweep: _Sweep, key: str, counter: _Counter, value: int | None, *, silent: bool = False) -> None:
        if value is None:
            return
        state = sweep.state
        old = state.counters.get(key)
        state.counters[key] = value
        if old is None or value <= old or silent:
            return  # a baseline, a reset counter (driver reload, GPU reset), or covered by another counter
        pending = state.pending.pop(key, None)
        delta = value - old + (pending.delta if pending is not None else 0)
        last = state.last_emit_s.get(key)
        if last is not None and sweep.now - last < self._coalesce_s:
            state.pending[key] = _Pending(delta, value, counter)
            return
        state.last_emit_s[key] = sweep.now
        sweep.emit(counter.kind, f"{counter.subject}{INCREMENT_MARK}{delta} (now {value})", counter.severity,
                   counter.subject)

    def _flush(self, sweep: _Sweep) -> None:
        """Report the increments held back once their counter's quiet time has passed."""
        state = sweep.state
        for key, pending in list(state.pending.items()):
            if sweep.now - state.last_emit_s.get(key, sweep.now) >= self._coalesce_s:
                del state.pending[key]
                state.last_emit_s[key] = sweep.now
                counter = pending.counter
                sweep.emit(counter.kind, f"{counter.subject}{INCREMENT_MARK}{pending.delta} (now {pending.total})",
                           counter.severity, counter.subject)

    def _throttling(self, sweep: _Sweep, sample: GpuSample) -> None:
        mask = sample.clock_event_reasons
        if mask is None:
            return
        episodes = sweep.state.episodes
        active = {reason.bit: reason.name for reason in throttling_reasons(mask)}
        for bit, name in active.items():
            episode = episodes.get(bit)
            if episode is not None:
                episode.clear_since_s = None
                continue
            episodes[bit] = _Episode(name, sweep.now)
            thermal = bit & THERMAL and sample.temperature_c is not None
            detail = f" at {sample.temperature_c:.0f} °C" if thermal else ""
            sweep.emit("throttle", f"{name} throttling started{detail}",
                       "info" if bit == SW_POWER_CAP_BIT else "warning")
        for bit, episode in list(episodes.items()):
            if bit in active:
                continue
            if episode.clear_since_s is None:
                episode.clear_since_s = sweep.now
            if sweep.now - episode.clear_since_s >= self._settle_s:
                del episodes[bit]
                took = format_duration(episode.clear_since_s - episode.start_s)
                sweep.emit("throttle", f"{episode.name} throttling ended after {took}")

    @staticmethod
    def _pcie(sweep: _Sweep, sample: GpuSample, info: GpuInfo | None) -> None:
        state = sweep.state
        width = sample.pcie_width_current
        max_width = None if info is None else info.pcie_width
        if width is not None:
            old, state.pcie_width = state.pcie_width, width
            if old is not None and width < old:
                narrow = max_width is None or width < max_width
                limit = f" (max x{max_width})" if max_width is not None else ""
                sweep.emit("pcie", f"PCIe link width dropped from x{old} to x{width}{limit}",
                           "warning" if narrow else "info")
            elif old is not None and width > old:
                sweep.emit("pcie", f"PCIe link width back up from x{old} to x{width}")
        gen = sample.pcie_generation_current
        max_gen = None if info is None else info.pcie_generation
        if gen is None or max_gen is None or not _busy(sample):
            return  # an idle GPU may lower its link generation to save power: not an event
        low = gen < max_gen
        old_low, state.pcie_gen_low = state.pcie_gen_low, low
        if old_low is None or old_low == low:
            return
        if low:
            sweep.emit("pcie", f"PCIe link running at Gen{gen} while busy (max Gen{max_gen})", "warning")
        else:
            sweep.emit("pcie", f"PCIe link back at Gen{gen}")

    @staticmethod
    def _nvlink(sweep: _Sweep, sample: GpuSample, info: GpuInfo | None) -> None:
        state = sweep.state
        has_nvlink = info is not None and info.nvlink_links > 0
        for link in sample.nvlinks:
            if link.active is None:
                continue
            old = state.links.get(link.link)
            state.links[link.link] = link.active
            # NVLink reads as down on PCIe cards without bridges: only links that were ever up matter.
            tracked = has_nvlink or link.link in state.ever_active
            if link.active:
                state.ever_active.add(link.link)
            if old is None or old == link.active or not tracked:
                continue
            if link.active:
                sweep.emit("link", f"NVLink link {link.link} is up again")
            else:
                sweep.emit("link", f"NVLink link {link.link} went down", "warning")


def detect_events(inventory: Inventory, previous: Snapshot | None, current: Snapshot) -> list[GpuEvent]:
    """The events between two snapshots (none without a previous one), with no debouncing.

    For a long-running sampler prefer one ``EventDetector`` (it debounces episodes and coalesces counters).
    """
    if previous is None:
        return []
    detector = EventDetector(inventory, settle_s=0.0, coalesce_s=0.0)
    detector.observe(previous)
    return detector.observe(current)
