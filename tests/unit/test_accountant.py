"""The accountant follows snapshots and a real job-mapping directory into the ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvdash.accounting.accountant import Accountant
from nvdash.sampling.job_mapping import JobMapping, read_job_mapping
from nvdash.sampling.records import GpuSample, HostSample, Snapshot
from nvdash.sampling.usage_records import Usage


class Names:
    def user(self, uid: int) -> str | None:
        return {1000: "alice"}.get(uid)

    def group_of(self, user: str) -> str | None:
        return "physics" if user == "alice" else None


def snapshot(time_s: float, energy_mj: int, usage: Usage) -> Snapshot:
    gpu = GpuSample(index=0, utilization_pct=100.0, memory_used_bytes=1 << 30, energy_mj=energy_mj)
    return Snapshot(time_s=time_s, gpus=(gpu,), host=HostSample(), usage=usage)


def test_jobs_of_the_mapping_directory_get_the_gpu_and_it_is_read_once_per_usage_reading(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("555 1000\n")
    reads: list[Path] = []

    def counted(directory: Path) -> JobMapping:
        reads.append(directory)
        return read_job_mapping(directory)

    accountant = Accountant({0: "GPU-a"}, job_mapping_dir=tmp_path, names=Names(), read_mapping=counted)
    first = Usage(time_s=0.0)
    accountant.step(snapshot(0.0, 0, first))
    shares = accountant.step(snapshot(1.0, 2_000, first))
    assert [share.owner.job for share in shares] == ["555"]
    (tmp_path / "0").write_text("556\n")  # the next job's prolog
    accountant.step(snapshot(2.0, 3_000, first))
    assert len(reads) == 1, "the same usage reading: the directory is not read again"
    accountant.step(snapshot(3.0, 7_000, Usage(time_s=3.0)))
    assert len(reads) == 2
    tallies = {owner.job: tally for owner, _, tally in accountant.tallies()}
    assert tallies["555"].allocated_s == pytest.approx(2.0)
    assert tallies["555"].energy_j == pytest.approx(3.0)
    assert tallies["556"].allocated_s == pytest.approx(1.0)
    assert tallies["556"].energy_j == pytest.approx(4.0)
    owner = next(owner for owner, _, _ in accountant.tallies() if owner.job == "555")
    assert (owner.user, owner.project) == ("alice", "physics")


def test_without_a_directory_or_usage_nothing_is_owned() -> None:
    accountant = Accountant({0: "GPU-a"})
    accountant.step(Snapshot(time_s=0.0, gpus=(GpuSample(index=0),), host=HostSample()))
    accountant.step(Snapshot(time_s=1.0, gpus=(GpuSample(index=0),), host=HostSample()))
    assert accountant.tallies() == []
    assert accountant.mapping is None
