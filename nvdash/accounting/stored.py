"""The accounting's tallies as the history file keeps them, read back as owners and tallies."""

from __future__ import annotations

import sqlite3

from nvdash.accounting.attribution import Owner
from nvdash.accounting.ledger import Tally
from nvdash.history.accounting_table import SUMMED, total_rows


def totals(connection: sqlite3.Connection, start_s: float, end_s: float) -> list[tuple[Owner, int, Tally]]:
    """Per (owner, GPU), the tallies of the hours overlapping ``[start_s, end_s)``, added up."""
    result = []
    for row in total_rows(connection, start_s, end_s):
        kind, job, user, project, index, start, end, *summed, peak = row
        tally = Tally(start_s=start, end_s=end, **dict(zip(SUMMED, summed, strict=True)),
                      peak_memory_bytes=None if peak is None else int(peak))
        result.append((Owner(kind, job, user, project), int(index), tally))
    return result
