"""The host source, against the real psutil and against a scripted one."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from nvdash.sampling.host_source import HostSource


class ScriptedPsutil:
    """A psutil stand-in whose counters advance by known amounts per reading."""

    def __init__(self, disks: bool = True) -> None:
        self.reading = 0
        self.disks = disks

    def cpu_count(self, logical: bool = True) -> int:
        return 8

    def cpu_percent(self, interval: Any = None) -> float:
        return 37.5

    def virtual_memory(self) -> Any:
        return SimpleNamespace(total=16 * 2**30, available=6 * 2**30)

    def disk_io_counters(self) -> Any:
        if not self.disks:
            return None
        return SimpleNamespace(read_bytes=1_000_000 * self.reading, write_bytes=250_000 * self.reading)

    def net_io_counters(self, pernic: bool = False) -> Any:
        assert pernic, "the host source reads each interface to leave loopback out"
        self.reading += 1
        return {
            "lo": SimpleNamespace(bytes_sent=9_000_000 * self.reading, bytes_recv=9_000_000 * self.reading),
            "eth0": SimpleNamespace(bytes_sent=30_000 * self.reading, bytes_recv=60_000 * self.reading),
            "ib0": SimpleNamespace(bytes_sent=10_000 * self.reading, bytes_recv=20_000 * self.reading),
            "docker-lo": SimpleNamespace(bytes_sent=5_000_000 * self.reading, bytes_recv=5_000_000 * self.reading),
        }

    def net_if_stats(self) -> Any:
        return {
            "lo": SimpleNamespace(flags="up,loopback,running"),
            "eth0": SimpleNamespace(flags="up,broadcast,running,multicast"),
            "ib0": SimpleNamespace(flags="up,running"),
            "docker-lo": SimpleNamespace(flags="up,loopback,running"),
        }


def test_scripted_counters_give_exact_rates() -> None:
    ticks = iter([100.0, 100.5, 101.0])
    fake = ScriptedPsutil()
    source = HostSource(psutil=fake, clock=lambda: next(ticks), hostname=lambda: "node-7")  # type: ignore[arg-type]
    info = source.info()
    assert (info.hostname, info.cpu_count, info.memory_total_bytes) == ("node-7", 8, 16 * 2**30)
    first = source.read()
    assert first.cpu_pct is None
    assert first.disk_read_bytes_per_s is None
    assert first.memory_used_bytes == 10 * 2**30
    second = source.read()
    assert second.cpu_pct == 37.5
    assert second.disk_read_bytes_per_s == pytest.approx(2_000_000.0)
    assert second.disk_write_bytes_per_s == pytest.approx(500_000.0)
    # eth0 + ib0 only: loopback interfaces (by their flags) carry local traffic, not network traffic.
    assert second.net_sent_bytes_per_s == pytest.approx(80_000.0)
    assert second.net_recv_bytes_per_s == pytest.approx(160_000.0)


def test_machine_without_disks_has_no_disk_rates() -> None:
    ticks = iter([1.0, 2.0])
    source = HostSource(psutil=ScriptedPsutil(disks=False), clock=lambda: next(ticks))  # type: ignore[arg-type]
    source.read()
    sample = source.read()
    assert sample.disk_read_bytes_per_s is None
    assert sample.net_sent_bytes_per_s is not None


def test_real_psutil_reads_plausible_values() -> None:
    source = HostSource()
    info = source.info()
    assert info.memory_total_bytes == psutil.virtual_memory().total
    assert info.cpu_count == psutil.cpu_count(logical=True)
    source.read()
    sample = source.read()
    assert sample.cpu_pct is not None
    assert 0.0 <= sample.cpu_pct <= 100.0
    assert sample.memory_used_bytes is not None
    assert 0 < sample.memory_used_bytes <= info.memory_total_bytes
    assert sample.net_recv_bytes_per_s is None or sample.net_recv_bytes_per_s >= 0


def test_real_loopback_traffic_is_not_network_traffic() -> None:
    """Bytes sent to 127.0.0.1 show on ``lo`` but not in the host's network rates."""
    loopbacks = [name for name, stats in psutil.net_if_stats().items() if "loopback" in (stats.flags or "")]
    if not loopbacks:
        pytest.skip("no loopback interface flagged on this machine")
    clock_values = [0.0]

    def clock() -> float:
        return clock_values[0]

    source = HostSource(clock=clock)
    source.read()
    before = psutil.net_io_counters(pernic=True)[loopbacks[0]].bytes_sent
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    payload = b"x" * (1 << 20)
    sent = 0
    for _ in range(20):
        client.sendall(payload)
        sent += len(payload)
        received = 0
        while received < len(payload):
            received += len(peer.recv(1 << 20))
    for sock in (client, peer, server):
        sock.close()
    clock_values[0] = 1.0
    sample = source.read()
    assert psutil.net_io_counters(pernic=True)[loopbacks[0]].bytes_sent - before >= sent
    assert sample.net_sent_bytes_per_s is not None
    assert sample.net_sent_bytes_per_s < sent / 2, "20 MiB over loopback must not count as network traffic"
