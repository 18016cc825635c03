"""The host source: the only module that imports ``psutil``.

It takes the psutil module and a monotonic clock as parameters so tests can hand in fakes.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

from nvdash.sampling.rates import CounterRate
from nvdash.sampling.records import HostInfo, HostSample


def load_psutil() -> ModuleType:
    """Import and return the real psutil module."""
    import psutil  # noqa: PLC0415 - imported on demand so that importing nvdash never loads it

    module: ModuleType = psutil
    return module


class HostSource:
    """CPU, memory, disk and network of this machine; rates from cumulative counters and elapsed time."""

    def __init__(
        self,
        psutil: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
        hostname: Callable[[], str] = socket.gethostname,
    ) -> None:
        self._psutil = psutil if psutil is not None else load_psutil()
        self._clock = clock
        self._hostname = hostname
        self._rates = {name: CounterRate() for name in ("disk_read", "disk_write", "net_sent", "net_recv")}
        self._primed = False
        self._loopback: dict[str, bool] = {}

    def info(self) -> HostInfo:
        """Host name, logical CPU count and total memory."""
        return HostInfo(
            hostname=self._hostname(),
            cpu_count=int(self._psutil.cpu_count(logical=True) or 1),
            memory_total_bytes=int(self._psutil.virtual_memory().total),
        )

    def read(self) -> HostSample:
        """One reading. CPU % and rates are ``None`` on the very first reading (no interval yet)."""
        ps = self._psutil
        now = self._clock()
        cpu = float(ps.cpu_percent(interval=None))
        memory = ps.virtual_memory()
        disk = _safe(ps.disk_io_counters)
        net = _safe(self._external_net)
        first = not self._primed
        self._primed = True
        return HostSample(
            cpu_pct=None if first else cpu,
            memory_used_bytes=int(memory.total - memory.available),
            memory_total_bytes=int(memory.total),
            disk_read_bytes_per_s=self._rate("disk_read", disk, "read_bytes", now),
            disk_write_bytes_per_s=self._rate("disk_write", disk, "write_bytes", now),
            net_sent_bytes_per_s=self._rate("net_sent", net, "bytes_sent", now),
            net_recv_bytes_per_s=self._rate("net_recv", net, "bytes_recv", now),
        )

    def _external_net(self) -> Any:
        """Bytes sent and received over every interface except loopback (local traffic is not the network)."""
        per_nic: dict[str, Any] = self._psutil.net_io_counters(pernic=True) or {}
        sent = recv = 0
        for name, counters in per_nic.items():
            if self._is_loopback(name):
                continue
            sent += int(counters.bytes_sent)
            recv += int(counters.bytes_recv)
        return SimpleNamespace(bytes_sent=sent, bytes_recv=recv)

    def _is_loopback(self, name: str) -> bool:
        known = self._loopback.get(name)
        if known is None:
            flags = ""
            try:
                stats = self._psutil.net_if_stats().get(name)
                flags = str(getattr(stats, "flags", "") or "")
            except (OSError, RuntimeError, AttributeError):
                flags = ""
            known = self._loopback[name] = "loopback" in flags.split(",") or name == "lo" or name.startswith("lo:")
        return known

    def _rate(self, name: str, counters: Any, attribute: str, now: float) -> float | None:
        if counters is None:
            return None
        return self._rates[name].update(int(getattr(counters, attribute)), now)


def _safe(read: Callable[[], Any]) -> Any:
    """psutil's counters, or ``None`` where the machine has none (no disks, restricted /proc)."""
    try:
        return read()
    except (OSError, RuntimeError):
        return None


def interface_addresses(psutil: ModuleType | None = None) -> list[str]:
    """This machine's IPv4 and IPv6 interface addresses, loopback included, link-local IPv6 left out.

    Link-local IPv6 addresses (``fe80::/10``) need a zone (``%eth0``) that browsers do not accept in a URL.
    """
    ps = psutil if psutil is not None else load_psutil()
    try:
        interfaces: dict[str, Any] = ps.net_if_addrs() or {}
    except (OSError, RuntimeError):
        return []
    found: list[str] = []
    for entries in interfaces.values():
        for entry in entries:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                address = ipaddress.ip_address(str(entry.address).partition("%")[0])
            except ValueError:
                continue
            if address.version == 4 or not address.is_link_local:
                found.append(str(address))
    return list(dict.fromkeys(found))
