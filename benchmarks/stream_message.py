"""What one live update of a timeline page costs to make and send: a row of 33 columns (GPU Resources on 8 GPUs)
streamed as numpy arrays (each a binary buffer of its own) or as plain lists (inline in the message's JSON).

    python benchmarks/stream_message.py [--columns 33] [--rows 1] [--repeat 2000]

Prints the message's websocket frames and bytes and the time to stream the row into a source and build the
message (Bokeh's own ``Protocol.create``, as the server does for each session), per update.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from bokeh.document import Document
from bokeh.document.events import DocumentPatchedEvent
from bokeh.models import ColumnDataSource
from bokeh.protocol import Protocol
from bokeh.protocol.message import Message


def frames_and_bytes(message: Message[Any]) -> tuple[int, int]:
    """Websocket frames (header, metadata, content, then a reference and a payload per buffer) and their bytes."""
    size = len(message.header_json) + len(message.metadata_json) + len(message.content_json)
    size += sum(len(buffer.ref["id"]) + 20 + len(buffer.to_bytes()) for buffer in message.buffers)
    return 3 + 2 * len(message.buffers), size


def measure(kind: str, columns: int, rows: int, repeat: int) -> tuple[int, int, float, float]:
    doc = Document()
    names = [f"c{i}" for i in range(columns)]
    source = ColumnDataSource(data={name: np.random.default_rng(0).random(1200) for name in names})
    doc.add_root(source)
    protocol = Protocol()
    messages: list[Message[Any]] = []

    def on_change(event: Any) -> None:
        if isinstance(event, DocumentPatchedEvent):
            messages.append(protocol.create("PATCH-DOC", [event]))

    doc.on_change(on_change)
    times = []
    for i in range(repeat):
        values = np.full(rows, float(i))
        new = {name: values.copy() if kind == "numpy" else values.tolist() for name in names}
        started = time.perf_counter()
        source.stream(new, rollover=1200)
        times.append((time.perf_counter() - started) * 1000)
        if len(messages) > 10:
            del messages[:-1]
    frames, size = frames_and_bytes(messages[-1])
    return frames, size, statistics.median(times), float(np.percentile(times, 95))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--columns", type=int, default=33)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    print(f"{args.columns} columns, {args.rows} row(s) per update, {args.repeat} updates")
    print("| streamed as | websocket frames | bytes | stream + message ms (median) | p95 ms |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("numpy", "list"):
        frames, size, median, p95 = measure(kind, args.columns, args.rows, args.repeat)
        print(f"| {kind} | {frames} | {size} | {median:.3f} | {p95:.3f} |")


if __name__ == "__main__":
    main()
