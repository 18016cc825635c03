"""The quota variables of a process environment: only they are kept, their formats parse to exact values, and hostile
content leaves fields empty instead of raising."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdash.sampling.host_processes import HostProcessTable
from nvdash.sampling.process_limits import (
    ENVIRON_MAX_BYTES,
    limits_of,
    parse_pinned_limits,
    parse_size,
    quota_variables,
    read_limits,
)
from nvdash.sampling.usage_records import ProcessLimits
from tests.server.kubelet_pods import sleeping

GPU0 = "GPU-98e1c2a4-5b3d-4f6e-8a7b-1c2d3e4f5a6b"
GPU1 = "GPU-3f0b7d1e-9c2a-4e8b-b6d4-7a5e2c1f0d93"
MIB = 1 << 20


def environ(**variables: str) -> bytes:
    return b"".join(f"{name}={value}".encode() + b"\0" for name, value in variables.items())


@pytest.mark.parametrize(("text", "expected"), [
    ("1073741824", 1 << 30), ("1048576k", 1 << 30), ("1024m", 1 << 30), ("1g", 1 << 30), ("1G", 1 << 30),
    ("3000m", 3000 * MIB), ("512M", 512 * MIB), ("2GB", 2 << 30), ("2GiB", 2 << 30),
    ("0", None), ("", None), ("-1g", None), ("1.5g", None), ("1t", None), ("g", None), ("9" * 30, None),
])
def test_sizes_parse_in_powers_of_1024(text: str, expected: int | None) -> None:
    assert parse_size(text) == expected


def test_hami_variables_give_memory_per_ordinal_core_percent_and_the_visible_gpus() -> None:
    variables = quota_variables(environ(
        PATH="/usr/bin", CUDA_DEVICE_MEMORY_LIMIT_0="3000m", CUDA_DEVICE_MEMORY_LIMIT_1="1g",
        CUDA_DEVICE_SM_LIMIT="30", NVIDIA_VISIBLE_DEVICES=f"{GPU0},{GPU1}", AWS_SECRET_ACCESS_KEY="hunter2"))
    assert variables == {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "1g",
                         "CUDA_DEVICE_SM_LIMIT": "30", "NVIDIA_VISIBLE_DEVICES": f"{GPU0},{GPU1}"}
    assert limits_of(variables) == ProcessLimits(hami_memory_bytes=((0, 3000 * MIB), (1, 1 << 30)), hami_core_pct=30.0,
                                                 visible_devices=(GPU0, GPU1))


def test_a_memory_limit_for_all_devices_applies_to_each_visible_one_and_an_indexed_one_wins() -> None:
    limits = limits_of({"CUDA_DEVICE_MEMORY_LIMIT": "2g", "CUDA_DEVICE_MEMORY_LIMIT_1": "512m",
                        "NVIDIA_VISIBLE_DEVICES": f"{GPU0},{GPU1}"})
    assert limits.hami_memory_bytes == ((0, 2 << 30), (1, 512 * MIB))
    assert limits_of({"CUDA_DEVICE_MEMORY_LIMIT": "2g"}).hami_memory_bytes == ((0, 2 << 30),)


def test_sm_limit_0_and_100_set_no_limit() -> None:
    assert limits_of({"CUDA_DEVICE_SM_LIMIT": "0"}).hami_core_pct is None
    assert limits_of({"CUDA_DEVICE_SM_LIMIT": "100"}).hami_core_pct is None
    assert limits_of({"CUDA_DEVICE_SM_LIMIT": "25"}).hami_core_pct == 25.0


def test_mps_variables() -> None:
    limits = limits_of({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33.5", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G,1=512M",
                        "CUDA_VISIBLE_DEVICES": GPU1})
    assert limits == ProcessLimits(mps_thread_pct=33.5, mps_pinned_memory_bytes=((0, 1 << 30), (1, 512 * MIB)),
                                   visible_devices=(GPU1,))
    assert parse_pinned_limits("1=2G, 0=100M,x=1G,2=,3=lots,99=1G") == ((0, 100 * MIB), (1, 2 << 30))


def test_cuda_visible_devices_by_index_are_not_taken_for_uuids() -> None:
    assert limits_of({"CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": "all"}).visible_devices == ()
    assert limits_of({"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": GPU0}).visible_devices == (GPU0,)


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "101", "lots", "", "1e400", "\x00"])
def test_garbage_percentages_are_none(value: str) -> None:
    limits = limits_of({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": value, "CUDA_DEVICE_SM_LIMIT": value})
    assert (limits.mps_thread_pct, limits.hami_core_pct) == (None, None)


def test_hostile_environ_bytes_never_raise() -> None:
    hostile = (b"\xff\xfe=\x00CUDA_DEVICE_SM_LIMIT=\xff50\0=\0\0\0CUDA_DEVICE_MEMORY_LIMIT_0=" + b"9" * 10000 + b"\0"
               b"CUDA_DEVICE_MEMORY_LIMIT_999=1g\0NOEQUALS\0CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40\0"
               b"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=90\0")
    assert quota_variables(hostile) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40"}
    assert limits_of(quota_variables(hostile)) == ProcessLimits(mps_thread_pct=40.0)


def test_a_variable_cut_by_the_read_bound_is_dropped() -> None:
    assert quota_variables(b"CUDA_DEVICE_SM_LIMIT=5", truncated=True) == {}
    assert quota_variables(b"CUDA_DEVICE_SM_LIMIT=5\0CUDA_MPS", truncated=True) == {"CUDA_DEVICE_SM_LIMIT": "5"}


@pytest.fixture
def child_with_env() -> Iterator[subprocess.Popen[bytes]]:
    env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_SM_LIMIT": "30", "NVIDIA_VISIBLE_DEVICES": GPU0,
           "SECRET_TOKEN": "s3cr3t"}
    with sleeping(1, [env]) as (child,):  # returned once exec'd: its /proc/PID/environ is its own
        yield child


def test_a_real_process_environment_is_read_and_the_host_table_keeps_its_limits(
        child_with_env: subprocess.Popen[bytes]) -> None:
    expected = ProcessLimits(hami_memory_bytes=((0, 3000 * MIB),), hami_core_pct=30.0, visible_devices=(GPU0,))
    assert read_limits("/proc", child_with_env.pid) == expected
    found = HostProcessTable().lookup([child_with_env.pid, os.getpid()])
    assert found[child_with_env.pid].limits == expected
    assert found[os.getpid()].limits is not None
    assert "s3cr3t" not in repr(found)


def test_an_unreadable_or_huge_environ_gives_none_or_the_bounded_part(tmp_path: Path) -> None:
    assert read_limits(tmp_path, 4242) is None
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "environ").write_bytes(b"CUDA_DEVICE_SM_LIMIT=20\0" + b"X=" + b"y" * ENVIRON_MAX_BYTES
                                             + b"\0CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10\0")
    assert read_limits(tmp_path, 7) == ProcessLimits(hami_core_pct=20.0)
    (tmp_path / "8").mkdir()
    os.mkfifo(tmp_path / "8" / "environ")
    assert read_limits(tmp_path, 8) is None
    assert sys.maxsize  # the FIFO read returned at once
