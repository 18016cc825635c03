"""The kernels file (Jupyter server -> nvdash): its exact content, and hostile files read as one-line errors."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from nvdash.sampling.jupyter_kernels import (
    MAX_BYTES,
    JupyterKernel,
    JupyterKernels,
    JupyterServer,
    KernelSession,
    KernelsFileError,
    kernels_file_path,
    parse_kernels,
    read_kernels_file,
    to_json,
    write_kernels_file,
)

SERVER = JupyterServer(pid=4242, hostname="gpu-07", boot_id="6f1c0d2e", base_url="/user/alice/")
LOCAL = JupyterKernel(
    id="0b8f6a4e-1111-4222-8333-944445555666",
    name="python3",
    pid=4301,
    started_s=1764259100.25,
    local=True,
    execution_state="busy",
    sessions=(
        KernelSession(path="train/a.ipynb", name="a.ipynb", type="notebook"),
        KernelSession(path="train/a.ipynb", name="Console 1", type="console"),
    ),
)
REMOTE = JupyterKernel(id="9d0e", name="R", pid=None, started_s=None, local=False)
KERNELS = JupyterKernels(server=SERVER, written_s=1764259200.5, kernels=(LOCAL, REMOTE))
DOCUMENT = {
    "version": 1,
    "written_s": 1764259200.5,
    "server": {"pid": 4242, "hostname": "gpu-07", "boot_id": "6f1c0d2e", "base_url": "/user/alice/"},
    "kernels": [
        {"id": "0b8f6a4e-1111-4222-8333-944445555666", "name": "python3", "pid": 4301, "started_s": 1764259100.25,
         "local": True, "execution_state": "busy",
         "sessions": [{"path": "train/a.ipynb", "name": "a.ipynb", "type": "notebook"},
                      {"path": "train/a.ipynb", "name": "Console 1", "type": "console"}]},
        {"id": "9d0e", "name": "R", "pid": None, "started_s": None, "local": False, "execution_state": None,
         "sessions": []},
    ],
}


def test_the_file_holds_exactly_the_documented_json_and_reads_back(tmp_path: Path) -> None:
    assert to_json(KERNELS) == DOCUMENT
    path = kernels_file_path(tmp_path, 4242)
    assert path == tmp_path / "nvdash-kernels-4242.json"
    write_kernels_file(path, KERNELS)
    assert json.loads(path.read_text()) == DOCUMENT
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_kernels_file(path) == KERNELS
    assert parse_kernels(DOCUMENT) == KERNELS
    assert [kernel.title for kernel in KERNELS.kernels] == ["train/a.ipynb", "Kernel R 9d0e"]
    assert sorted(os.listdir(tmp_path)) == ["nvdash-kernels-4242.json"]  # no temporary file left


def test_a_kernel_not_on_this_machine_keeps_no_pid_whatever_the_file_says() -> None:
    document = json.loads(json.dumps(DOCUMENT))
    document["kernels"][1].update(pid=4301, started_s=1764259100.25)
    kernel = parse_kernels(document).kernels[1]
    assert (kernel.local, kernel.pid, kernel.started_s) == (False, None, None)


def read_error(path: Path) -> str:
    """The message read_kernels_file gives for ``path``, failing the test if it waits (a FIFO) or succeeds."""
    outcome: list[BaseException | object] = []

    def read() -> None:
        try:
            outcome.append(read_kernels_file(path))
        except BaseException as error:  # handed to the test
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    if reader.is_alive():  # unblock the stuck reader before failing
        with open(path, "wb"):
            pass
        pytest.fail(f"reading {path} waited for a writer")
    (result,) = outcome
    assert isinstance(result, KernelsFileError), result
    message = str(result)
    assert "\n" not in message
    assert message.startswith(f"the kernels file {path} ")
    return message


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "nvdash-kernels-1.json"
    os.mkfifo(fifo)
    assert read_error(fifo).endswith("is not a regular file")


def test_a_symlink_to_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "nvdash-kernels-1.json"
    link.symlink_to(fifo)
    assert read_error(link).endswith("is not a regular file")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b" " * (MAX_BYTES + 1), f"is larger than {MAX_BYTES} bytes"),
        (b'{"version": 1, "server": "\xff\xfe"}', "is not JSON: 'utf-8' codec can't decode byte 0xff"),
        (json.dumps({**DOCUMENT, "version": 2}).encode(), "is malformed: version 2 is not 1"),
        (json.dumps([DOCUMENT]).encode(), "is malformed: not an object"),
        (json.dumps({**DOCUMENT, "kernels": [{**DOCUMENT["kernels"][0], "pid": None}]}).encode(),
         "is malformed: a local kernel has no pid"),
        (json.dumps({**DOCUMENT, "kernels": [{**DOCUMENT["kernels"][0], "pid": -3}]}).encode(),
         "is malformed: kernel pid -3 is not a process id"),
    ],
    ids=["too-large", "not-utf8", "wrong-version", "not-an-object", "local-without-pid", "negative-pid"],
)
def test_a_malformed_file_gives_one_line_naming_what_is_wrong(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "nvdash-kernels-1.json"
    path.write_bytes(content)
    assert expected in read_error(path)


def test_a_missing_file_is_not_written_yet(tmp_path: Path) -> None:
    assert read_error(tmp_path / "nvdash-kernels-1.json").endswith("does not exist (yet)")
