"""The real node's configuration and its host bookkeeping, without starting anything (the real
node itself runs in tests/e2e/test_real_node.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import tomllib
from pathlib import Path

import pytest

from ghostgpu.devcluster import realnode
from ghostgpu.devcluster.nodes import default_nodes


def test_each_state_dir_gets_its_own_cgroup_root(tmp_path: Path) -> None:
    a, b = realnode.cgroup_root_name(tmp_path / "a"), realnode.cgroup_root_name(tmp_path / "b")
    assert a != b and a.startswith("ghostgpu-")
    assert realnode.cgroup_root_name(tmp_path / "a") == a


def test_the_real_node_is_a_node_of_the_first_gpu_flavor_that_only_its_tests_tolerate() -> None:
    spec = realnode.gpu_node_spec(default_nodes())
    assert spec.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert spec.labels[realnode.REAL_NODE_LABEL] == "true"
    assert [t.key for t in spec.taints] == ["nvidia.com/gpu", realnode.REAL_NODE_LABEL]
    assert spec.name == "localhost" and spec.gpus > 0


def test_containerd_keeps_everything_under_the_state_dir_and_serves_loopback_only(tmp_path: Path) -> None:
    lay = realnode.Layout(tmp_path)
    cfg = tomllib.loads(
        realnode.containerd_config(lay, Path("/usr/sbin/runc"), tmp_path / "cni", "pause:1", 4242)
    )
    assert cfg["root"].startswith(str(tmp_path)) and cfg["state"].startswith(str(tmp_path))
    assert cfg["grpc"]["address"] == str(lay.socket)
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "pause:1"
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE in the VM
    assert (cri["stream_server_address"], cri["stream_server_port"]) == ("127.0.0.1", "4242")
    assert cri["containerd"]["runtimes"]["runc"]["options"]["Root"] == str(lay.runc_root)
    assert "io.containerd.internal.v1.opt" in cfg["disabled_plugins"]  # would write /opt/containerd


def test_kubelet_listens_on_loopback_in_its_own_cgroup_root(tmp_path: Path) -> None:
    lay = realnode.Layout(tmp_path)
    spec = realnode.gpu_node_spec(default_nodes())
    cfg = realnode.kubelet_config(lay, 1, 2, Path("ca"), Path("c"), Path("k"), spec)
    assert (cfg["address"], cfg["healthzBindAddress"], cfg["readOnlyPort"]) == ("127.0.0.1", "127.0.0.1", 0)
    assert cfg["cgroupRoot"] == "/" + lay.cgroup_root
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert {t["key"] for t in cfg["registerWithTaints"]} == {"nvidia.com/gpu", realnode.REAL_NODE_LABEL}
    assert cfg["podLogsDir"].startswith(str(tmp_path))  # not /var/log/pods


@pytest.fixture
def fake_sysctls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    files = {}
    for name in realnode.HOST_SYSCTLS:
        f = tmp_path / "proc" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("0\n")
        files[name] = f
    monkeypatch.setattr(realnode, "_sysctl_path", lambda n: files[n])
    monkeypatch.setattr(realnode, "LEDGER_DIR", tmp_path / "run")
    return files


def test_the_last_real_node_to_stop_puts_the_host_sysctls_back(
    fake_sysctls: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    running = {a, b}
    monkeypatch.setattr(realnode, "kubelet_running", lambda d: d in running)
    realnode.hold_sysctls(a)
    fake_sysctls["kernel.panic_on_oops"].write_text("1\n")  # what a's kubelet does
    realnode.hold_sysctls(b)  # b must not take the kubelet's value for the host's
    running.discard(a)
    assert realnode.release_sysctls(a) == {}
    assert fake_sysctls["kernel.panic_on_oops"].read_text().strip() == "1"  # b's kubelet still runs
    running.discard(b)
    restored = realnode.release_sysctls(b)
    assert restored["kernel.panic_on_oops"] == "0"
    assert fake_sysctls["kernel.panic_on_oops"].read_text().strip() == "0"
    assert realnode.release_sysctls(b) == {}  # twice is harmless


def test_a_killed_holder_does_not_keep_the_sysctls_changed(
    fake_sysctls: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(realnode, "kubelet_running", lambda d: False)  # both runs were kill -9'd
    realnode.hold_sysctls(tmp_path / "a")
    realnode.hold_sysctls(tmp_path / "b")
    fake_sysctls["vm.overcommit_memory"].write_text("1\n")
    assert realnode.release_sysctls(tmp_path / "a")["vm.overcommit_memory"] == "0"
    assert fake_sysctls["vm.overcommit_memory"].read_text().strip() == "0"


def test_a_shims_socket_is_named_the_way_containerd_1_6_names_it() -> None:
    cmd = "-namespace k8s.io -id abc -address /s/containerd.sock"
    [sock] = realnode.shim_sockets(Path("/s/containerd.sock"), cmd)
    assert sock.parent == realnode.SHIM_SOCKET_DIR and len(sock.name) == 64
    assert realnode.shim_sockets(Path("/s/containerd.sock"), "-address /s/containerd.sock") == []


def found(state_dir: Path) -> int | None:
    """The stand-in daemon's pid once its command line is readable: `Popen` returns after fork,
    and until the child's exec the kernel shows the parent's command line."""
    deadline = time.monotonic() + 10
    while (pid := realnode.daemon_pid(state_dir, "containerd")) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid


def test_a_node_daemon_restarts_as_it_ran_and_only_this_state_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop_daemon finds the daemon by its config flag (another state dir's is not it), and
    start_daemon runs the same command line and environment again, found the same way."""
    import subprocess
    import sys

    with pytest.raises(ValueError, match="not one of"):
        realnode.stop_daemon(tmp_path, "etcd")
    with pytest.raises(RuntimeError, match="not running"):
        realnode.stop_daemon(tmp_path, "containerd")
    lay = realnode.Layout(tmp_path)
    lay.dir.mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    # A stand-in named `containerd` (a python interpreter under that name) with this state dir's config.
    fake = tmp_path / "bin" / "containerd"
    fake.parent.mkdir()
    fake.symlink_to(sys.executable)
    argv = [str(fake), "-c", "import time; time.sleep(60)", f"--config={lay.containerd_config}"]
    first = subprocess.Popen(argv, env={"MARK": "kept"})
    try:
        pid = found(tmp_path)
        assert pid == first.pid
        assert realnode.daemon_pid(tmp_path / "other", "containerd") is None
        launch = realnode.stop_daemon(tmp_path, "containerd")
        first.wait(10)
        assert launch.argv == argv and launch.env.get("MARK") == "kept"
        assert realnode.daemon_pid(tmp_path, "containerd") is None
        again = realnode.start_daemon(tmp_path, launch).pid
        assert found(tmp_path) == again != pid
        assert "MARK=kept" in Path(f"/proc/{again}/environ").read_bytes().decode(errors="replace")
    finally:
        for p in (realnode.daemon_pid(tmp_path, "containerd"), first.pid):
            if p is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)


def test_a_kind_node_holds_the_sysctls_until_its_cluster_is_deleted(
    fake_sysctls: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kind's kubelet runs in a node container, not among the host's processes: its state dir's
    mark keeps it a holder while a real node's release runs, and its own release puts them back."""
    monkeypatch.setattr(realnode, "kubelet_running", lambda d: False)
    kind, real = tmp_path / "kind", tmp_path / "real"
    kind.mkdir()
    (kind / realnode.CONTAINER_NODE_MARK).touch()
    realnode.hold_sysctls(kind)
    fake_sysctls["kernel.panic"].write_text("10\n")  # what the node container's kubelet does
    realnode.hold_sysctls(real)
    assert realnode.release_sysctls(real) == {}
    assert fake_sysctls["kernel.panic"].read_text().strip() == "10"
    (kind / realnode.CONTAINER_NODE_MARK).unlink()
    assert realnode.release_sysctls(kind)["kernel.panic"] == "0"
    assert fake_sysctls["kernel.panic"].read_text().strip() == "0"
