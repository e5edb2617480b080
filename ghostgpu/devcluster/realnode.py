"""The devcluster's real node: a kubelet (built from the control plane's own Kubernetes module) with
its own containerd and runc, beside the kwok nodes. Its pods are real processes in real pid
namespaces and cgroups, so `kubectl exec ... ps` runs the container's own `ps`, and restarts, exit
codes and readiness come from the real kubelet.

Everything it makes lives under <state>/realnode (containerd root, state and socket, the kubelet's
root dir, its pods' logs) or is named after that directory (the cgroupRoot in every cgroup v1
hierarchy), so two devclusters on one machine never share one. What the kubelet changes on the host
(six sysctls it sets at start, with no mode that leaves them alone) is written down first and put
back by the last real node that stops (`cleanup`), also after a run that was killed."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from ghostgpu.devcluster import procs
from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint
from ghostgpu.devcluster.paths import REPO_ROOT

# The apiserver reaches the kubelet by its Hostname address (--kubelet-preferred-address-types):
# the kubelet refuses a loopback --node-ip, and `localhost` resolves from /etc/hosts on any host, so
# no DNS query ever leaves the machine. One real node per devcluster, so the name is free.
REAL_NODE_NAME = "localhost"
# Only a pod that asks for the real node lands there: kwok tests' pods (images that do not exist
# here) never do.
REAL_NODE_LABEL = "ghostgpu.io/real-node"
REAL_NODE_TAINT = Taint(key=REAL_NODE_LABEL, value="true", effect="NoSchedule")
# Tolerating the taint is not enough (a test pod that tolerates everything would land there and
# never pull its image): the default scheduler profile never places a pod on the real node, and
# only pods of this profile (`schedulerName`) go there.
REAL_NODE_SCHEDULER = "ghostgpu-real-node"
REAL_NODE_GPUS = 32  # an extended resource: enough for every real-shape pod at once
# What the kubelet's container manager sets on start (pkg/kubelet/cm setupKernelTunables). With
# protectKernelDefaults it refuses to start on a host that differs instead; no setting leaves them.
HOST_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
CGROUP_FS = Path("/sys/fs/cgroup")
# containerd 1.6's shims listen under this fixed directory (one socket per shim, named by a hash).
SHIM_SOCKET_DIR = Path("/run/containerd/s")
LEDGER_DIR = Path("/run/ghostgpu")  # tmpfs: after a reboot the kernel's own defaults are back
# Any image pull goes to a proxy that is not there: the node only runs the images imported here.
NO_PULLS_ENV = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for the CRI


class NodeImages(BaseModel):
    """The node's images (hack/build-image --node-images): their names and docker-archive tarballs."""

    pause: str
    workload: str
    distroless: str
    # A real Jupyter server and kernel and tmux: the idle-session workloads.
    notebook: str
    pause_tar: str
    workload_tar: str
    distroless_tar: str
    notebook_tar: str


def build_images() -> NodeImages:
    """Build, or reuse from ~/.cache/ghostgpu, the node's images; raises RuntimeError with the
    build's own error."""
    r = subprocess.run(
        [str(REPO_ROOT / "hack" / "build-image"), "--node-images"],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"hack/build-image --node-images failed (exit {r.returncode}): {r.stderr[-1500:]}")
    kv = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    try:
        return NodeImages(
            pause=kv["PAUSE_IMAGE"],
            workload=kv["WORKLOAD_IMAGE"],
            distroless=kv["DISTROLESS_IMAGE"],
            notebook=kv["NOTEBOOK_IMAGE"],
            pause_tar=kv["PAUSE_TAR"],
            workload_tar=kv["WORKLOAD_TAR"],
            distroless_tar=kv["DISTROLESS_TAR"],
            notebook_tar=kv["NOTEBOOK_TAR"],
        )
    except KeyError as e:
        raise RuntimeError(f"hack/build-image --node-images printed no {e.args[0]}=: {r.stdout!r}") from e


def _added_affinity(operator: str) -> dict[str, Any]:
    values = {"values": ["true"]} if operator == "In" else {}
    term = {"matchExpressions": [{"key": REAL_NODE_LABEL, "operator": operator, **values}]}
    return {
        "name": "NodeAffinity",
        "args": {
            "addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        },
    }


def scheduler_config(kubeconfig: str) -> dict[str, Any]:
    """kube-scheduler's configuration: two profiles whose NodeAffinity plugin adds an affinity to
    every pod they schedule (upstream's NodeAffinityArgs.addedAffinity): `default-scheduler` keeps
    off the real node whatever a pod tolerates, `ghostgpu-real-node` places only there."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {"schedulerName": "default-scheduler", "pluginConfig": [_added_affinity("DoesNotExist")]},
            {"schedulerName": REAL_NODE_SCHEDULER, "pluginConfig": [_added_affinity("In")]},
        ],
    }


def cgroup_root_name(state_dir: Path) -> str:
    """The kubelet's cgroupRoot: named after the state dir, so it never adopts another's cgroups."""
    return "ghostgpu-" + hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def v1_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy under /sys/fs/cgroup (v1 controllers, name=systemd, and the
    hybrid host's unified one), or just the root on a pure cgroup v2 host."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())


def gpu_node_spec(flavor_nodes: list[GpuNodeSpec]) -> GpuNodeSpec:
    """The real node as a node of the first whole-GPU flavor: its labels and taints (so Kueue,
    Kyverno and the controller see a GPU node), plus the real-node label and taint."""
    gpu = next((n for n in flavor_nodes if n.gpus), None)
    labels = {**(gpu.labels if gpu else {}), REAL_NODE_LABEL: "true"}
    taints = [*(gpu.taints if gpu else []), REAL_NODE_TAINT]
    return GpuNodeSpec(name=REAL_NODE_NAME, gpus=REAL_NODE_GPUS, labels=labels, taints=taints)


class Layout:
    """Where one devcluster's real node keeps everything."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.dir = state_dir / "realnode"
        # Unix socket paths end at 107 bytes, and a state dir under pytest's tmp (an xdist worker, a
        # long test name) is longer than that leaves room for: the kubelet's root (its pod-resources,
        # plugin and device-plugin sockets) and containerd's socket live under a short directory of
        # their own, named like the cgroupRoot. It is on tmpfs; the kubelet keeps little there.
        self.run_dir = LEDGER_DIR / cgroup_root_name(state_dir)
        self.containerd_root = self.dir / "containerd" / "root"
        self.containerd_state = self.dir / "containerd" / "state"
        self.socket = self.run_dir / "containerd.sock"
        self.runc_root = self.dir / "runc"
        self.containerd_config = self.dir / "containerd.toml"
        self.cni_conf = self.dir / "cni"
        self.kubelet_root = self.run_dir / "kubelet"
        self.kubelet_config = self.dir / "kubelet-config.yaml"
        self.kubelet_kubeconfig = self.dir / "kubelet.kubeconfig"
        self.pod_logs = self.dir / "pod-logs"
        self.cgroup_root = cgroup_root_name(state_dir)

    def cgroup_dirs(self) -> list[Path]:
        return [h / self.cgroup_root for h in v1_hierarchies()]


def containerd_config(lay: Layout, runc: Path, cni_bin: Path, sandbox_image: str, stream_port: int) -> str:
    """containerd 1.6's config (version 2): its own root, state and socket, runc with its own root,
    the loopback-only CNI, the pinned sandbox image, and what this VM needs (see docs/devcluster.md)."""
    cri = "io.containerd.grpc.v1.cri"
    lines = [
        "version = 2",
        f'root = "{lay.containerd_root}"',
        f'state = "{lay.containerd_state}"',
        # Plugins that would read or write outside our directories, or probe filesystems we lack.
        'disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",'
        ' "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",'
        ' "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]',
        "[grpc]",
        f'  address = "{lay.socket}"',
        "[ttrpc]",
        f'  address = "{lay.socket}.ttrpc"',
        "[metrics]",
        '  address = ""',
        f'[plugins."{cri}"]',
        f'  sandbox_image = "{sandbox_image}"',
        # No CAP_SYS_RESOURCE in this VM: runc fails ("can't get final child's PID from pipe") when
        # asked to lower a container's oom_score_adj below its parent's.
        "  restrict_oom_score_adj = true",
        "  disable_apparmor = true",
        '  stream_server_address = "127.0.0.1"',
        f'  stream_server_port = "{stream_port}"',
        "  enable_selinux = false",
        f'[plugins."{cri}".containerd]',
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f'[plugins."{cri}".containerd.runtimes.runc]',
        '  runtime_type = "io.containerd.runc.v2"',
        f'[plugins."{cri}".containerd.runtimes.runc.options]',
        f'  BinaryName = "{runc}"',
        f'  Root = "{lay.runc_root}"',
        "  SystemdCgroup = false",
        f'[plugins."{cri}".cni]',
        f'  bin_dir = "{cni_bin}"',
        f'  conf_dir = "{lay.cni_conf}"',
    ]
    return "\n".join(lines) + "\n"


# Loopback only: the runtime's network is "ready", and no pod ever has an address that leaves the
# machine (containerd 1.6 refuses a pod sandbox without an eth0 address, so every real-node pod
# runs with hostNetwork: true; any other one fails to start instead of getting a network).
LOOPBACK_CONFLIST = {"cniVersion": "1.0.0", "name": "ghostgpu-loopback", "plugins": [{"type": "loopback"}]}


def kubelet_config(
    lay: Layout, port: int, healthz_port: int, ca: Path, cert: Path, key: Path, spec: GpuNodeSpec
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{lay.socket}",
        "cgroupDriver": "cgroupfs",
        # Its own cgroup subtree, made by us: the kubelet never adopts or deletes cgroups it did not make.
        "cgroupRoot": f"/{lay.cgroup_root}",
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(lay.pod_logs),
        "resolvConf": "",
        "registerNode": True,
        "registerWithTaints": [t.model_dump() for t in spec.taints],
        # A test machine's disk and memory are shared: never evict or collect the imported images.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # Ready as soon as the runtime is: the first status otherwise waits for the 10 s default.
        "nodeStatusUpdateFrequency": "1s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "maxPods": 110,
        "protectKernelDefaults": False,
    }


def kubelet_argv(kubelet: Path, lay: Layout, spec: GpuNodeSpec) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(spec.labels.items()))
    return [
        str(kubelet),
        f"--config={lay.kubelet_config}",
        f"--kubeconfig={lay.kubelet_kubeconfig}",
        f"--root-dir={lay.kubelet_root}",
        f"--cert-dir={lay.dir / 'kubelet-pki'}",
        f"--hostname-override={spec.name}",
        f"--node-labels={labels}",
        # cAdvisor's own containerd client (not the CRI) names a container cgroup's pod, namespace
        # and container; without our socket its container_* series carry none of those labels.
        f"--containerd={lay.socket}",
        "--v=1",
    ]


def kubeconfig(server: str, ca: Path, cert: Path, key: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


def prepare(lay: Layout) -> None:
    """Directories, the CNI config, and the cgroupRoot in every hierarchy (cpuset copied from the
    parent: a v1 cpuset cgroup with empty cpus/mems takes no tasks)."""
    for d in (
        lay.containerd_root,
        lay.containerd_state,
        lay.runc_root,
        lay.cni_conf,
        lay.kubelet_root,
        lay.pod_logs,
    ):
        d.mkdir(parents=True, exist_ok=True)
    (lay.cni_conf / "10-loopback.conflist").write_text(json.dumps(LOOPBACK_CONFLIST))
    for d in lay.cgroup_dirs():
        d.mkdir(exist_ok=True)
        if d.parent.name == "cpuset" or (d.parent / "cpuset.cpus").exists():
            for f in ("cpuset.cpus", "cpuset.mems"):
                src = d.parent / f
                if src.exists() and not (d / f).read_text().strip():
                    (d / f).write_text(src.read_text())


def import_images(ctr: Path, lay: Layout, images: NodeImages) -> None:
    for tar in (images.pause_tar, images.workload_tar, images.distroless_tar, images.notebook_tar):
        r = subprocess.run(
            [
                str(ctr),
                "--address",
                str(lay.socket),
                "-n",
                K8S_NAMESPACE,
                "images",
                "import",
                "--no-unpack",
                tar,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(f"ctr images import {tar} failed: {r.stderr.strip()[-500:]}")


# ----- the host: sysctls -----


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    return {n: _sysctl_path(n).read_text().strip() for n in HOST_SYSCTLS if _sysctl_path(n).exists()}


@contextlib.contextmanager
def _ledger() -> Iterator[Path]:
    LEDGER_DIR.mkdir(parents=True, exist_ok=True)
    with (LEDGER_DIR / "realnode-sysctls.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield LEDGER_DIR / "realnode-sysctls.json"


# A holder whose kubelet runs in a node container (kind's) cannot be found among the host's
# processes: it marks its state dir with this file while its cluster exists.
CONTAINER_NODE_MARK = "container-node-holds-sysctls"


def _holder_alive(state_dir: Path) -> bool:
    return kubelet_running(state_dir) or (state_dir / CONTAINER_NODE_MARK).exists()


def hold_sysctls(state_dir: Path) -> None:
    """Before a kubelet starts: write down the host's values (unless another real node already
    did, whose kubelet has changed them) and count this state dir as one holder."""
    with _ledger() as f:
        doc = json.loads(f.read_text()) if f.exists() else {"original": read_sysctls(), "holders": []}
        if str(state_dir) not in doc["holders"]:
            doc["holders"].append(str(state_dir))
        f.write_text(json.dumps(doc, indent=2, sort_keys=True))


def release_sysctls(state_dir: Path) -> dict[str, str]:
    """This state dir no longer holds them; the last holder puts the original values back. A
    holder whose kubelet no longer runs (a killed run) is dropped. Returns what was restored."""
    with _ledger() as f:
        if not f.exists():
            return {}
        doc = json.loads(f.read_text())
        doc["holders"] = [h for h in doc["holders"] if h != str(state_dir) and _holder_alive(Path(h))]
        if doc["holders"]:
            f.write_text(json.dumps(doc, indent=2, sort_keys=True))
            return {}
        for name, value in doc["original"].items():
            _sysctl_path(name).write_text(value)
        f.unlink()
        return dict(doc["original"])


def kubelet_running(state_dir: Path) -> bool:
    config = str(Layout(state_dir).kubelet_config)
    return any(_config_args(c) == config for c in _cmdlines_matching("kubelet").values())


# ----- the host: processes, mounts, cgroups -----


def _cmdlines_matching(program: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0] and Path(argv[0].decode(errors="replace")).name == program:
            out[int(d.name)] = " ".join(a.decode(errors="replace") for a in argv[1:] if a)
    return out


def _config_args(cmdline: str) -> str:
    return next((a.split("=", 1)[1] for a in cmdline.split() if a.startswith("--config=")), "")


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _cgroup_pids(d: Path) -> list[int]:
    pids: list[int] = []
    for tasks in d.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids += [int(p) for p in tasks.read_text().split()]
    return pids


def shim_sockets(address: Path, cmdline: str) -> list[Path]:
    """The socket a containerd 1.6 shim listens on: /run/containerd/s/sha256(<address>/<ns>/<id>)."""
    args = cmdline.split()
    try:
        ns, cid = args[args.index("-namespace") + 1], args[args.index("-id") + 1]
    except (ValueError, IndexError):
        return []
    digest = hashlib.sha256(os.path.join(str(address), ns, cid).encode()).hexdigest()
    return [SHIM_SOCKET_DIR / digest]


def _mounts_under(root: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == str(root) or point.startswith(str(root) + "/"):
            out.append(point)
    return sorted(set(out), key=len, reverse=True)


def cleanup(state_dir: Path) -> list[str]:
    """Everything the real node left on the host, gone: its kubelet and containerd (if still up),
    every container process and shim, its mounts, its cgroups, and (last holder) the sysctls back.
    Safe to run twice, and after a kill -9 of everything. Returns what it did, for the log."""
    lay = Layout(state_dir)
    did: list[str] = []
    kubelets = [
        p for p, c in _cmdlines_matching("kubelet").items() if _config_args(c) == str(lay.kubelet_config)
    ]
    containerds = [
        p
        for p, c in _cmdlines_matching("containerd").items()
        if _config_args(c) == str(lay.containerd_config)
    ]
    _kill(kubelets + containerds)
    did += [f"killed kubelet {p}" for p in kubelets] + [f"killed containerd {p}" for p in containerds]
    pids = [p for d in lay.cgroup_dirs() for p in _cgroup_pids(d)]
    _kill(sorted(set(pids)))
    if pids:
        did.append(f"killed {len(set(pids))} container processes")
    shims = {
        p: c
        for p, c in _cmdlines_matching("containerd-shim-runc-v2").items()
        if f"-address {lay.socket}" in c
    }
    _kill(list(shims))
    for c in shims.values():
        for sock in shim_sockets(lay.socket, c):
            sock.unlink(missing_ok=True)
    if shims:
        did.append(f"killed {len(shims)} shims")
    _wait_gone(kubelets + containerds + list(shims) + pids)
    for point in _mounts_under(lay.dir) + _mounts_under(lay.run_dir):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        did.append(f"unmounted {point}")
    if lay.run_dir.exists() and not _mounts_under(lay.run_dir):
        shutil.rmtree(lay.run_dir, ignore_errors=True)
        did.append(f"removed {lay.run_dir}")
    for d in lay.cgroup_dirs():
        if _rmdir_tree(d):
            did.append(f"removed cgroup {d}")
    for d in (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: another containerd may use it
    restored = release_sysctls(state_dir)
    if restored:
        did.append("restored " + ", ".join(f"{k}={v}" for k, v in sorted(restored.items())))
    return did


def _wait_gone(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and _not_zombie(p) for p in pids):
        time.sleep(0.05)


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _rmdir_tree(root: Path, timeout: float = 10) -> bool:
    """rmdir a cgroup and its children, deepest first (a cgroup dir holds only kernel files)."""
    if not root.is_dir():
        return False
    deadline = time.monotonic() + timeout
    while True:
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*dirs, root]:
            with contextlib.suppress(OSError):
                d.rmdir()
        if not root.exists():
            return True
        if time.monotonic() > deadline:
            raise RuntimeError(f"cgroup {root} still busy after {timeout:.0f}s: {_cgroup_pids(root)}")
        time.sleep(0.1)


def write_kubelet_files(
    lay: Layout, server: str, pki_dir: Path, ca: Path, ports: tuple[int, int], spec: GpuNodeSpec
) -> None:
    lay.kubelet_kubeconfig.write_text(
        yaml.safe_dump(kubeconfig(server, ca, pki_dir / "real-node.crt", pki_dir / "real-node.key"))
    )
    cfg = kubelet_config(
        lay,
        ports[0],
        ports[1],
        ca,
        pki_dir / "real-node-serving.crt",
        pki_dir / "real-node-serving.key",
        spec,
    )
    lay.kubelet_config.write_text(yaml.safe_dump(cfg, sort_keys=True))


# ----- faults: the node's kubelet or containerd stopped and started again -----

NODE_DAEMONS = ("kubelet", "containerd")


def daemon_pid(state_dir: Path, program: str) -> int | None:
    """The pid of this state dir's real-node `program` (kubelet or containerd), or None."""
    lay = Layout(state_dir)
    config = str(lay.kubelet_config if program == "kubelet" else lay.containerd_config)
    return next((p for p, c in _cmdlines_matching(program).items() if _config_args(c) == config), None)


class DaemonLaunch(BaseModel):
    """How a stopped node daemon ran: enough to start it again as it was."""

    program: str
    argv: list[str]
    env: dict[str, str]


def stop_daemon(state_dir: Path, program: str) -> DaemonLaunch:
    """Stop the real node's kubelet or containerd (SIGTERM, as a service manager's restart does).
    Its containers keep running: their shims outlive containerd, and a kubelet finds its pods
    again. Raises RuntimeError when it is not running."""
    if program not in NODE_DAEMONS:
        raise ValueError(f"{program!r}: not one of {NODE_DAEMONS}")
    pid = daemon_pid(state_dir, program)
    if pid is None:
        raise RuntimeError(f"the real node's {program} of {state_dir} is not running")
    proc = Path(f"/proc/{pid}")
    argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    pairs = [e.decode(errors="replace") for e in (proc / "environ").read_bytes().split(b"\0")]
    env = dict(e.split("=", 1) for e in pairs if "=" in e)
    os.kill(pid, signal.SIGTERM)
    _wait_gone([pid], timeout=20)
    _kill([pid])
    return DaemonLaunch(program=program, argv=argv, env=env)


def start_daemon(state_dir: Path, launch: DaemonLaunch) -> procs.ProcessRecord:
    """Start a daemon `stop_daemon` stopped, with the command line and environment it ran with
    (`cleanup` finds it by its config flag, as the first one)."""
    return procs.start(launch.program, launch.argv, state_dir / "logs", env=launch.env)
