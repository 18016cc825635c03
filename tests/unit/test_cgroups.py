"""parse_cgroup over one real-format /proc/PID/cgroup per layout; read_cgroup; pod names from kubelet logs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from nvdash.sampling.cgroups import parse_cgroup, parse_cgroup_path, pod_names_from_logs, read_cgroup
from nvdash.sampling.usage_records import CgroupIdentity

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
NONE = CgroupIdentity()

EXPECTED = {
    "docker-cgroupfs-v1.txt": CgroupIdentity(
        runtime="docker", container_id="18b2165de3e24c0e7d015221933f17a91a5ca412b64dcf1fcadf8f5512b306ce"
    ),
    "docker-systemd-v2.txt": CgroupIdentity(
        runtime="docker", container_id="52c0eba852b8d5db0133bcce0d1fb2e51ef51c97632f0878176633f92f21eac8"
    ),
    "containerd-service-k8s-v1.txt": CgroupIdentity(
        runtime="containerd",
        container_id="697ace61dc7aa7b887eb13373813d0fceb1a035559db90c676cf996e5434c9a2",
        pod_uid="07c957d9-b028-49f9-8950-907baa0621ba",
        qos="besteffort",
    ),
    "k8s-systemd-containerd-burstable-v2.txt": CgroupIdentity(
        runtime="containerd",
        container_id="5ad28d4a38217056f391f190a6b6bffe375422f8bfe348bc672bc1027d682d21",
        pod_uid="0c7850d9-5226-4895-8d5b-46cabe2f0f2b",
        qos="burstable",
    ),
    "k8s-systemd-containerd-guaranteed-v2.txt": CgroupIdentity(
        runtime="containerd",
        container_id="e63374e355ccd784cff7ec469d8ac4dbc1e2f57e8c90dc0d2e4fc3ce298c7f31",
        pod_uid="e5bf3db8-617c-4a1b-ab35-60aea32d913e",
        qos="guaranteed",
    ),
    "k8s-systemd-crio-besteffort-v2.txt": CgroupIdentity(
        runtime="cri-o",
        container_id="b2cc988ac046c13e3084f0fa4b7790935ec832be38ccf453305ec088b2c4ab0b",
        pod_uid="1115d70b-c926-4810-acbe-f427cd64eb35",
        qos="besteffort",
    ),
    "k8s-systemd-crio-conmon-v2.txt": CgroupIdentity(pod_uid="1115d70b-c926-4810-acbe-f427cd64eb35", qos="besteffort"),
    "k8s-systemd-static-pod-v2.txt": CgroupIdentity(
        runtime="containerd",
        container_id="793bcb0f2bdde45a23c80ae9c53e703f2da842482ad3e851c5ccdf506b93c51a",
        pod_uid="69681279cb81bc89e4e367fb898dc307",
        qos="burstable",
    ),
    "k8s-systemd-dockershim-v1.txt": CgroupIdentity(
        runtime="docker",
        container_id="7edf3dde6c6289a245f7d7d75e84de11c413a9bc531de778c9093066e9230ca0",
        pod_uid="4ced3e39-23bc-4595-bac5-b0ba85555808",
        qos="burstable",
    ),
    "k8s-cgroupfs-burstable-v1.txt": CgroupIdentity(
        container_id="b1145d0d8db2b0b516861e75c17137e516c3f846d1232ebcc082ebd17f40a99b",
        pod_uid="7d0ce1c4-0e41-4c7b-bdbe-0ecc607549ac",
        qos="burstable",
    ),
    "k8s-cgroupfs-guaranteed-v1.txt": CgroupIdentity(
        container_id="7adc9f86525ad0c644f9a2b3a35032ce7ae9f82f292b3f6ea04e206250a99f61",
        pod_uid="e5bf3db8-617c-4a1b-ab35-60aea32d913e",
        qos="guaranteed",
    ),
    "k8s-cgroupfs-besteffort-v1.txt": CgroupIdentity(
        container_id="61fd264a31c9ad4afb398bea64689cc316f54fa51c5d27ca922b01d02ab6a950",
        pod_uid="07c957d9-b028-49f9-8950-907baa0621ba",
        qos="besteffort",
    ),
    "k8s-cgroupfs-crio-v1.txt": CgroupIdentity(
        runtime="cri-o",
        container_id="0d222c69068e0cb91d541082d71cecdc633d11cecc4b0a4cbcb6065605ad2456",
        pod_uid="0c7850d9-5226-4895-8d5b-46cabe2f0f2b",
        qos="burstable",
    ),
    "podman-rootful-v2.txt": CgroupIdentity(
        runtime="podman", container_id="448357656cb26bfcc0ff849ab0b6527a13b92d3d97e687acb4a5cec1a1c9ea0b"
    ),
    "podman-rootless-v2.txt": CgroupIdentity(
        runtime="podman", container_id="c19f89bb8a180036e700d871ac9df81df9ecf7d929b6e9ec6a2a119e78c9d4ed"
    ),
    "podman-conmon-v2.txt": NONE,
    "slurm-v1.txt": CgroupIdentity(slurm_job="4242"),
    "slurm-v2.txt": CgroupIdentity(slurm_job="98765"),
    "host-session-v2.txt": NONE,
    "host-init-v2.txt": NONE,
    "host-session-v1.txt": NONE,
    "sandbox-hybrid-v1.txt": NONE,
}


def test_every_fixture_has_an_expectation() -> None:
    assert {path.name for path in FIXTURES.glob("*.txt")} - {"README.txt"} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_parses_to_expected_identity(name: str) -> None:
    assert parse_cgroup((FIXTURES / name).read_text(encoding="utf-8")) == EXPECTED[name]


@pytest.mark.parametrize(("version", "lines"), [("v1", 13), ("v2", 1)])
def test_fixture_files_have_the_real_shape(version: str, lines: int) -> None:
    """v1 files list the twelve hierarchies and the hybrid 0:: line; v2 files the single 0:: line."""
    for path in FIXTURES.glob(f"*-{version}.txt"):
        text = path.read_text(encoding="utf-8")
        rows = text.splitlines()
        assert text.endswith("\n"), path.name
        if path.name != "sandbox-hybrid-v1.txt":
            assert len(rows) == lines, path.name
        assert rows[-1].startswith("0::/"), path.name
        assert all(row.split(":", 2)[0].isdigit() for row in rows), path.name


def test_in_container_follows_the_identity() -> None:
    assert parse_cgroup((FIXTURES / "docker-systemd-v2.txt").read_text()).in_container
    assert parse_cgroup((FIXTURES / "k8s-systemd-crio-conmon-v2.txt").read_text()).in_container
    assert not parse_cgroup((FIXTURES / "slurm-v2.txt").read_text()).in_container


def test_v1_prefers_the_line_that_identifies_over_an_unmanaged_systemd_line() -> None:
    text = (FIXTURES / "slurm-v1.txt").read_text()
    assert "name=systemd:/system.slice/slurmd.service" in text
    assert parse_cgroup(text).slurm_job == "4242"


def test_tied_lines_go_to_the_memory_hierarchy() -> None:
    docker_a = "a" * 64
    docker_b = "b" * 64
    text = f"3:pids:/docker/{docker_a}\n2:memory:/docker/{docker_b}\n1:name=systemd:/docker/{docker_a}\n"
    assert parse_cgroup(text) == CgroupIdentity(runtime="docker", container_id=docker_b)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # Multiple slurmd per host: the scope and the v1 root carry the node name.
        ("/system.slice/node07_slurmstepd.scope/job_17/step_batch/user/task_0", CgroupIdentity(slurm_job="17")),
        ("/slurm_node07/uid_1001/job_18/step_extern", CgroupIdentity(slurm_job="18")),
        # A stepd itself, outside the user's tasks, is still in the job.
        ("/system.slice/slurmstepd.scope/job_19/step_0/slurm", CgroupIdentity(slurm_job="19")),
        # A job_ directory outside Slurm's hierarchy is not a Slurm job.
        ("/user.slice/job_20", NONE),
        # kind: a Kubernetes node that is itself a Docker container; the innermost container wins.
        (
            f"/docker/{'c' * 64}/kubepods/besteffort/pod07c957d9-b028-49f9-8950-907baa0621ba/{'d' * 64}",
            CgroupIdentity(container_id="d" * 64, pod_uid="07c957d9-b028-49f9-8950-907baa0621ba", qos="besteffort"),
        ),
        # kind with the systemd driver prefixes the kubelet's slices with "kubelet-".
        (
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-"
            f"pod07c957d9_b028_49f9_8950_907baa0621ba.slice/cri-containerd-{'e' * 64}.scope",
            CgroupIdentity(
                runtime="containerd",
                container_id="e" * 64,
                pod_uid="07c957d9-b028-49f9-8950-907baa0621ba",
                qos="besteffort",
            ),
        ),
        # Docker's own daemon and containerd's service are not containers.
        ("/system.slice/docker.service", NONE),
        ("/system.slice/containerd.service", NONE),
        # A pod<uid> name outside kubepods is not a pod; short ids are not container ids.
        ("/pod07c957d9-b028-49f9-8950-907baa0621ba/x", NONE),
        (f"/system.slice/docker-{'f' * 12}.scope", NONE),
        (f"/machine.slice/libpod-{'0' * 64}.scope (deleted)", CgroupIdentity(runtime="podman", container_id="0" * 64)),
    ],
)
def test_cgroup_paths(path: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup_path(path) == expected
    assert parse_cgroup(f"0::{path}\n") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "garbage",
        "::::",
        "0::",
        "x:memory:/docker/" + "a" * 64,
        "1:memory:docker/" + "a" * 64,
        "\x00\xff\ufffd" * 50,
        "1:memory:/" + "/".join(["kubepods"] * 5000),
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podnot-a-uid.slice/cri-containerd-xyz.scope",
    ],
)
def test_garbage_gives_no_identity(text: str) -> None:
    assert parse_cgroup(text) == NONE


def _write_cgroup(proc_root: Path, pid: int, text: str) -> None:
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "cgroup").write_text(text, encoding="utf-8")


def test_read_cgroup_from_a_fake_proc_root(tmp_path: Path) -> None:
    name = "k8s-systemd-containerd-burstable-v2.txt"
    _write_cgroup(tmp_path, 4321, (FIXTURES / name).read_text())
    assert read_cgroup(tmp_path, 4321) == EXPECTED[name]


def test_read_cgroup_of_a_missing_or_unreadable_process(tmp_path: Path) -> None:
    assert read_cgroup(tmp_path, 99) == NONE
    (tmp_path / "7" / "cgroup").mkdir(parents=True)  # a directory where the file should be
    assert read_cgroup(tmp_path, 7) == NONE
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_bytes(b"\xff\xfe0::/\x00garbage")
    assert read_cgroup(tmp_path, 8) == NONE


def test_read_cgroup_of_this_process_agrees_with_its_own_file() -> None:
    text = Path("/proc/self/cgroup").read_text()
    identity = read_cgroup(Path("/proc"), os.getpid())
    assert identity == parse_cgroup(text)
    if not any(word in text for word in ("docker", "kubepods", "containerd", "crio", "libpod", "slurm")):
        assert identity == NONE


def test_pod_names_from_kubelet_log_directories(tmp_path: Path) -> None:
    for name in (
        "kube-system_kube-proxy-6xsx9_81e09ae0-12ec-4ec5-94b8-51cda7906370",
        "ml-team_trainer-0_07c957d9-b028-49f9-8950-907baa0621ba",
        "kube-system_kube-apiserver-node1_33d556edd3ae8ef21980288cef77ae8b",
        "0c7850d9-5226-4895-8d5b-46cabe2f0f2b",  # the pre-1.14 layout: a bare UID, no names
        "a_b",
        "_x_y",
    ):
        (tmp_path / name).mkdir()
    (tmp_path / "default_not-a-dir_1115d70b-c926-4810-acbe-f427cd64eb35").write_text("")
    assert pod_names_from_logs(tmp_path) == {
        "81e09ae0-12ec-4ec5-94b8-51cda7906370": ("kube-system", "kube-proxy-6xsx9"),
        "07c957d9-b028-49f9-8950-907baa0621ba": ("ml-team", "trainer-0"),
        "33d556edd3ae8ef21980288cef77ae8b": ("kube-system", "kube-apiserver-node1"),
    }


def test_pod_names_without_a_log_directory(tmp_path: Path) -> None:
    assert pod_names_from_logs(tmp_path / "missing") == {}
    (tmp_path / "file").write_text("")
    assert pod_names_from_logs(tmp_path / "file") == {}


def test_read_cgroup_refuses_a_fifo_and_a_link_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    os.mkfifo(tmp_path / "7" / "cgroup")
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").symlink_to("/dev/zero")
    found: list[CgroupIdentity] = []
    thread = threading.Thread(target=lambda: found.extend(read_cgroup(tmp_path, pid) for pid in (7, 8)), daemon=True)
    thread.start()
    thread.join(30.0)
    assert found == [NONE, NONE]


def test_pod_names_follow_no_links(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    logs = tmp_path / "pods"
    logs.mkdir()
    (logs / "ml-team_trainer-0_07c957d9-b028-49f9-8950-907baa0621ba").mkdir()
    (logs / "evil_linked_81e09ae0-12ec-4ec5-94b8-51cda7906370").symlink_to(real)
    os.mkfifo(logs / "evil_fifo_33d556edd3ae8ef21980288cef77ae8b")
    assert pod_names_from_logs(logs) == {"07c957d9-b028-49f9-8950-907baa0621ba": ("ml-team", "trainer-0")}
