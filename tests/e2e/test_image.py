"""End to end: the controller *from the image* (hack/build-image), run the way the rendered Deployment
(controller/deployment.yaml) runs it, against the devcluster for one shadow window.

The container is set up from that Deployment, not from a copy of it: its args (through the image's
ENTRYPOINT), env, runAsUser/runAsGroup, readOnlyRootFilesystem and volumeMounts (the ConfigMap as a
read-only directory holding the test's config under the Deployment's key, each emptyDir as a directory
the nonroot user owns). Only what a test outside the cluster needs is added: a kubeconfig (read-only,
instead of the service-account token), --port 0 on 127.0.0.1 (host network), and the short lease
timings of tests/e2e/test_controller.py, whose helpers this file reuses.

buildah 1.28 has no --read-only: the container's own overlay mount is remounted read-only before
`buildah run` (in a private mount namespace, with /run on a tmpfs for buildah's /run/.containerenv),
so a write outside the mounted volumes fails with EROFS as it would under the kubelet.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import signal
import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import yaml
from test_controller import (
    FINISHED,
    LEASE_NS,
    LIVE,
    WINDOW,
    Controller,
    Scenario,
    controller_config,
    wait_for,
)

from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessTables

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "controller" / "deployment.yaml"
DECISION_DIR = "/var/lib/ghostgpu"  # `ghostgpu controller --decision-log` default


@dataclass(frozen=True)
class Image:
    name: str
    buildah: list[str]  # buildah with the storage flags of hack/build-image

    def run(self, *args: str) -> str:
        env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
        return subprocess.run(
            [*self.buildah, *args], capture_output=True, text=True, check=True, env=env
        ).stdout.strip()


@pytest.fixture(scope="session")
def image() -> Image:
    """The image of the current sources; hack/test builds it (cached) before pytest."""
    out = subprocess.run(
        [str(REPO / "hack" / "build-image"), "--print"], capture_output=True, text=True, check=True
    ).stdout
    info = dict(line.split("=", 1) for line in out.splitlines())
    missing = None
    if os.geteuid() != 0:
        missing = "needs root (buildah run, a private mount namespace)"
    elif info["BUILT"] != "1":
        missing = f"{info['IMAGE']} is not built: run hack/build-image"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} (hack/test builds it; CI must not skip)")
        pytest.skip(missing)
    return Image(info["IMAGE"], shlex.split(info["BUILDAH"]))


def rendered_deployment() -> dict[str, Any]:
    return yaml.safe_load(DEPLOYMENT.read_text())


def self_contained_kubeconfig(src: Path, dst: Path) -> Path:
    """The devcluster's kubeconfig with its certificate files inlined (they live outside the container)."""
    cfg = yaml.safe_load(src.read_text())
    for section, key in (("clusters", "cluster"), ("users", "user")):
        for entry in cfg[section]:
            body = entry[key]
            for field in ("certificate-authority", "client-certificate", "client-key"):
                if field in body:
                    body[f"{field}-data"] = base64.b64encode(Path(body.pop(field)).read_bytes()).decode()
    dst.write_text(yaml.safe_dump(cfg))
    dst.chmod(0o644)  # the container's user is not the file's owner
    return dst


class Pod:
    """One container of the rendered Deployment, run from the image with `buildah run`."""

    KUBECONFIG_DIR = "/var/run/ghostgpu-e2e"  # the test's stand-in for the service-account mount

    def __init__(self, image: Image, tmp: Path, name: str, config: Path | None, kubeconfig: Path) -> None:
        self.image, self.name = image, name
        pod = rendered_deployment()["spec"]["template"]["spec"]
        [self.container] = pod["containers"]
        sec = {**pod.get("securityContext", {}), **self.container.get("securityContext", {})}
        self.user = f"{sec['runAsUser']}:{sec['runAsGroup']}"
        self.read_only = bool(sec.get("readOnlyRootFilesystem"))
        self.volumes: dict[str, Path] = {}  # mountPath -> host directory
        self.options: list[str] = []
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in self.container["volumeMounts"]:
            vol, path = volumes[mount["name"]], mount["mountPath"]
            host = tmp / f"{name}-vol-{mount['name']}"
            host.mkdir()
            if "configMap" in vol:  # the test's config under the key the Deployment's args name
                assert config is not None, "this Deployment mounts a ConfigMap: pass a config"
                key = Path(self.args()[self.args().index("--config") + 1])
                assert key.parent == Path(path), "the --config file lives in the ConfigMap mount"
                (host / key.name).write_text(config.read_text())
                (host / key.name).chmod(0o644)
            elif "emptyDir" in vol:  # a node directory the pod's user (fsGroup) may write
                os.chown(host, sec["runAsUser"], sec.get("fsGroup", sec["runAsGroup"]))
            else:
                raise AssertionError(f"volume {mount['name']}: only configMap and emptyDir are mapped")
            ro = ":ro" if mount.get("readOnly") else ""
            self.options += ["-v", f"{host}:{path}{ro}"]
            self.volumes[path] = host
        kube_dir = tmp / f"{name}-kube"
        kube_dir.mkdir()
        self.kubeconfig = self_contained_kubeconfig(kubeconfig, kube_dir / "kubeconfig")
        self.options += ["-v", f"{kube_dir}:{self.KUBECONFIG_DIR}:ro"]
        for env in self.container.get("env", []):  # the downward API, as the kubelet fills it
            field = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            value = {"metadata.name": name, "metadata.namespace": LEASE_NS}.get(field, env.get("value"))
            self.options += ["--env", f"{env['name']}={value}"]
        self.ctr = image.run(
            "from", "--quiet", "--name", f"ghostgpu-e2e-{name}-{uuid.uuid4().hex[:6]}", image.name
        )
        try:
            self.rootfs = Path(image.run("mount", self.ctr))
            # Mount points, as the runtime makes them before the root goes read-only.
            for path in [*self.volumes, self.KUBECONFIG_DIR, "/run"]:
                (self.rootfs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        except BaseException:
            self.remove()
            raise

    def args(self) -> list[str]:
        return list(self.container["args"])

    def command(self, argv: list[str], *, entrypoint: bool = True) -> list[str]:
        """The host command that runs `argv` in the container (after the image's ENTRYPOINT)."""
        if entrypoint:
            inspected = json.loads(self.image.run("inspect", "--type", "image", self.image.name))
            argv = [*inspected["OCIv1"]["config"]["Entrypoint"], *argv]
        run = [*self.image.buildah, "run", "--network", "host", "--user", self.user, "--cap-drop", "all",
               *self.options, self.ctr, "--", *argv]  # fmt: skip
        root = shlex.quote(str(self.rootfs))
        setup = f"mount -t tmpfs -o mode=755,size=1m tmpfs {root}/run"
        if self.read_only:
            setup += f" && mount -o remount,ro {root}"
        script = f"{setup} && BUILDAH_ISOLATION=chroot exec {shlex.join(run)}"
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]

    def remove(self) -> None:
        res = subprocess.run(
            [*self.image.buildah, "rm", self.ctr], capture_output=True, text=True, check=False
        )
        if res.returncode != 0:  # a teardown problem, not the test's verdict
            warnings.warn(f"buildah rm {self.ctr}: {res.stderr.strip()}", stacklevel=1)


class ImageController(Controller):
    """`ghostgpu controller` in the image; the port, metrics and poll helpers are Controller's."""

    def __init__(self, image: Image, kubeconfig: Path, config: Path, tmp: Path, name: str) -> None:
        self._port = None
        self.name = name
        self.log_path = tmp / f"{name}.log"
        self.pod = Pod(image, tmp, name, config, kubeconfig)
        try:
            self._start(tmp)
        except BaseException:
            self.pod.remove()
            raise

    def _start(self, tmp: Path) -> None:
        args = [*self.pod.args(), "--kubeconfig", f"{Pod.KUBECONFIG_DIR}/kubeconfig",
                "--host", "127.0.0.1", "--port", "0", "--lease-namespace", LEASE_NS,
                "--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "1"]  # fmt: skip
        # The decision log stays at its default path, which the Deployment must give a volume.
        state = self.pod.volumes.get(DECISION_DIR, tmp / "no-volume-at-the-decision-log")
        self.decisions = state / "decisions.jsonl"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(self.pod.command(args), stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        # buildah run kills (does not forward to) its child when signalled: send the kubelet's
        # SIGTERM straight to the controller, the innermost process, and let it shut down.
        if self.proc.poll() is None:
            os.kill(innermost(self.proc.pid), sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        super().stop(sig)
        self.pod.remove()


def innermost(pid: int) -> int:
    """The first child's first child's ... of pid (buildah -> its chroot runtime -> the process).
    Go starts children from any thread: look at every task's children, not the main thread's."""
    while True:
        kids = sorted(
            int(k) for t in Path(f"/proc/{pid}/task").glob("*") for k in (t / "children").read_text().split()
        )
        if not kids:
            return pid
        pid = kids[0]


class TwoWorkloads(Scenario):
    """One finished ghost and one busy trainer in an opted-in namespace."""

    STATEFUL: ClassVar[frozenset[str]] = frozenset()
    BARE: ClassVar[frozenset[str]] = frozenset()
    FLEET: ClassVar[dict[str, tuple[float | None, list[Any], str]]] = {
        "finished": (0.0, FINISHED, "FINISHED_IDLE"),
        "busy": (80.0, LIVE, "ACTIVE"),
    }
    PLAIN_BUSY: ClassVar[frozenset[str]] = frozenset({"busy"})  # its verdict is not written


@pytest.fixture
def two_workloads(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
) -> Iterator[TwoWorkloads]:
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    sc = TwoWorkloads(devcluster, make_namespace({}, prefix="image"), process_tables, dcgm)
    sc.create()
    yield sc
    for pod in sc.pods.values():
        process_tables.clear(sc.ns, pod)


def test_image_runs_nonroot_on_a_read_only_root(image: Image, devcluster: DevCluster, tmp_path: Path) -> None:
    """What the Deployment's securityContext promises, checked inside the container it makes."""
    probe = """
import json, os, sys, sysconfig, pathlib
out = {"uid": os.getuid(), "gid": os.getgid(), "home": os.environ["HOME"],
       "dont_write_bytecode": sys.flags.dont_write_bytecode, "writable": {}}
for path in ["/probe", "/opt/ghostgpu/probe", "/etc/ghostgpu/probe", "/tmp/probe", "/var/lib/ghostgpu/probe"]:
    try:
        pathlib.Path(path).write_text("x")
        out["writable"][path] = True
    except OSError as exc:
        out["writable"][path] = exc.strerror
import ghostgpu.cli, ghostgpu.controller.app  # noqa: E401 (imports from bytecode only)
site = pathlib.Path(sysconfig.get_paths()["purelib"])
pycs = list(site.rglob("*.pyc"))
tag = sys.implementation.cache_tag
out["py_without_pyc"] = [
    str(p) for p in site.rglob("*.py") if not (p.parent / "__pycache__" / f"{p.stem}.{tag}.pyc").exists()]
# Every module the controller imported (standard library included) came from an existing .pyc.
out["imported_without_pyc"] = sorted(  # frozen modules have no __cached__
    name for name, m in list(sys.modules.items())
    if getattr(m, "__cached__", None) and not os.path.exists(m.__cached__))
# PEP 552 flags: 0b01 = hash-based, unchecked (valid whatever the sources' mtimes).
out["pyc_flags"] = sorted({int.from_bytes(p.read_bytes()[4:8], "little") for p in pycs})
print(json.dumps(out))
"""
    (tmp_path / "unused.yaml").write_text("{}")
    pod = Pod(image, tmp_path, "probe", tmp_path / "unused.yaml", devcluster.kubeconfig)
    try:
        res = subprocess.run(
            pod.command(["/opt/ghostgpu/bin/python", "-c", probe], entrypoint=False),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        pod.remove()
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert (out["uid"], out["gid"]) == (65532, 65532)
    assert out["home"] == "/tmp" and out["dont_write_bytecode"] == 1
    assert out["writable"] == {
        "/probe": "Read-only file system",
        "/opt/ghostgpu/probe": "Read-only file system",
        "/etc/ghostgpu/probe": "Read-only file system",  # the ConfigMap is mounted read-only
        "/tmp/probe": True,  # emptyDir
        "/var/lib/ghostgpu/probe": True,  # emptyDir: the decision log
    }
    assert out["py_without_pyc"] == []
    assert out["imported_without_pyc"] == []
    assert out["pyc_flags"] == [1]


def test_image_controller_shadow_window(
    image: Image, two_workloads: TwoWorkloads, devcluster: DevCluster, prometheus_url: str, tmp_path: Path
) -> None:
    sc = two_workloads
    cfg = controller_config(tmp_path, prometheus_url, "shadow")
    ctl = ImageController(image, devcluster.kubeconfig, cfg, tmp_path, "image-shadow")
    try:
        ctl.wait_polls(WINDOW + 1, timeout=180)

        def judged() -> bool:
            # busy's first plain ACTIVE is not written; after a poll whose signals failed under load
            # (UNKNOWN, written) its next ACTIVE is a change and is written: either is right here.
            return sc.verdict("finished") == "FINISHED_IDLE" and sc.verdict("busy") in (None, "ACTIVE")

        try:
            wait_for(judged, 120, "verdicts written by the containerised controller")
        except AssertionError as exc:
            verdicts = {n: sc.verdict(n) for n in sc.FLEET}
            raise AssertionError(f"{exc}: {verdicts}\n{ctl.log_path.read_text()[-4000:]}") from None
        evidence = json.loads(sc.annotations("finished")["ghostgpu.io/evidence"])
        assert evidence["util"] == [0.0] * WINDOW
        assert evidence["procs"]["live"] == 0, "the process listing went through exec into the pod"
        assert sc.events("finished", "WouldReclaim") == 1
        assert {n: sc.replicas(n) for n in sc.FLEET} == {"finished": 1, "busy": 1}, "shadow touches nothing"
        assert ctl.metric("ghostgpu_would_reclaims_total", namespace=sc.ns) == 1
        assert httpx.get(f"http://127.0.0.1:{ctl.port}/readyz", timeout=5).status_code == 200
        # The decision log went to the Deployment's volume at its default path.
        wait_for(lambda: "FINISHED_IDLE" in ctl.decisions.read_text(), 30, "the decision log")
        lines = [json.loads(line) for line in ctl.decisions.read_text().splitlines()]
        assert any(d.get("workload", "").endswith(f"/{sc.ns}/finished") for d in lines)
    finally:
        ctl.stop()
    log = ctl.log_path.read_text()
    assert "Read-only file system" not in log, log[-2000:]
    # The kubelet's SIGTERM reaches the controller (PID 1 of the container) and it shuts down cleanly.
    assert '"msg":"controller stopped"' in log and ctl.proc.returncode == 0, log[-2000:]
