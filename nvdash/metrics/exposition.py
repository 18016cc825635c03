"""The Prometheus text format (0.0.4) as dcgm-exporter writes it: a counter's ``# TYPE`` line names the family
itself. ``prometheus_client``'s own text writer names every counter ``<name>_total`` there, which would leave
dcgm-exporter's counters (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) untyped; OpenMetrics uses its writer."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import Metric

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: ``+Inf``, ``-Inf``, ``NaN``, else Python's shortest repr."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label_text(labels: Mapping[str, str]) -> str:
    text = ",".join(f'{name}="{_escape_value(value)}"' for name, value in sorted(labels.items()))
    return f"{{{text}}}" if text else ""


def text_format(families: Iterable[Metric]) -> bytes:
    """The families in the text format, each sample named as collected.

    The collector hands the same label dict to every family of a series; each dict is written out once per call
    (the cache keeps the dict itself, so its ``id`` cannot be reused by another while the call runs).
    """
    lines: list[str] = []
    written: dict[int, tuple[Mapping[str, str], str]] = {}
    for family in families:
        kind = "untyped" if family.type == "unknown" else family.type
        lines.append(f"# HELP {family.name} {_escape_help(family.documentation)}\n")
        lines.append(f"# TYPE {family.name} {kind}\n")
        for sample in family.samples:
            labels = sample.labels
            known = written.get(id(labels))
            if known is None or known[0] is not labels:
                known = written[id(labels)] = (labels, _label_text(labels))
            lines.append(f"{sample.name}{known[1]} {format_value(sample.value)}\n")
    return "".join(lines).encode("utf-8")
