"""Waiting until a server's viewers are all shown: their sessions open and its event loop quiet again."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

QUIET_MS = 50.0
"""Loop lag that counts as quiet."""
QUIET_S = 5.0
"""How long the loop must stay quiet."""

Health = Callable[..., Any]
"""``health(since=None)``: the server's ``/health`` answer (with ``since``, the longest lag after it)."""


def wait_until_settled(health: Health, sessions: int, timeout_s: float = 300.0) -> bool:
    """Until the server holds ``sessions`` sessions and its event loop lagged no more than ``QUIET_MS`` for
    ``QUIET_S`` seconds in a row (pages built in stages are complete by then). False if it never got quiet."""
    deadline = time.monotonic() + timeout_s
    while health()["sessions"] < sessions:
        if time.monotonic() > deadline:
            raise SystemExit(f"the viewers did not open their {sessions} sessions in {timeout_s:g} s")
        time.sleep(1.0)
    while True:
        before = health()["event_loop"]["at"]
        time.sleep(QUIET_S)
        if health(since=before)["event_loop"]["max_lag_since_ms"] <= QUIET_MS:
            return True
        if time.monotonic() > deadline:
            return False
