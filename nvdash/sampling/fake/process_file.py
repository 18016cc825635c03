"""The process file (``NVDASH_FAKE_PROCESS_FILE``): processes listed on the simulated GPUs while they run.

A test that learns its processes' PIDs only after the simulated GPUs started (a notebook server's kernels) writes
the file, best atomically (a temporary file in the same folder, then a rename). It holds items of the fault text
form of listed processes (see :mod:`.listed_processes`), ``process:UNIT:PID[:SM_SHARE[:MEMORY_MIB[:KINDS]]]`` and
``clear_processes:GPU``, separated by newlines or ``;``; ``@SECONDS`` is not taken here.

The driver looks at the file (its modification time, size and inode) at most every :data:`CHECK_EVERY_S` and, when
it changed, reads it again: the processes it lists are then exactly the file's items. A missing file lists none. A
file that cannot be taken (a bad item, not a regular file, over :data:`READ_LIMIT` bytes, not UTF-8, unreadable)
leaves the previous items in force and logs one warning line per version of the file; NVML calls never fail for it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .usage_specs import ProcessSpec

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.2
"""How often the file's status is looked at (a listing call in between costs a clock reading)."""
READ_LIMIT = 64 * 1024
"""The largest process file read; a larger one is refused."""
_SHOWN = 80
"""Characters of a bad item quoted in the warning."""


@dataclass(frozen=True)
class FileItems:
    """What a version of the file lists: processes (the last item of a PID on a GPU wins) and GPUs cleared of the
    profile's own processes."""

    processes: tuple[ProcessSpec, ...] = ()
    cleared: frozenset[int] = frozenset()


NO_ITEMS = FileItems()
ParseItem = Callable[[str], ProcessSpec | int]
"""Parses one item: the process of a ``process`` item or the GPU of a ``clear_processes`` item; ValueError if bad."""


class ProcessFileError(ValueError):
    """A version of the process file that cannot be taken; the message is one line."""


def parse_items(text: str, parse_item: ParseItem) -> FileItems:
    """The items of ``text`` (separated by newlines or ``;``, blank ones skipped)."""
    processes: dict[tuple[int, int], ProcessSpec] = {}
    cleared: set[int] = set()
    for raw in text.replace("\n", ";").split(";"):
        item = raw.strip()
        if not item:
            continue
        shown = item if len(item) <= _SHOWN else item[:_SHOWN] + "..."
        if "@" in item:
            raise ProcessFileError(f"bad item {shown!r}: @SECONDS is not taken in the process file")
        try:
            parsed = parse_item(item)
        except ValueError as error:
            raise ProcessFileError(f"bad item {shown!r}: {error}") from None
        if isinstance(parsed, ProcessSpec):
            processes.pop((parsed.pid, parsed.gpu), None)
            processes[(parsed.pid, parsed.gpu)] = parsed
        else:
            cleared.add(parsed)
    return FileItems(tuple(processes.values()), frozenset(cleared))


def read_bounded(path: str) -> str:
    """The text of the regular file ``path`` (opened without blocking, at most :data:`READ_LIMIT` bytes).

    Raises FileNotFoundError when it does not exist, ProcessFileError when it cannot be taken.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise ProcessFileError(f"cannot open it: {os.strerror(error.errno or errno.EIO)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProcessFileError("it is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= READ_LIMIT:
            chunk = os.read(fd, READ_LIMIT + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise ProcessFileError(f"cannot read it: {os.strerror(error.errno or errno.EIO)}") from None
    finally:
        os.close(fd)
    if size > READ_LIMIT:
        raise ProcessFileError(f"it is larger than {READ_LIMIT // 1024} KiB")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise ProcessFileError("it is not UTF-8 text") from None


Version = tuple[int, int, int, int] | None
"""(device, inode, size, modification time in ns) of the file, None while it does not exist."""


def _version(path: str) -> tuple[Version, str | None]:
    """The file's version, and why it cannot be read (a FIFO or a folder is never opened) or None."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None, None
    except OSError as error:
        reason = os.strerror(error.errno or errno.EIO)
        return (-1, error.errno or 0, 0, 0), f"cannot look at it: {reason}"
    version = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
    return version, None if stat.S_ISREG(status.st_mode) else "it is not a regular file"


class ProcessFile:
    """Follows one process file: :meth:`items` is what its latest good version lists (thread-safe)."""

    def __init__(self, path: str, parse_item: ParseItem, clock: Callable[[], float],
                 check_every_s: float = CHECK_EVERY_S) -> None:
        self.path = path
        self._parse_item = parse_item
        self._clock = clock
        self._check_every_s = check_every_s
        self._lock = threading.Lock()
        self._checked_at: float | None = None
        self._version: Version | bool = False
        """The version last looked at (False: none yet)."""
        self._items = NO_ITEMS

    def items(self) -> FileItems:
        """The items in force, after looking at the file again if :data:`CHECK_EVERY_S` went by."""
        now = self._clock()
        with self._lock:
            last = self._checked_at
            if last is not None and 0 <= now - last < self._check_every_s:
                return self._items
            self._checked_at = now
            version, problem = _version(self.path)
            if version == self._version:
                return self._items
            self._version = version
            try:
                self._items = self._read(problem)
            except ProcessFileError as error:
                log.warning("process file %s left as it was: %s", self.path, error)
            return self._items

    def _read(self, problem: str | None) -> FileItems:
        if problem is not None:
            raise ProcessFileError(problem)
        try:
            text = read_bounded(self.path)
        except FileNotFoundError:
            return NO_ITEMS
        return parse_items(text, self._parse_item)
