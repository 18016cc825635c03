"""The simulated processes on each GPU: their memory and the driver's per-process utilization sample buffer."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from .liveness import ProcessLiveness
from .process_file import NO_ITEMS, ProcessFile
from .profiles import Profile
from .usage_specs import MIG_EMPTY_INSTANCE_MIB, ProcessSpec
from .workload import Workload

_MIB = 1024 * 1024
SAMPLE_PERIOD_S = 0.2
"""How often the simulated driver samples per-process utilization."""
SAMPLE_BUFFER_S = 10.0
"""How far back the driver's sample buffer reaches."""
GARBAGE_SM_PCT = 37_100


@dataclass(frozen=True)
class UtilizationSample:
    """One ``nvmlProcessUtilizationSample_t``: pid, CPU timestamp in microseconds, and four percentages."""

    pid: int
    timestamp_us: int
    sm: int
    memory: int
    encoder: int
    decoder: int


class ProcessTable:
    """The processes of one simulated machine: the profile's own, those a test adds, and those a process file lists
    (thread-safe).

    Host processes listed by fault items (``watch``) or by the process file stop being listed once they exit, as
    the driver stops listing them (see :mod:`.liveness`); those a test adds stay until it removes them.
    """

    def __init__(self, profile: Profile, workload: Workload, created_at: float) -> None:
        self._profile = profile
        self._workload = workload
        self._created_at = created_at
        self._lock = threading.Lock()
        self._specs: list[ProcessSpec] = list(profile.processes)
        self._own = frozenset(profile.processes)
        self._watched: frozenset[ProcessSpec] = frozenset()
        self._liveness: ProcessLiveness | None = None
        self._file: ProcessFile | None = None

    def follow(self, liveness: ProcessLiveness | None, process_file: ProcessFile | None = None) -> None:
        """Drop watched processes once ``liveness`` says they exited, and list what ``process_file`` lists."""
        with self._lock:
            self._liveness = liveness
            self._file = process_file

    def add(self, spec: ProcessSpec, *, watch: bool = False) -> None:
        """Start listing ``spec`` (replacing any process with the same PID on the same GPU); ``watch``: until it
        exits (a host process a fault item lists)."""
        with self._lock:
            self._specs = [s for s in self._specs if (s.pid, s.gpu) != (spec.pid, spec.gpu)] + [spec]
            self._watched = (self._watched | {spec}) if watch else (self._watched - {spec})

    def remove(self, pid: int) -> bool:
        """Stop listing ``pid`` on every GPU; False if it was not listed."""
        with self._lock:
            kept = [s for s in self._specs if s.pid != pid]
            removed = len(kept) != len(self._specs)
            self._specs = kept
        return removed

    def clear_own(self, gpu: int) -> None:
        """Stop listing the profile's own processes on ``gpu`` (those added stay)."""
        own = set(self._profile.processes)
        with self._lock:
            self._specs = [s for s in self._specs if s.gpu != gpu or s not in own]

    def on_gpu(self, gpu: int) -> list[ProcessSpec]:
        """The processes on ``gpu`` now (a copy)."""
        return [s for s in self._listed() if s.gpu == gpu]

    def _listed(self) -> list[ProcessSpec]:
        """Every process listed now: the table's and the process file's, less the watched ones that exited."""
        with self._lock:
            specs, watched, liveness, process_file = self._specs, self._watched, self._liveness, self._file
        items = process_file.items() if process_file is not None else NO_ITEMS
        if items.processes or items.cleared:
            replaced = {(s.pid, s.gpu) for s in items.processes}
            specs = [s for s in specs
                     if (s.pid, s.gpu) not in replaced and not (s.gpu in items.cleared and s in self._own)]
            specs += items.processes
            watched = watched | set(items.processes)
        if liveness is None or not watched:
            return list(specs)
        return [s for s in specs if s not in watched or not liveness.exited(s.pid)]

    def fixed_bytes(self, gpu: int, mig: int | None = None) -> int:
        """Memory held by fixed-size processes on ``gpu`` (or in one of its MIG instances)."""
        return sum(s.memory_mib * _MIB for s in self.on_gpu(gpu) if mig is None or s.mig == mig)

    def memory_bytes(self, spec: ProcessSpec, t: float) -> int:
        """What ``usedGpuMemory`` reports for ``spec`` at ``t`` s: a fixed size, or its share of the job's memory."""
        if spec.memory_share <= 0:
            return spec.memory_mib * _MIB
        job = self._workload.memory_used_bytes(spec.gpu, t) - self._profile.memory_reserved_bytes
        return int(spec.memory_share * job) // _MIB * _MIB + spec.memory_mib * _MIB

    def mig_used_bytes(self, gpu: int, mig: int) -> int:
        """Memory used in one MIG instance: its own context plus its processes."""
        return MIG_EMPTY_INSTANCE_MIB * _MIB + self.fixed_bytes(gpu, mig)

    def utilization_samples(self, gpu: int, now: float, last_seen_us: int) -> list[UtilizationSample]:
        """The buffered samples newer than ``last_seen_us`` (0: the whole buffer), oldest first.

        Like the driver, one sample per process per sample period, only where the process had non-zero
        utilization in that period; graphics-only processes are not sampled.
        """
        specs = [s for s in self.on_gpu(gpu) if "compute" in s.kinds or "mps" in s.kinds]
        if not specs:
            return []
        first = max(math.ceil((now - SAMPLE_BUFFER_S) / SAMPLE_PERIOD_S), math.ceil(self._created_at / SAMPLE_PERIOD_S))
        last = math.floor(now / SAMPLE_PERIOD_S)
        samples: list[UtilizationSample] = []
        for k in range(first, last + 1):
            timestamp_us = round(k * SAMPLE_PERIOD_S * 1e6)
            if timestamp_us <= last_seen_us:
                continue
            gpu_pct, memory_pct = self._workload.utilization(gpu, k * SAMPLE_PERIOD_S - self._created_at)
            for spec in specs:
                if not spec.busy_at(k * SAMPLE_PERIOD_S - self._created_at):
                    continue
                sm, memory = round(gpu_pct * spec.sm_share), round(memory_pct * spec.sm_share)
                if sm == 0 and memory == 0:
                    continue
                if spec.garbage_every and k % spec.garbage_every == 0:
                    sm = GARBAGE_SM_PCT
                samples.append(UtilizationSample(spec.pid, timestamp_us, sm, memory, 0, 0))
        return samples
