"""The points of the "GPU Memory by Notebook" lines: readings from snapshots and history minutes, and each
kernel's line starting, dropping to 0, ending and coming back."""

from __future__ import annotations

import math

from nvdash.apps.notebook_lines import Held, NotebookLines, Points, Reading, history_readings, live_readings
from nvdash.history.notebook_table import NotebookMinute
from nvdash.sampling.notebook_records import NotebookView
from tests.notebook_views import GPU0, GPU1, MIB, snapshot, use, view

T0 = 1_700_000_040.0
A, B = "aaaa1111-0000", "bbbb2222-0000"


def test_live_readings_take_each_process_reading_once_and_only_kernels_holding_memory() -> None:
    first = view(T0, use(A, "a.ipynb", (0, 100 * MIB, 5.0)), use(B, None))
    second = view(T0 + 2, use(A, "a.ipynb", (0, None, 5.0)), use(B, None, (0, 10 * MIB, 1.0), (1, 20 * MIB, 1.0)))
    degraded = NotebookView("pid_namespace", "another PID namespace", T0 + 4)
    rows = [snapshot(T0, first), snapshot(T0 + 1, first), snapshot(T0 + 2, second), snapshot(T0 + 3, None),
            snapshot(T0 + 4, degraded)]
    readings = live_readings(rows)
    assert [reading.time_s for reading in readings] == [T0, T0 + 2]
    assert readings[0].held == {A: Held("a.ipynb", 100.0 * MIB)}
    assert math.isnan(readings[1].held[A].memory_bytes)
    assert readings[1].held[B] == Held("Kernel python3 bbbb2222", 30.0 * MIB)


def test_history_readings_sum_each_kernels_mean_over_its_gpus_at_the_minutes_middle() -> None:
    minutes = [
        NotebookMinute(T0, A, "a.ipynb", GPU0, 0, 2, 300.0 * MIB, 200.0 * MIB, 20.0),
        NotebookMinute(T0, B, "b.ipynb", GPU0, 0, 2, 30.0 * MIB, 25.0 * MIB, 20.0),
        NotebookMinute(T0, B, "b.ipynb", GPU1, 1, 2, 1003.0 * MIB, 1002.5 * MIB, 40.0),
        NotebookMinute(T0 + 60, A, "a.ipynb", GPU0, 0, 1, None, None, None),
        NotebookMinute(T0 + 120, A, "a.ipynb", GPU0, 0, 1, 1.0, 1.0, None),
    ]
    readings = history_readings(minutes, before_s=T0 + 150)  # the last minute's middle is where live data starts
    assert [reading.time_s for reading in readings] == [T0 + 30, T0 + 90]
    assert readings[0].held == {A: Held("a.ipynb", 200.0 * MIB), B: Held("b.ipynb", 1027.5 * MIB)}
    assert math.isnan(readings[1].held[A].memory_bytes)


def test_a_line_starts_drops_to_zero_ends_and_rises_from_zero_when_it_holds_again() -> None:
    lines = NotebookLines()
    first = lines.add([Reading(T0, {A: Held("a.ipynb", 5.0)}), Reading(T0 + 1, {A: Held("a.ipynb", 7.0),
                                                                                 B: Held("b.ipynb", 1.0)})])
    assert first.new == [A, B]
    assert first.points == {A: Points([T0 * 1e3, (T0 + 1) * 1e3], [5.0, 7.0]), B: Points([(T0 + 1) * 1e3], [1.0])}
    # A stops holding memory: it drops to 0 and gets no more points; B goes on.
    second = lines.add([Reading(T0 + 2, {B: Held("b.ipynb", 2.0)}), Reading(T0 + 3, {B: Held("b.ipynb", 3.0)})])
    assert second.new == []
    assert second.points == {A: Points([(T0 + 2) * 1e3], [0.0]),
                             B: Points([(T0 + 2) * 1e3, (T0 + 3) * 1e3], [2.0, 3.0])}
    # A holds again (its notebook renamed): it rises from 0 at that reading; B ends; a reading seen is skipped.
    third = lines.add([Reading(T0 + 3, {}), Reading(T0 + 4, {A: Held("renamed.ipynb", 9.0)})])
    assert third.new == []
    assert third.points == {A: Points([(T0 + 4) * 1e3, (T0 + 4) * 1e3], [0.0, 9.0]), B: Points([(T0 + 4) * 1e3], [0.0])}
    assert third.titles == {A: "renamed.ipynb"}
    assert lines.add([Reading(T0 + 5, {})]).points == {A: Points([(T0 + 5) * 1e3], [0.0])}
    assert lines.add([Reading(T0 + 6, {})]).points == {}
