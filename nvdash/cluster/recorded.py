"""The series nvdash's recording rules write (``deploy/prometheus/nvdash-recording-rules.yml``), by name, and the
query that says whether they have been recording long enough to stand in for the raw series over a window.

The rules are optional: a view reads a recorded series only once :data:`RULES_INFO` shows the rules were loaded at
the start of the window it asks about, and the raw series before that (and where they are not loaded at all).
"""

from __future__ import annotations

RULES_INFO = "nvdash:recording_rules_info"
"""``vector(1)`` with the rules' version: present from the moment Prometheus loaded the rules."""
RULES_VERSION = "1"
"""The version of the recorded series' meaning that nvdash reads (the marker's ``version`` label)."""
XID_NONZERO = "nvdash:gpu_xid_errors:nonzero"
"""Each GPU's last XID code where non-zero, under either naming, with the raw series' labels but its name."""
NODE_GPUS = "nvdash:node_gpus_reporting:count"
"""Per node (its node-level labels kept): the distinct GPUs (UUIDs) reporting a temperature."""


def presence_query(window: str) -> str:
    """An instant query with one sample when the rules of :data:`RULES_VERSION` were recording ``window`` (a PromQL
    duration) ago, and none otherwise. Cheap: one series, one sample. The marker carries no node label, so the
    views' series scope does not apply to it."""
    return f'count({RULES_INFO}{{version="{RULES_VERSION}"}} offset {window})'
