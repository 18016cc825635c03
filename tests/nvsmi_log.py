"""A long nvidia-smi ``--query-gpu`` loop log, written line by line to a size, for import tests and benchmarks."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

FIELDS = ("timestamp, index, name, uuid, pci.bus_id, utilization.gpu [%], utilization.memory [%], memory.total [MiB], "
          "memory.used [MiB], temperature.gpu, power.draw [W], clocks.current.sm [MHz], pstate")
GPUS = 8
START_S = 1_700_000_000.0


def write_log(path: Path, size_bytes: int, interval_s: float = 1.0) -> int:
    """Write rounds of 8 GPUs' lines, one round every ``interval_s``, until the file holds ``size_bytes``;
    returns the number of reading lines."""
    lines = 0
    with path.open("w", encoding="utf-8") as file:
        file.write(FIELDS + "\n")
        written = len(FIELDS) + 1
        round_number = 0
        while written < size_bytes:
            stamp = datetime.fromtimestamp(START_S + round_number * interval_s).strftime("%Y/%m/%d %H:%M:%S")
            for gpu in range(GPUS):
                line = (f"{stamp}.{gpu:03d}, {gpu}, NVIDIA H100 80GB HBM3, GPU-{gpu:08d}-0000-0000-0000-000000000000, "
                        f"00000000:{gpu + 0x18:02X}:00.0, {(round_number + gpu) % 101} %, {round_number % 37} %, "
                        f"81559 MiB, {(round_number * 7 + gpu) % 81559} MiB, {40 + gpu}, "
                        f"{100 + round_number % 600}.25 W, 1980 MHz, P0\n")
                file.write(line)
                written += len(line)
                lines += 1
            round_number += 1
    return lines
