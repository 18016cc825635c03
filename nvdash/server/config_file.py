"""Reading a ``--config`` file: TOML, from a regular file of bounded size, every failure one line.

The file is opened without blocking (a FIFO or a device is refused, never waited on) and read up to
:data:`MAX_BYTES` (a larger file is refused rather than read into memory); what the file means is the job of
:mod:`nvdash.server.config_sources`.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found]

MAX_BYTES = 1 << 20
"""The largest configuration file read (1 MiB: a few hundred options fit in a few KiB)."""


class ConfigError(ValueError):
    """A configuration file or variable that cannot be used; the message is one line for the user."""


def _read_bounded(path: Path) -> bytes:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as error:
        raise ConfigError(f"cannot read configuration file {path}: {error.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ConfigError(f"configuration file {path} is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:
            chunk = os.read(descriptor, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise ConfigError(f"cannot read configuration file {path}: {error.strerror}") from None
    finally:
        os.close(descriptor)
    if size > MAX_BYTES:
        raise ConfigError(f"configuration file {path} is larger than {MAX_BYTES >> 20} MiB")
    return b"".join(chunks)


def read_config(path: Path) -> dict[str, Any]:
    """The TOML document in ``path``; raises :class:`ConfigError` (one line) when it cannot be read or parsed."""
    data = _read_bounded(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
    try:
        document: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        reason = " ".join(str(error).split())
        raise ConfigError(f"{path}: not valid TOML: {reason}") from None
    return document
