"""``nvdash export`` and ``nvdash import`` as a user runs them: real processes, real files, exit statuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nvdash.history.writer import HistoryWriter
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from tests.conftest import nvdash_env
from tests.unit.test_apps_health import INVENTORY

T0 = 1_700_000_000.25
FIELDS = "timestamp,index,name,uuid,utilization.gpu,memory.used,temperature.gpu,power.draw,clocks.sm,pstate"


def nvdash(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvdash", *args], env=nvdash_env(), capture_output=True,
                          text=True, timeout=120, check=False)


def recorded(path: Path) -> None:
    writer = HistoryWriter(path, INVENTORY, "test", 0.5, clock=lambda: T0)
    writer.open()
    for k in range(40):
        gpus = tuple(GpuSample(i, utilization_pct=float((k + i) % 100), memory_used_bytes=(k + 1) * 1024**3,
                               temperature_c=40.0 + i, power_w=100.5 + k, clock_sm_mhz=1410.0, pstate=0)
                     for i in range(3))
        writer.submit(Snapshot(T0 + 0.5 * k, gpus, HostSample(cpu_pct=5.0)))
    writer.flush()
    writer.stop()


def test_export_import_export_with_the_commands(tmp_path: Path) -> None:
    first, second = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    recorded(first)
    out1, out2 = tmp_path / "1.csv", tmp_path / "2.csv"
    done = nvdash("export", "--history", str(first), "--query-gpu", FIELDS, "-o", str(out1))
    assert done.returncode == 0, done.stderr
    lines = out1.read_text().splitlines()
    assert lines[0] == ("timestamp, index, name, uuid, utilization.gpu [%], memory.used [MiB], temperature.gpu, "
                        "power.draw [W], clocks.current.sm [MHz], pstate")
    assert len(lines) == 1 + 40 * 3
    assert lines[1].split(", ")[1:] == ["0", "NVIDIA H100 80GB HBM3", "GPU-0", "0 %", "1024 MiB", "40", "100.50 W",
                                        "1410 MHz", "P0"]
    done = nvdash("import", str(out1), "--history", str(second))
    assert done.returncode == 0, done.stderr
    assert "imported 120 readings of 3 GPUs" in done.stdout
    again = nvdash("import", str(out1), "--history", str(second))
    assert "imported 0 readings" in again.stdout
    assert "120 already there" in again.stdout
    done = nvdash("export", "--history", str(second), "--query-gpu", FIELDS, "-o", str(out2))
    assert done.returncode == 0, done.stderr
    assert out2.read_bytes() == out1.read_bytes()


def test_command_errors_are_one_line(tmp_path: Path) -> None:
    history = tmp_path / "a.sqlite"
    recorded(history)
    cases = [
        (("export", "--history", str(history), "--range", "soon"), 2, "'soon' is not a duration"),
        (("export", "--history", str(history), "--query-gpu", "timestamp,fan.noise"), 2, "fan.noise"),
        (("export", "--history", str(history), "--format", "json"), 2, "is not csv"),
        (("export", "--history", str(tmp_path / "none.sqlite")), 1, "does not exist"),
        (("import", str(tmp_path / "missing.csv"), "--history", str(tmp_path / "new.sqlite")), 1, "cannot read"),
    ]
    for args, status, message in cases:
        done = nvdash(*args)
        assert done.returncode == status, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("nvdash: error: ")
        assert message in lines[0]
    assert not (tmp_path / "none.sqlite").exists()
    assert not (tmp_path / "new.sqlite").exists(), "an import of a missing log created the history file"
