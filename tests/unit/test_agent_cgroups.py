"""Host process -> pod and container from `/proc/<pid>/cgroup` lines, for every layout the kubelet
and the runtimes write (the lines are as the kernel prints them)."""

from __future__ import annotations

import pytest

from ghostgpu.agent.cgroups import ContainerRef, container_of, container_of_path

UID = "5f0c6a1e-8f3b-4b7e-9d2a-0c1e2f3a4b5c"
SD_UID = UID.replace("-", "_")
CID = "3f9a1c0b2d4e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8"
OTHER = "a" * 64
WANT = ContainerRef(UID, CID)


def v2(path: str) -> list[str]:
    return [f"0::{path}\n"]


def v1(path: str, unified: str = "/") -> list[str]:
    """A hybrid host (systemd's v1 controllers plus the unified hierarchy), as this machine has."""
    return [
        f"12:pids:{path}\n",
        f"11:memory:{path}\n",
        f"10:cpu,cpuacct:{path}\n",
        f"9:devices:{path}\n",
        f"1:name=systemd:{path}\n",
        f"0::{unified}\n",
    ]


@pytest.mark.parametrize(
    "path",
    [
        # systemd driver: containerd, CRI-O, docker (cri-dockerd); all three QoS classes.
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice/cri-containerd-{CID}.scope",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SD_UID}.slice/cri-containerd-{CID}.scope",
        f"/kubepods.slice/kubepods-pod{SD_UID}.slice/cri-containerd-{CID}.scope",  # Guaranteed
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice/crio-{CID}.scope",
        f"/kubepods.slice/kubepods-pod{SD_UID}.slice/docker-{CID}.scope",
        # crun's `container` subgroup, a process in a cgroup the container made below its own.
        f"/kubepods.slice/kubepods-pod{SD_UID}.slice/crio-{CID}.scope/container",
        # cgroupfs driver: containerd, CRI-O; all three QoS classes.
        f"/kubepods/burstable/pod{UID}/{CID}",
        f"/kubepods/besteffort/pod{UID}/{CID}",
        f"/kubepods/pod{UID}/{CID}",
        f"/kubepods/burstable/pod{UID}/crio-{CID}",
        # a kubelet cgroupRoot above kubepods (the devcluster's real node has one).
        f"/ghostgpu-real-1a2b3c/kubepods/besteffort/pod{UID}/{CID}",
        f"/custom.slice/kubepods.slice/kubepods-pod{SD_UID}.slice/cri-containerd-{CID}.scope",
        # a reader in a private cgroup namespace (a DaemonSet pod on cgroup v2): relative paths.
        f"/../../../kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice/cri-containerd-{CID}.scope",
        f"/../../../burstable/pod{UID}/{CID}",  # cgroupfs: kubepods itself is above the reader's root
        f"/../../pod{UID}/{CID}",
    ],
)
def test_every_layout_names_the_pod_and_the_container(path: str) -> None:
    assert container_of_path(path) == WANT
    assert container_of(v2(path)) == WANT
    assert container_of(v1(path)) == WANT  # v1, the unified line `0::/` beside it
    assert container_of(v1(path, unified=path)) == WANT  # hybrid with systemd mirroring into unified


@pytest.mark.parametrize(
    "path",
    [
        "/",  # the host's root, or the reader's own cgroup namespace root
        "/../..",
        "/system.slice/containerd.service",
        "/user.slice/user-0.slice/session-1.scope",
        "/kubepods.slice",
        "/kubepods/burstable",
        f"/kubepods/burstable/pod{UID}",  # the pod's own cgroup: no container
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice",
        # CRI-O's conmon monitors the container: not one of its processes.
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice/crio-conmon-{CID}.scope",
        f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}",
        # a container ID that is not 64 hex digits, a UID that is no UID.
        f"/kubepods/pod{UID}/{CID[:12]}",
        f"/kubepods/pod{UID}/cri-containerd-{CID[:-1]}x.scope",
        f"/kubepods/podnot-a-uid/{CID}",
        # a pod-like directory outside any kubepods subtree (podman, a user's own): not the kubelet's.
        f"/machine.slice/pod{UID}/{CID}",
        # the reader's sibling in its own pod: the container, but no pod segment in sight.
        f"/../cri-containerd-{CID}.scope",
        "",
    ],
)
def test_what_is_no_pods_container_matches_nothing(path: str) -> None:
    assert container_of_path(path) is None
    assert container_of(v2(path)) is None
    assert container_of(v1(path)) is None


def test_a_static_pods_uid_is_its_config_hash() -> None:
    h = "8d6a3c2f1e0b9a7c5d4e3f2a1b0c9d8e"
    assert container_of(v2(f"/kubepods/besteffort/pod{h}/{CID}")) == ContainerRef(h, CID)


def test_a_tenant_cgroup_inside_its_container_cannot_name_another_pod() -> None:
    """Only the outermost pod segment and the container right below it count."""
    other_uid = "00000000-1111-2222-3333-444444444444"
    nested = f"/kubepods/burstable/pod{UID}/{CID}/kubepods/pod{other_uid}/{OTHER}"
    assert container_of(v2(nested)) == WANT
    sd = (
        f"/kubepods.slice/kubepods-pod{SD_UID}.slice/cri-containerd-{CID}.scope/"
        f"kubepods-pod{other_uid.replace('-', '_')}.slice/cri-containerd-{OTHER}.scope"
    )
    assert container_of(v2(sd)) == WANT


def test_v1_controllers_that_disagree_place_the_process_nowhere() -> None:
    lines = [
        f"11:memory:/kubepods/pod{UID}/{CID}\n",
        f"10:pids:/kubepods/pod{UID}/{OTHER}\n",
        "0::/\n",
    ]
    assert container_of(lines) is None


def test_v1_controllers_the_runtime_left_at_the_root_are_ignored() -> None:
    lines = [
        "13:misc:/\n",
        "12:rdma:/\n",
        f"11:memory:/kubepods/pod{UID}/{CID}\n",
        "0::/\n",
    ]
    assert container_of(lines) == WANT


def test_garbage_lines_are_ignored() -> None:
    assert container_of(["", "nonsense\n", "1:x\n"]) is None
    assert container_of(["garbage", f"0::/kubepods/pod{UID}/{CID}"]) == WANT
    # A path holding ':' (the third field is the rest of the line).
    assert container_of([f"0::/kubepods/pod{UID}/{CID}/a:b"]) == WANT


def test_the_real_devcluster_nodes_lines() -> None:
    """Copied from /proc/<pid>/cgroup of real containers on the devcluster's real node (kubelet with
    the cgroupfs driver and a cgroupRoot named after its state dir, on this hybrid v1 host)."""
    for lines, want in REAL_NODE_LINES:
        assert container_of(lines) == want


# Printed by tests/e2e/test_real_node.py (test_agent_rows_equal_ps_in_every_real_container): a
# BestEffort pod's container on the real node, every v1 hierarchy and the unified line naming it.
_REAL_UID = "554d0bd5-d5a2-4404-af95-4afa0f77b62a"
_REAL_ID = "ab3b4b4bc654a50beb74649e30d2a928483a6bf8306983984630d36c9d9278cc"
_REAL_PATH = f"/ghostgpu-a9e8f52c8a4c/kubepods/besteffort/pod{_REAL_UID}/{_REAL_ID}"
_REAL_V1 = [
    "9:name=systemd",
    "8:pids",
    "7:blkio",
    "6:freezer",
    "5:devices",
    "4:memory",
    "3:cpuset",
    "2:cpuacct",
    "1:cpu",
    "0:",
]
REAL_NODE_LINES: list[tuple[list[str], ContainerRef | None]] = [
    (
        [f"{h}:{_REAL_PATH}\n" for h in _REAL_V1],
        ContainerRef(_REAL_UID, _REAL_ID),
    ),
    # The node's pod cgroup itself, and the cgroupRoot: no container.
    ([f"{h}:{_REAL_PATH.rsplit('/', 1)[0]}\n" for h in _REAL_V1], None),
    ([f"{h}:/ghostgpu-a9e8f52c8a4c\n" for h in _REAL_V1], None),
]
