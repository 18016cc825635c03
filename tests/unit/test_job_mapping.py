"""GPU -> Slurm job from a prolog's mapping directory: the layouts dcgm-exporter and jobstats read."""

from __future__ import annotations

import threading
from pathlib import Path

from nvdash.sampling.job_mapping import (
    JobMapping,
    MappedJob,
    parse_job_file,
    read_job_mapping,
    stable_text,
)

MIG = "MIG-265a219d-a49f-578a-825d-222c72699c16"
GPU = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"


def test_files_named_by_index_hold_one_job_per_line(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("1001\n")  # dcgm-exporter's prolog: `echo $SLURM_JOB_ID >> $DIR/$gpu`
    (tmp_path / "1").write_text("1002\n1003\n")  # a GPU shared by two jobs
    (tmp_path / "7").write_text("")  # the epilog emptied it
    mapping = read_job_mapping(tmp_path)
    assert mapping.available
    assert mapping.by_index == {0: (MappedJob("1001"),), 1: (MappedJob("1002"), MappedJob("1003"))}
    assert mapping.jobs_of(7) == ()
    assert mapping.jobs_of(3) == ()


def test_files_named_by_uuid_with_the_owners_uid(tmp_path: Path) -> None:
    (tmp_path / MIG).write_text("45916256 262563\n")  # jobstats: `<job id> <uid>`
    (tmp_path / GPU).write_text("45916257 1000")  # no final newline: read as it stands once it is stable
    (tmp_path / "2").write_text("99\n")
    mapping = read_job_mapping(tmp_path)
    assert mapping.by_uuid == {MIG: (MappedJob("45916256", 262563),), GPU: (MappedJob("45916257", 1000),)}
    assert mapping.jobs_of(5, MIG) == (MappedJob("45916256", 262563),)
    assert mapping.jobs_of(2, "GPU-unknown") == (MappedJob("99"),)
    assert mapping.jobs_of(2, GPU) == (MappedJob("45916257", 1000),)  # the UUID's file wins


def test_array_and_heterogeneous_job_ids_are_kept_whole() -> None:
    assert parse_job_file("1234_7\n1234+0\n") == (MappedJob("1234_7"), MappedJob("1234+0"))


def test_garbage_lines_and_repeats_are_skipped() -> None:
    text = "hello\n-1\n12 abc\n1 2 3\n\n  \x00\xff\n 42 \n42\n1.5\n0x10\n77 501\n"
    assert parse_job_file(text) == (MappedJob("42"), MappedJob("77", 501))
    assert parse_job_file("") == ()


def test_other_names_in_the_directory_are_ignored(tmp_path: Path) -> None:
    for name in (".0.swp", "0.tmp", "README", "gpu0", "-1", "٣"):  # the last: an Arabic-Indic digit
        (tmp_path / name).write_text("5\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "4").mkdir()  # a directory named like a GPU: not a file, said so
    assert read_job_mapping(tmp_path) == JobMapping(refused={"4": "a directory"})


def test_a_missing_directory_is_unavailable_not_an_error(tmp_path: Path) -> None:
    mapping = read_job_mapping(tmp_path / "absent")
    assert not mapping.available
    assert mapping.jobs_of(0) == ()


def test_a_file_that_changes_between_reads_is_read_again_until_it_settles(tmp_path: Path) -> None:
    path = tmp_path / "0"
    states = iter(["", "12", "1234\n", "1234\n"])  # a writer: truncated, half written, whole
    assert stable_text(path, lambda _path: next(states)) == "1234\n"
    never = iter(str(n) for n in range(100))
    assert stable_text(path, lambda _path: next(never)) is None  # still changing after every attempt


def test_a_file_rewritten_while_read_never_yields_a_wrong_job(tmp_path: Path) -> None:
    path = tmp_path / "0"
    path.write_text("111\n")
    stop = threading.Event()

    def rewrite() -> None:  # as a prolog and epilog do: truncate, then write
        while not stop.is_set():
            for text in ("2222222 1000\n", "111\n", ""):
                with path.open("w") as handle:
                    handle.write(text)

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        seen = {read_job_mapping(tmp_path).jobs_of(0) for _ in range(2000)}
    finally:
        stop.set()
        writer.join(10)
    assert seen <= {(), (MappedJob("111"),), (MappedJob("2222222", 1000),)}
