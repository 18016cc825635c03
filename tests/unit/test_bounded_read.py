"""The bounded reader: regular files only, links not followed, a size cap; a FIFO never blocks it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from nvdash.sampling.bounded_read import Refused, read_bounded, read_bounded_or_none


def _read_in_thread(path: Path, max_bytes: int) -> bytes | BaseException:
    """The read's result, from a daemon thread, so that a read that blocks fails the test instead of hanging it."""
    result: list[bytes | BaseException] = []

    def run() -> None:
        try:
            result.append(read_bounded(path, max_bytes))
        except BaseException as error:
            result.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30.0)
    assert result, f"reading {path} blocked"
    return result[0]


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "0").write_bytes(b"31337 1000\n")
    assert read_bounded(tmp_path / "0", 64) == b"31337 1000\n"
    assert read_bounded(tmp_path / "0", 11) == b"31337 1000\n"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "0")
    error = _read_in_thread(tmp_path / "0", 64)
    assert isinstance(error, Refused)
    assert error.reason == "a FIFO"


def test_a_fifo_with_a_writer_that_never_writes_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "0")
    writer = os.open(tmp_path / "0", os.O_RDWR)  # holds the FIFO open for writing, never writes
    try:
        error = _read_in_thread(tmp_path / "0", 64)
    finally:
        os.close(writer)
    assert isinstance(error, Refused)
    assert error.reason == "a FIFO"


@pytest.mark.parametrize("target", ["/dev/zero", "outside"])
def test_a_symbolic_link_is_not_followed(tmp_path: Path, target: str) -> None:
    outside = tmp_path / "outside"
    outside.write_text("999\n")
    inside = tmp_path / "dir"
    inside.mkdir()
    (inside / "0").symlink_to(outside if target == "outside" else target)
    error = _read_in_thread(inside / "0", 64)
    assert isinstance(error, Refused)
    assert error.reason == "a symbolic link (not followed)"
    assert read_bounded_or_none(inside / "0", 64) is None


def test_dev_zero_itself_is_refused_as_a_device() -> None:
    error = _read_in_thread(Path("/dev/zero"), 64)
    assert isinstance(error, Refused)
    assert error.reason == "a character device"


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "4").mkdir()
    with pytest.raises(Refused, match="a directory"):
        read_bounded(tmp_path / "4", 64)


def test_a_file_over_the_cap_is_refused_or_truncated(tmp_path: Path) -> None:
    (tmp_path / "0").write_bytes(b"1234567890" * 100_000)
    with pytest.raises(Refused, match="larger than 100 bytes") as caught:
        read_bounded(tmp_path / "0", 100)
    assert caught.value.reason == "larger than 100 bytes"
    assert read_bounded(tmp_path / "0", 100, truncate=True) == b"1234567890" * 10
    assert read_bounded_or_none(tmp_path / "0", 100) == b"1234567890" * 10
    assert read_bounded_or_none(tmp_path / "0", 100, truncate=False) is None


def test_a_vanished_file_is_not_found_not_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "gone", 64)
    assert read_bounded_or_none(tmp_path / "gone", 64) is None


def test_proc_files_are_regular_and_read_up_to_their_cap() -> None:
    status = read_bounded(f"/proc/{os.getpid()}/status", 1 << 16)
    assert status.startswith(b"Name:")
    assert f"Pid:\t{os.getpid()}".encode() in status
    cmdline = read_bounded(f"/proc/{os.getpid()}/cmdline", 8, truncate=True)
    assert len(cmdline) == 8


def test_following_links_still_refuses_what_they_lead_to_unless_it_is_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("0::/\n")
    os.mkfifo(tmp_path / "fifo")
    for name, target in (("file", tmp_path / "real"), ("zero", Path("/dev/zero")), ("pipe", tmp_path / "fifo")):
        (tmp_path / name).symlink_to(target)
    assert read_bounded(tmp_path / "file", 64, follow_links=True) == b"0::/\n"
    with pytest.raises(Refused, match="a character device"):
        read_bounded(tmp_path / "zero", 64, follow_links=True)
    with pytest.raises(Refused, match="a FIFO"):
        read_bounded(tmp_path / "pipe", 64, follow_links=True)
