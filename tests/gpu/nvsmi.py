"""Reading nvidia-smi's output: ``--help-query-gpu``, ``--query-gpu`` CSV, ``-q -x`` XML, ``nvlink -s`` and ``-e``.

Pure functions of the text, so that they are tested here against recorded samples of nvidia-smi's documented
formats (tests/unit/fixtures/nvidia_smi/) and used on a real GPU by tests/gpu/test_nvsmi_parity.py.
"""

from __future__ import annotations

import csv
import re
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

UNKNOWN = frozenset({"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]", "Unknown Error"})
"""How nvidia-smi writes a value it cannot give."""
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)")
_LINK_SPEED = re.compile(r"^\s*Link (\d+):\s*(.+?)\s*$")
_LINK_ERROR = re.compile(r"^\s*Link (\d+):\s*(.+?):\s*(\d+)\s*$")
_GPU_HEADER = re.compile(r"^GPU (\d+):")
_GB_PER_S = re.compile(r"^([\d.]+)\s*GB/s$")


def run(*args: str) -> str:
    """nvidia-smi's standard output for ``args`` (raises when it fails)."""
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def text(value: str | None) -> str | None:
    """``value`` stripped, or ``None`` where nvidia-smi says it cannot give it."""
    if value is None:
        return None
    stripped = value.strip()
    return None if stripped in UNKNOWN else stripped


def number(value: str | None) -> float | None:
    """The leading number of a cell such as ``81559 MiB``, ``650.00 W``, ``16x``, ``45 C`` or ``5066215 us``."""
    cleaned = text(value)
    if cleaned is None:
        return None
    if cleaned.lower().startswith("0x"):
        return float(int(cleaned, 16))
    match = _NUMBER.match(cleaned)
    return float(match.group(1)) if match else None


def query_fields(help_text: str) -> set[str]:
    """Every field name ``nvidia-smi --help-query-gpu`` lists (aliases too): querying one it lacks fails the lot."""
    names: set[str] = set()
    for line in help_text.splitlines():
        if line.startswith('"'):
            names.update(re.findall(r'"([^"]+)"', line))
    return names


def parse_query_csv(csv_text: str, fields: list[str]) -> list[dict[str, str | None]]:
    """One dict per GPU from ``--query-gpu=FIELDS --format=csv,noheader,nounits`` (unknown values ``None``)."""
    rows = []
    for row in csv.reader(line for line in csv_text.splitlines() if line.strip()):
        cells = [text(cell) for cell in row]
        if len(cells) != len(fields):
            raise ValueError(f"nvidia-smi gave {len(cells)} values for {len(fields)} fields: {row!r}")
        rows.append(dict(zip(fields, cells, strict=True)))
    return rows


@dataclass(frozen=True)
class XmlGpu:
    """One ``<gpu>`` of ``nvidia-smi -q -x``, flattened: ``"fb_memory_usage/used"`` -> ``"70123 MiB"``."""

    bus_id: str
    values: dict[str, str]
    mig_devices: list[dict[str, str]] = field(default_factory=list)

    def get(self, path: str) -> str | None:
        """The text at ``path``, ``None`` when absent or unknown."""
        return text(self.values.get(path))

    def first(self, *paths: str) -> str | None:
        """The text at the first of ``paths`` that has one (tags renamed between driver releases)."""
        return next((found for path in paths if (found := self.get(path)) is not None), None)


def _flatten(element: ET.Element, prefix: str, out: dict[str, str]) -> None:
    for child in element:
        path = f"{prefix}{child.tag}"
        if len(child):
            _flatten(child, path + "/", out)
        else:
            out[path] = (child.text or "").strip()


def parse_smi_xml(xml_text: str) -> list[XmlGpu]:
    """Every GPU of ``nvidia-smi -q -x``, in the order nvidia-smi lists them (its index order)."""
    root = ET.fromstring(xml_text)
    gpus = []
    for gpu in root.findall("gpu"):
        values: dict[str, str] = {}
        mig: list[dict[str, str]] = []
        for child in gpu:
            if child.tag == "mig_devices":
                for device in child.findall("mig_device"):
                    flat: dict[str, str] = {}
                    _flatten(device, "", flat)
                    mig.append(flat)
            elif len(child):
                _flatten(child, child.tag + "/", values)
            else:
                values[child.tag] = (child.text or "").strip()
        gpus.append(XmlGpu(bus_id=gpu.get("id", ""), values=values, mig_devices=mig))
    return gpus


def _by_gpu(lines: str) -> dict[int, list[str]]:
    sections: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in lines.splitlines():
        header = _GPU_HEADER.match(line)
        if header:
            current = sections.setdefault(int(header.group(1)), [])
        elif current is not None and line.strip():
            current.append(line)
    return sections


def parse_nvlink_speeds(lines: str) -> dict[int, dict[int, float | None]]:
    """``nvidia-smi nvlink -s``: per GPU, per link, bytes/s (``26.562 GB/s`` is 26.562e9); ``None`` if inactive."""
    speeds: dict[int, dict[int, float | None]] = {}
    for gpu, section in _by_gpu(lines).items():
        links: dict[int, float | None] = {}
        for line in section:
            match = _LINK_SPEED.match(line)
            if match:
                rate = _GB_PER_S.match(match.group(2))
                links[int(match.group(1))] = float(rate.group(1)) * 1e9 if rate else None
        speeds[gpu] = links
    return speeds


def parse_nvlink_errors(lines: str) -> dict[int, dict[int, dict[str, int]]]:
    """``nvidia-smi nvlink -e``: per GPU, per link, counter name (``"Replay Errors"``) -> count."""
    errors: dict[int, dict[int, dict[str, int]]] = {}
    for gpu, section in _by_gpu(lines).items():
        links: dict[int, dict[str, int]] = {}
        for line in section:
            match = _LINK_ERROR.match(line)
            if match:
                links.setdefault(int(match.group(1)), {})[match.group(2)] = int(match.group(3))
        errors[gpu] = links
    return errors
