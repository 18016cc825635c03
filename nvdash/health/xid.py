"""A catalog of common XID codes: what each means, what to do, and how serious it is.

Summarised in our own words from NVIDIA's XID documentation (docs.nvidia.com/deploy/xid-errors); codes it does
not list get a generic entry that points there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["warning", "critical"]

XID_DOCS = "docs.nvidia.com/deploy/xid-errors"


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One XID code: a one-line meaning, the action to take, and ``"warning"`` or ``"critical"``."""

    code: int
    meaning: str
    action: str
    severity: Severity
    known: bool = True


_APP = "check the application (run it under compute-sanitizer); if it recurs with healthy code, check the GPU"
_RESET = "drain the GPU and reset it (nvidia-smi -r); replace it if the error comes back"

CATALOG: dict[int, XidInfo] = {
    info.code: info
    for info in (
        XidInfo(8, "GPU stopped processing (a channel timed out)", _APP, "warning"),
        XidInfo(13, "graphics engine exception (often an out-of-bounds access in a kernel)", _APP, "warning"),
        XidInfo(31, "GPU memory page fault (an illegal address, usually an application bug)", _APP, "warning"),
        XidInfo(32, "invalid or corrupted push buffer stream",
                "restart the application; check the PCIe link and the driver if it recurs", "warning"),
        XidInfo(38, "driver firmware error", "restart the application; update the driver if it recurs", "warning"),
        XidInfo(43, "GPU stopped processing for an application fault; the GPU itself is fine",
                "restart the application; nothing to do on the GPU", "warning"),
        XidInfo(44, "graphics engine fault during a context switch", _RESET, "critical"),
        XidInfo(45, "channel cleaned up after the process ended or was killed (often follows another error)",
                "usually benign; look at the XIDs logged just before it", "warning"),
        XidInfo(46, "GPU stopped processing", _RESET, "critical"),
        XidInfo(48, "uncorrectable double-bit ECC error in GPU memory",
                "restart the application, then reset the GPU so the bad memory is retired or remapped", "critical"),
        XidInfo(54, "auxiliary power is not connected", "plug in the GPU's power cables", "critical"),
        XidInfo(61, "internal micro-controller breakpoint or warning",
                "keep the GPU under watch; reset it if it stops responding", "warning"),
        XidInfo(62, "internal micro-controller halted", _RESET, "critical"),
        XidInfo(63, "ECC page retirement or row remapping recorded",
                "reset the GPU when convenient so the retirement or remapping takes effect", "warning"),
        XidInfo(64, "ECC page retirement or row remapping failed", _RESET, "critical"),
        XidInfo(68, "video decoder (NVDEC) exception",
                "restart the application; check the video stream and the driver if it recurs", "warning"),
        XidInfo(69, "graphics engine class error", _APP, "warning"),
        XidInfo(74, "NVLink error", "check the NVLink bridges or the NVSwitch fabric and reset the GPU; "
                "replace the part if it recurs", "critical"),
        XidInfo(79, "GPU fell off the bus",
                "drain the node and reboot it; check power, cooling and PCIe seating; replace if it recurs",
                "critical"),
        XidInfo(92, "high rate of corrected (single-bit) ECC errors",
                "keep watching the ECC counters; plan a replacement if the rate keeps rising", "warning"),
        XidInfo(94, "uncorrectable ECC error contained to the application that hit it",
                "restart that application; reset the GPU when convenient so the row is remapped", "warning"),
        XidInfo(95, "uncorrectable ECC error that could not be contained", _RESET, "critical"),
        XidInfo(109, "context switch timeout", _APP, "warning"),
        XidInfo(119, "GSP firmware did not answer in time (RPC timeout)",
                "reset the GPU; update the driver if it recurs", "critical"),
        XidInfo(120, "GSP firmware reported an error", "reset the GPU; update the driver if it recurs", "critical"),
        XidInfo(140, "unrecovered ECC error", _RESET, "critical"),
        XidInfo(154, "the driver changed the GPU's recovery action (a reset or reboot is needed)",
                "do what nvidia-smi -q shows under the GPU recovery action", "critical"),
    )
}


def xid_info(code: int | None) -> XidInfo:
    """The catalog entry of ``code``; a generic warning for a code the catalog does not hold."""
    if code is not None and code in CATALOG:
        return CATALOG[code]
    name = "an unknown XID" if code is None else f"XID {code}"
    return XidInfo(-1 if code is None else code, f"{name}, not in nvdash's catalog",
                   f"look it up in NVIDIA's XID catalog ({XID_DOCS})", "warning", known=False)
