"""A kind cluster for ghostgpu (`ghostgpu devcluster up --provider kind`), with Docker or podman.

kind runs the whole cluster in one node container: systemd, containerd, kubeadm's control plane.
Here everything comes from hack/ (no registry): kind from the Go module proxy (hack/testbin kind),
the node image from Debian packages and the cached Kubernetes binaries (hack/build-kind-node),
Kueue and Kyverno as images of hack/testbin's binaries (`hack/build-kind-node --addon-images`), the
controller from hack/build-image. What the host needs (docs/kind.md): on a cgroup v1 host the
kubelet's `failCgroupV1: false`; podman without CAP_SYS_RESOURCE needs the node container's
rlimits at or below the host's (a containers.conf of our own, never the host's); kind bind-mounts
/lib/modules, which a kernel without modules does not have."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from ghostgpu.devcluster import realnode
from ghostgpu.devcluster.paths import REPO_ROOT, cache_root, read_versions

CLUSTER = "ghostgpu"
# podman runs the node container under conmon, whose RLIMIT_NPROC here is 32768: runc may not
# raise it (no CAP_SYS_RESOURCE), so the node asks for no more.
NPROC_LIMIT = 32768
# Kueue's and Kyverno's deployments as their releases ship them, minus what needs images not built
# here: Kyverno's cleanup and reports controllers (reports and cleanup policies, which ghostgpu's
# bundles do not use).
KYVERNO_SKIPPED = frozenset({"kyverno-cleanup-controller", "kyverno-reports-controller"})


class KindError(RuntimeError):
    """A step of the kind cluster failed: what, and the command's own output."""


def host_cgroup_v1() -> bool:
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def engine() -> tuple[str | None, str]:
    """The container engine kind will use: Docker when a Docker engine answers, else podman
    (rootful), else None with the reason."""
    reasons = []
    for name, probe in (("docker", ["docker", "info"]), ("podman", ["podman", "info"])):
        if shutil.which(name) is None:
            reasons.append(f"no `{name}` on PATH")
            continue
        r = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
        if r.returncode == 0:
            return name, f"{' '.join(probe)} answered"
        reasons.append(f"`{' '.join(probe)}` failed: {(r.stderr or r.stdout).strip()[-200:]}")
    return None, "; ".join(reasons)


def containers_conf() -> str:
    """podman's containers.conf for the node container: rlimits it may set without
    CAP_SYS_RESOURCE (podman's rootful default, nofile=1048576, is refused by runc otherwise)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = NPROC_LIMIT if nproc == resource.RLIM_INFINITY else min(nproc, NPROC_LIMIT)
    return f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'


def kind_config(cgroup_v1: bool) -> dict[str, Any]:
    """kind's Cluster config: one node; on a cgroup v1 host the kubelet is told to run anyway
    (Kubernetes >= 1.35 refuses cgroup v1 unless failCgroupV1 is false)."""
    cfg: dict[str, Any] = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "nodes": [{"role": "control-plane"}],
    }
    if cgroup_v1:
        cfg["kubeadmConfigPatches"] = [
            yaml.safe_dump({"kind": "KubeletConfiguration", "failCgroupV1": False}, sort_keys=False)
        ]
    return cfg


def parse_kv(text: str) -> dict[str, str]:
    """KEY=value lines (what hack/ scripts print) as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            out[key] = value
    return out


def set_images(docs: Iterable[dict[str, Any]], images: dict[str, str]) -> list[dict[str, Any]]:
    """The docs with each container image whose name (the ref's last path part, before the tag)
    is a key of `images` replaced by its value and never pulled."""
    out = []
    for doc in docs:
        spec = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            name = str(c.get("image", "")).rsplit("/", 1)[-1].split("@")[0].split(":")[0]
            if name in images:
                c["image"] = images[name]
                c["imagePullPolicy"] = "Never"
        out.append(doc)
    return out


@dataclass(frozen=True)
class KindTools:
    kind: Path
    kubectl: Path
    kueue_module: Path
    kyverno_module: Path

    @classmethod
    def locate(cls) -> KindTools:
        v = read_versions()
        r = cache_root()
        mods = Path(os.environ.get("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod")
        return cls(
            kind=r / f"kind-{v['KIND_VERSION']}" / "bin" / "kind",
            kubectl=r / f"kind-node-bin-{v['KUBERNETES_VERSION']}" / "bin" / "kubectl",
            kueue_module=mods / "sigs.k8s.io" / f"kueue@{v['KUEUE_VERSION']}",
            kyverno_module=mods / "github.com" / "kyverno" / f"kyverno@{v['KYVERNO_VERSION']}",
        )

    def missing(self) -> list[str]:
        return [
            str(p)
            for p in (self.kind, self.kubectl, self.kueue_module, self.kyverno_module)
            if not p.exists()
        ]


class KindCluster:
    """One kind cluster named `name`, its kubeconfig and kind config under `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        name: str = CLUSTER,
        engine_name: str = "podman",
        log: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.state_dir, self.name, self.engine, self.log = state_dir, name, engine_name, log
        self.tools = KindTools.locate()
        self.kubeconfig = state_dir / "kubeconfig"
        self.t0 = time.monotonic()
        if engine_name == "podman":  # every podman call kind makes reads it
            state_dir.mkdir(parents=True, exist_ok=True)
            (state_dir / "containers.conf").write_text(containers_conf())

    # ----- plumbing -----
    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if self.engine == "podman":
            env["KIND_EXPERIMENTAL_PROVIDER"] = "podman"
            env["CONTAINERS_CONF"] = str(self.state_dir / "containers.conf")
        return env

    def run(self, cmd: list[str], what: str, stdin: str | None = None, timeout: float = 600) -> str:
        r = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        if r.returncode != 0:
            raise KindError(
                f"{what} failed (exit {r.returncode}): {' '.join(cmd[:6])} ...\n"
                + (r.stderr or r.stdout).strip()[-3000:]
            )
        return r.stdout

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
        return self.run(
            [str(self.tools.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            f"kubectl {' '.join(args[:3])}",
            stdin=stdin,
            timeout=timeout,
        )

    def say(self, msg: str) -> None:
        self.log(f"[kind {time.monotonic() - self.t0:5.1f}s] {msg}")

    def exists(self) -> bool:
        out = self.run([str(self.tools.kind), "get", "clusters"], "kind get clusters")
        return self.name in out.split()

    # ----- create and delete -----
    def create(self, image: str) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "kind-config.yaml"
        config.write_text(yaml.safe_dump(kind_config(host_cgroup_v1()), sort_keys=False))
        if self.engine == "podman" and not self._network_exists("kind"):
            (self.state_dir / "created-network").write_text("kind\n")
        # kind bind-mounts /lib/modules into the node; a kernel without modules has none.
        Path("/lib/modules").mkdir(parents=True, exist_ok=True)
        # The node's kubelet sets the host's kernel tunables too (they are not namespaced): the
        # host's values are written down first and put back by `delete`, shared with real nodes.
        (self.state_dir / realnode.CONTAINER_NODE_MARK).touch()
        realnode.hold_sysctls(self.state_dir)
        self.say(f"kind create cluster --name {self.name} --image {image} ({self.engine})")
        self.run(
            [
                str(self.tools.kind),
                "create",
                "cluster",
                "--name",
                self.name,
                "--image",
                image,
                "--config",
                str(config),
                "--kubeconfig",
                str(self.kubeconfig),
            ],
            "kind create cluster",
            timeout=600,
        )
        # No CoreDNS image is built here; nothing ghostgpu runs needs cluster DNS.
        self.kubectl("-n", "kube-system", "scale", "deployment/coredns", "--replicas=0")
        self.say("cluster up (CoreDNS scaled to 0: its image is not built here)")

    def delete(self) -> None:
        """kind delete cluster, then what kind leaves behind with podman: the node's /var volume
        when the container never started, and the `kind` network if this cluster created it."""
        if self.tools.kind.exists():
            subprocess.run(
                [str(self.tools.kind), "delete", "cluster", "--name", self.name],
                capture_output=True,
                env=self.env,
                timeout=300,
                check=False,
            )
        if self.engine == "podman":
            marker = self.state_dir / "created-network"
            if marker.exists():
                # only when no container of another kind cluster still uses it
                users = subprocess.run(
                    ["podman", "ps", "-aq", "--filter", "network=kind"],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout.split()
                if not users:
                    subprocess.run(["podman", "network", "rm", "kind"], capture_output=True, check=False)
                marker.unlink()
        (self.state_dir / realnode.CONTAINER_NODE_MARK).unlink(missing_ok=True)
        realnode.release_sysctls(self.state_dir)

    def _network_exists(self, name: str) -> bool:
        r = subprocess.run([self.engine, "network", "inspect", name], capture_output=True, check=False)
        return r.returncode == 0

    # ----- images and add-ons -----
    def load(self, archive: Path) -> None:
        self.run(
            [str(self.tools.kind), "load", "image-archive", "--name", self.name, str(archive)],
            f"kind load image-archive {archive.name}",
        )

    def apply(self, docs: list[dict[str, Any]], what: str) -> None:
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "ghostgpu-kind",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(docs),
            timeout=300,
        )
        self.say(f"applied {what} ({len(docs)} objects)")

    def install_kueue(self, image: str) -> None:
        """Kueue's release manifests (its module's config/default, built by kubectl's kustomize)
        with the manager image built here."""
        out = self.kubectl("kustomize", str(self.tools.kueue_module / "config" / "default"))
        # config/default names the image "controller" and rewrites it to the staging "kueue:main"
        docs = set_images([d for d in yaml.safe_load_all(out) if d], {"controller": image, "kueue": image})
        self.apply(docs, "Kueue")

    def install_kyverno(self, images: dict[str, str]) -> None:
        """Kyverno's install manifest from its module, with the admission and background
        controllers (and the admission controller's init container) built here."""
        path = self.tools.kyverno_module / "config" / "install-latest-testing.yaml"
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        docs = [d for d in yaml.load_all(path.read_text(), Loader=loader) if d]
        docs = [
            d for d in docs if not (d["kind"] == "Deployment" and d["metadata"]["name"] in KYVERNO_SKIPPED)
        ]
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        self.apply(crds, "Kyverno's CRDs")
        self.apply(
            set_images([d for d in docs if d["kind"] != "CustomResourceDefinition"], images), "Kyverno"
        )

    def wait_deployments(self, namespace: str, timeout: int = 300) -> None:
        self.kubectl(
            "-n", namespace, "rollout", "status", "deployment", f"--timeout={timeout}s", timeout=timeout + 30
        )
        self.say(f"{namespace}: every Deployment available")


def build_node_image() -> str:
    """hack/build-kind-node (reuses a built image); its IMAGE."""
    out = _hack("build-kind-node")
    return out["IMAGE"]


def addon_images() -> dict[str, str]:
    return _hack("build-kind-node", "--addon-images")


def node_images() -> dict[str, str]:
    """hack/build-image --node-images (reuses built archives): WORKLOAD_IMAGE, WORKLOAD_TAR, ...; the
    workload image is what a ghost on kind runs (`sh`, `ps`, python3), loaded with `load`."""
    return _hack("build-image", "--node-images")


def controller_archive(dest: Path, ref: str) -> Path:
    """The image hack/build-image makes, as a docker-archive tagged `ref` (the image the rendered
    controller/ bundle names), so the bundle applies unchanged."""
    built = _hack("build-image")
    printed = _hack("build-image", "--print")
    tar = dest / "ghostgpu-controller.tar"
    tar.unlink(missing_ok=True)
    buildah = printed["BUILDAH"].split()
    r = subprocess.run(
        [*buildah, "push", "-q", built["IMAGE"], f"docker-archive:{tar}:{ref}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise KindError(f"exporting {built['IMAGE']} failed: {r.stderr.strip()[-2000:]}")
    return tar


def _hack(script: str, *args: str) -> dict[str, str]:
    r = subprocess.run([str(REPO_ROOT / "hack" / script), *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise KindError(
            f"hack/{script} {' '.join(args)} failed (exit {r.returncode}):\n{r.stderr.strip()[-3000:]}"
        )
    return parse_kv(r.stdout)


def default_state_dir() -> Path:
    return cache_root() / "kind"


def preflight() -> str:
    """The engine kind will use, or KindError saying why none can."""
    if os.geteuid() != 0:
        raise KindError("kind with podman runs rootful here (the node container is privileged): not root")
    tools = KindTools.locate()
    if tools.missing():
        raise KindError(
            "not built: " + ", ".join(tools.missing()) + " (run hack/testbin kind kind-node kyverno-init)"
        )
    name, why = engine()
    if name is None:
        raise KindError(f"no container engine for kind: {why}")
    return name


def up(
    state_dir: Path | None = None,
    *,
    bundles: bool = False,
    bundle_root: Path = REPO_ROOT,
    name: str = CLUSTER,
    log: Callable[[str], None] = lambda _m: None,
) -> KindCluster:
    """A kind cluster running Kueue and Kyverno in-cluster from images built here, with the
    monitoring CRDs the controller/ bundle uses; with `bundles`, the kueue/ policies/ controller/
    rendered in `bundle_root` (its examples/ghostgpu.yaml names the namespaces) applied by
    server-side apply (as Argo CD syncs them) and the controller image of hack/build-image loaded
    under the name the bundle gives it."""
    from ghostgpu.devcluster.kube import load_yaml_docs
    from ghostgpu.devcluster.paths import Toolchain

    engine_name = preflight()
    cluster = KindCluster(state_dir or default_state_dir(), name, engine_name, log)
    if cluster.exists():
        raise KindError(
            f"a kind cluster named {name!r} already exists (`ghostgpu devcluster down --provider kind`)"
        )
    cluster.say("building or reusing the node image (hack/build-kind-node)")
    image = build_node_image()
    images = addon_images()
    try:
        cluster.create(image)
        for key, value in images.items():
            if key.endswith("_TAR"):
                cluster.load(Path(value))
        cluster.say("loaded Kueue's and Kyverno's images")
        cluster.install_kueue(images["KUEUE_IMAGE"])
        cluster.wait_deployments("kueue-system", 180)
        cluster.install_kyverno(
            {
                "kyverno": images["KYVERNO_IMAGE"],
                "kyvernopre": images["KYVERNOPRE_IMAGE"],
                "background-controller": images["BACKGROUND_CONTROLLER_IMAGE"],
            }
        )
        cluster.wait_deployments("kyverno", 180)
        cluster.apply(
            load_yaml_docs(sorted(Toolchain.locate().monitoring_crd_dir.glob("*.yaml"))),
            "the ServiceMonitor and PrometheusRule CRDs",
        )
        if bundles:
            apply_rendered(cluster, bundle_root)
    except BaseException:
        cluster.delete()
        raise
    return cluster


def apply_rendered(cluster: KindCluster, bundle_root: Path = REPO_ROOT) -> None:
    """Load hack/build-image's controller image under the name the rendered controller/ bundle
    gives it, server-side apply kueue/ policies/ controller/ from `bundle_root`, wait for the
    controller."""
    from ghostgpu.devcluster.bundles import apply_bundles, bundle_docs
    from ghostgpu.devcluster.kube import Kube

    deploy = next(d for d in bundle_docs("controller", bundle_root) if d["kind"] == "Deployment")
    ref = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    cluster.load(controller_archive(cluster.state_dir, ref))
    cluster.say(f"loaded hack/build-image's image as {ref}")
    errors = [e for errs in apply_bundles(Kube(cluster.kubeconfig), bundle_root).values() for e in errs]
    if errors:
        raise KindError("the rendered bundles were refused:\n" + "\n".join(errors))
    cluster.say("applied the rendered bundles: kueue/ policies/ controller/")
    cluster.wait_deployments("ghostgpu-system", 180)


def down(state_dir: Path | None = None, name: str = CLUSTER) -> bool:
    """Delete the kind cluster (and what kind leaves behind); False when none existed."""
    engine_name, _ = engine()
    cluster = KindCluster(state_dir or default_state_dir(), name, engine_name or "podman")
    existed = cluster.tools.kind.exists() and cluster.exists()
    cluster.delete()
    return existed


def network_gateway(engine_name: str, network: str = "kind") -> str:
    """The host's address on kind's container network: what a pod reaches the host at."""
    fmt = (
        "{{range .IPAM.Config}}{{.Gateway}} {{end}}"
        if engine_name == "docker"
        else "{{range .Subnets}}{{.Gateway}} {{end}}"
    )
    r = subprocess.run(
        [engine_name, "network", "inspect", "--format", fmt, network],
        capture_output=True,
        text=True,
        check=False,
    )
    gateways = [g for g in r.stdout.split() if "." in g]
    if r.returncode != 0 or not gateways:
        raise KindError(f"no IPv4 gateway on the {network!r} network: {(r.stderr or r.stdout).strip()}")
    return gateways[0]


class HostSignals:
    """The GPU signals of a kind cluster, on the host: the fake dcgm-exporter (the one double: no
    GPU here) and Debian's Prometheus scraping it, listening on the kind network's gateway so the
    controller in the cluster reaches it. `url` is what the controller's config names."""

    def __init__(self, state_dir: Path, gateway: str) -> None:
        from ghostgpu.devcluster.components import prometheus_config
        from ghostgpu.devcluster.paths import Toolchain

        def free_port(host: str) -> int:
            with socket.socket() as sock:
                sock.bind((host, 0))
                return int(sock.getsockname()[1])

        self.dir = state_dir / "signals"
        self.dir.mkdir(parents=True, exist_ok=True)
        dport, pport = free_port("127.0.0.1"), free_port(gateway)
        self.dcgm_url, self.url = f"http://127.0.0.1:{dport}", f"http://{gateway}:{pport}"
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(prometheus_config(dport), sort_keys=True))
        logs = [(self.dir / f"{n}.log").open("w") for n in ("fake-dcgm", "prometheus")]
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "ghostgpu.devcluster.fake_dcgm", f"--port={dport}"],
                stdout=logs[0],
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
            ),
            subprocess.Popen(
                [
                    str(Toolchain.locate().prometheus),
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={self.dir / 'tsdb'}",
                    f"--web.listen-address={gateway}:{pport}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            ),
        ]
        for f in logs:
            f.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if (
                    httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
                    and httpx.get(f"{self.dcgm_url}/healthz", timeout=2).status_code == 200
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise KindError(f"Prometheus or the fake dcgm-exporter did not answer in 60 s (logs in {self.dir})")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
