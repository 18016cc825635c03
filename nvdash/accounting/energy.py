"""Energy from NVML's energy counter, not from power x time.

``nvmlDeviceGetTotalEnergyConsumption`` gives the millijoules a GPU has used since the driver was last loaded: a
counter that only grows, and starts again from zero when the driver is reloaded (or the GPU reset). The energy
between two readings is their difference; a reading below the one before it means the counter started again,
and the energy since then is the new reading itself. A GPU in MIG mode has one counter: every instance reports
the whole GPU's, so energy is taken per GPU, once, and only then shared among the instances' owners.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MJ_PER_J = 1000


def interval_energy_mj(before: int | None, after: int | None) -> int | None:
    """Millijoules used between two readings of the counter; ``None`` when either is unknown."""
    if before is None or after is None:
        return None
    if after < before:  # the driver was reloaded: the counter started again from zero
        return after
    return after - before


def interval_energies_mj(readings: Iterable[int | None]) -> Iterator[int | None]:
    """The energy of each interval between consecutive readings (one fewer than the readings).

    An unknown reading (the GPU lost, the counter unsupported) makes the intervals on both sides of it unknown;
    the counter's next known reading is not compared across it, as the driver may have been reloaded meanwhile.
    """
    previous: int | None = None
    first = True
    for reading in readings:
        if not first:
            yield interval_energy_mj(previous, reading)
        previous, first = reading, False


def total_energy_j(readings: Iterable[int | None]) -> float:
    """Joules over the known intervals of a run of readings (unknown intervals count nothing)."""
    return sum(energy for energy in interval_energies_mj(readings) if energy is not None) / MJ_PER_J
