"""Health rules and bottleneck hints: pure functions over the typed records, no Bokeh, no hardware library.

``status.evaluate`` turns one snapshot plus recent events into OK/Warning/Critical with reasons,
``events.detect_events`` / ``events.EventDetector`` turn level changes into events, ``hints`` reads a window of
rows for bottlenecks, ``xid`` and ``clock_events`` decode what NVML reports.
"""

from nvdash.health.clock_events import ClockEventReason, decode_reasons, describe_reasons, throttling_reasons
from nvdash.health.events import EventDetector, detect_events
from nvdash.health.hints import Hint, bottleneck_hints
from nvdash.health.status import Finding, GpuHealth, Status, evaluate
from nvdash.health.xid import XidInfo, xid_info

__all__ = [
    "ClockEventReason",
    "EventDetector",
    "Finding",
    "GpuHealth",
    "Hint",
    "Status",
    "XidInfo",
    "bottleneck_hints",
    "decode_reasons",
    "describe_reasons",
    "detect_events",
    "evaluate",
    "throttling_reasons",
    "xid_info",
]
