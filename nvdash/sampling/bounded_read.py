"""Bounded reads of files that other programs write: regular files only, no links followed, never past a cap.

A sampler that reads a scheduler's job-mapping directory, ``/proc`` or the kubelet's pod log directories must not
hang on a FIFO left there, run out of memory on a link to ``/dev/zero``, or follow a link out of the directory.
Each read opens the path with ``O_NOFOLLOW`` (a final symbolic link is refused, not followed) and ``O_NONBLOCK``
(opening a FIFO never waits for a writer), checks with ``fstat`` that what it opened is a regular file, and reads
at most ``max_bytes``. What is refused raises :class:`Refused` (an ``OSError``, so callers that already skip
unreadable files skip refused ones too), with a short reason for ``/health`` and the log.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK_BYTES = 1 << 16


class Refused(OSError):
    """A file that is not read: a link, a FIFO, a device, a directory, or larger than allowed."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(errno.EPERM, reason, str(path))
        self.reason = reason


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_bounded(path: str | Path, max_bytes: int, *, truncate: bool = False, follow_links: bool = False) -> bytes:
    """Up to ``max_bytes`` of the regular file ``path`` (not a link to one, unless ``follow_links``: a test's
    stand-in for ``/proc`` links to the real one; what the link leads to must still be a regular file).

    A longer file raises :class:`Refused`, or with ``truncate`` gives its first ``max_bytes``. A file that is not
    there (or vanished) raises ``FileNotFoundError`` and other failures their ``OSError``, as ``open`` would.
    """
    try:
        fd = os.open(path, _FLAGS & ~os.O_NOFOLLOW if follow_links else _FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Refused(path, "a symbolic link (not followed)") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Refused(path, _kind(mode))
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(_CHUNK_BYTES, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if size > max_bytes:
        if not truncate:
            raise Refused(path, f"larger than {max_bytes} bytes")
        return data[:max_bytes]
    return data


def read_bounded_or_none(path: str | Path, max_bytes: int, *, truncate: bool = True,
                         follow_links: bool = False) -> bytes | None:
    """:func:`read_bounded`, with ``None`` for a file that is gone, unreadable or refused (``/proc`` reads)."""
    try:
        return read_bounded(path, max_bytes, truncate=truncate, follow_links=follow_links)
    except OSError:
        return None
