"""`ghostgpu devcluster up|down|status`: a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with kwok GPU nodes and one real node (kubelet, containerd,
runc: ghostgpu.devcluster.realnode), Kueue and Kyverno running out of cluster, a fake dcgm-exporter
and Prometheus (or VictoriaMetrics in its place: ghostgpu.devcluster.victoriametrics). Everything
listens on 127.0.0.1 only, on ports picked at start-up, and is recorded in <state>/state.json so
`down` can stop exactly what `up` started."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client
from pydantic import BaseModel, Field

from ghostgpu.devcluster import components, procs, realnode, victoriametrics
from ghostgpu.devcluster.certs import CertAuthority, install_shared_pair, service_account_keys
from ghostgpu.devcluster.fake_dcgm import FakeDcgmClient
from ghostgpu.devcluster.kube import Kube, load_yaml_docs
from ghostgpu.devcluster.kwok_exec import ProcessTables, install_shims
from ghostgpu.devcluster.nodes import (
    GPU_RESOURCE,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    GpuNodeSpec,
    default_nodes,
    node_manifest,
)
from ghostgpu.devcluster.paths import REPO_ROOT, Toolchain, cache_root

ALL_ADDONS = ("kueue", "kyverno", "prometheus")
# CRDs of kinds no controller in the devcluster runs (DevCluster.up's extra_crds).
EXTRA_CRD_DIRS = ["monitoring_crd_dir", "argocd_crd_dir", "flux_crd_dir", "owner_crd_dir"]
# The Kueue manager runs the Configuration the project renders (kueue/ bundle), when present.
RENDERED_KUEUE_CONFIG = REPO_ROOT / "kueue" / "kueue-manager-config.yaml"
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
SCRAPE_TARGETS_DIR = "prometheus-targets"  # file_sd targets of the job components.CONTROLLER_SCRAPE_JOB


def default_state_dir() -> Path:
    return cache_root() / "cluster"


class ClusterState(BaseModel):
    """What `up` started; written to <state_dir>/state.json."""

    state_dir: str
    kubeconfig: str
    server: str
    ports: dict[str, int]
    processes: list[procs.ProcessRecord] = Field(default_factory=list)
    addons: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    startup_seconds: dict[str, float] = Field(default_factory=dict)
    # The Kueue release running (hack/versions.env KUEUE_VERSION or $GHOSTGPU_KUEUE_VERSION).
    kueue_version: str | None = None
    # The real node (kubelet + containerd) when it runs; why not, when it was asked for and failed.
    real_node: str | None = None
    real_node_error: str | None = None
    node_images: realnode.NodeImages | None = None
    # What serves the Prometheus query API at prometheus_url: Prometheus or VictoriaMetrics.
    metrics_store: str = victoriametrics.PROMETHEUS

    @property
    def prometheus_url(self) -> str:
        """The metrics store's query API (Prometheus's, or VictoriaMetrics' in its place)."""
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def dcgm_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['dcgm']}"

    def running(self) -> dict[str, bool]:
        return {p.name: procs.alive(p) for p in self.processes}


class DevCluster:
    """Python API behind the CLI and the pytest fixtures.

    >>> c = DevCluster.up()                     # or DevCluster.attach() for a running one
    >>> c.state.kubeconfig                      # admin kubeconfig (system:masters)
    >>> c.process_tables.set("ns", "pod", [ProcessRow(pid=1, stat="Ss", args="python serve.py")])
    >>> c.dcgm.set("ns", "pod", util=0, fb_used_mib=1024)
    >>> c.state.prometheus_url                  # the real Prometheus scraping the fake exporter
    >>> c.state.real_node                       # "localhost": kubelet + containerd, real pods
    >>> c.down()
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.state_dir = Path(state.state_dir)
        self._kube: Kube | None = None

    # ----- public API -----
    @property
    def kubeconfig(self) -> Path:
        return Path(self.state.kubeconfig)

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(self.kubeconfig)
        return self._kube

    def embedded_kubeconfig(self) -> str:
        """The admin kubeconfig with its CA, certificate and key inline (no file paths): what
        another program that cannot read this state directory needs, e.g. a MultiKueue manager's
        Secret for this cluster as a worker (Kueue refuses kubeconfigs that name files)."""
        return components.embedded_kubeconfig(yaml.safe_load(self.kubeconfig.read_text()))

    @property
    def process_tables(self) -> ProcessTables:
        return ProcessTables(self.kube, self.state_dir / "proctables")

    @property
    def dcgm(self) -> FakeDcgmClient:
        return FakeDcgmClient(self.state.dcgm_url)

    def scrape(
        self, name: str, port: int, *, labels: Mapping[str, str] | None = None, path: str = "/metrics"
    ) -> None:
        """Let Prometheus scrape 127.0.0.1:port<path> (job ghostgpu-controller, label target=name and
        `labels`) until unscrape(name). Prometheus picks the file up within about a second."""
        if "prometheus" not in self.state.addons:
            raise RuntimeError("this devcluster runs without Prometheus")
        targets = self.state_dir / SCRAPE_TARGETS_DIR
        if not targets.is_dir():
            raise RuntimeError(f"{targets}: missing; this devcluster predates scrape targets, restart it")
        tmp = targets / f".{name}.json.tmp"  # written aside, then renamed: never a half file
        target = {"target": name, **(labels or {}), "__metrics_path__": path}
        tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": target}]))
        tmp.rename(targets / f"{name}.json")

    def unscrape(self, name: str) -> None:
        (self.state_dir / SCRAPE_TARGETS_DIR / f"{name}.json").unlink(missing_ok=True)
        (self.state_dir / SCRAPE_TARGETS_DIR / components.TENANT_PODS_DIR / f"{name}.json").unlink(
            missing_ok=True
        )

    def scrape_pod(self, name: str, port: int, namespace: str, pod: str, path: str = "/metrics") -> None:
        """Let Prometheus scrape 127.0.0.1:port<path> as a tenant pod's target (job kubernetes-pods,
        honor_labels: the exporter's own labels win over namespace/pod/job/instance) until
        unscrape(name)."""
        pods = self.state_dir / SCRAPE_TARGETS_DIR / components.TENANT_PODS_DIR
        if not pods.is_dir():
            raise RuntimeError(f"{pods}: missing; this devcluster predates tenant pod targets, restart it")
        labels = {"namespace": namespace, "pod": pod, "__metrics_path__": path}
        tmp = pods / f".{name}.json.tmp"
        tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": labels}]))
        tmp.rename(pods / f"{name}.json")

    def stop_node_daemon(self, program: str) -> realnode.DaemonLaunch:
        """Stop the real node's kubelet or containerd (a real fault for tests); `start_node_daemon`
        starts it again as it ran. Raises RuntimeError without a real node."""
        if self.state.real_node is None:
            raise RuntimeError("this devcluster runs no real node")
        return realnode.stop_daemon(self.state_dir, program)

    def start_node_daemon(self, launch: realnode.DaemonLaunch) -> None:
        """Start what `stop_node_daemon` stopped, and record it (`attach` and `status` find it running)."""
        rec = realnode.start_daemon(self.state_dir, launch)
        self.state.processes = [rec if p.name == rec.name else p for p in self.state.processes]
        (self.state_dir / "state.json").write_text(self.state.model_dump_json(indent=2))

    def restart_kueue(
        self,
        overrides: Mapping[str, Any] | None = None,
        timeout: float = 120,
        feature_gates: Mapping[str, bool] | None = None,
    ) -> float:
        """Restart the Kueue manager with its Configuration (kueue-config.yaml in the state dir, as
        started) merged with `overrides` (nested mappings merge, None removes a key, anything else
        replaces); None restores the Configuration it started with. Kueue reads its Configuration
        only at start, so a test that needs another one (waitForPodsReady, fairSharing) restarts the
        manager instead of a whole cluster. `feature_gates`: the extra gates of its --feature-gates
        flag from now on (None keeps the flag as it runs; {} the devcluster's own gates only).
        Returns the seconds until /readyz answered."""
        if "kueue" not in self.state.addons:
            raise RuntimeError("this devcluster runs without Kueue")
        started = self.state_dir / "kueue-config.yaml"
        original = self.state_dir / "kueue-config.original.yaml"
        if not original.exists():
            shutil.copy(started, original)
        cfg = merge_overrides(yaml.safe_load(original.read_text()), overrides or {})
        started.write_text(yaml.safe_dump(cfg, sort_keys=True))
        [old] = [p for p in self.state.processes if p.name == "kueue"]
        if not procs.alive(old):
            raise RuntimeError(f"kueue (pid {old.pid}) is not running; log tail:\n{procs.tail(old.log)}")
        # The record keeps argv[0] only: the running manager's own command line is the one to repeat.
        argv = [a.decode() for a in Path(f"/proc/{old.pid}/cmdline").read_bytes().split(b"\0") if a]
        if feature_gates is not None:
            flag = components.kueue_feature_gates_flag(dict(feature_gates))
            argv = [flag if a.startswith("--feature-gates=") else a for a in argv]
        t0 = time.monotonic()
        procs.stop(old)
        rec = procs.start("kueue", argv, self.state_dir / "logs", cwd=self.state_dir)
        self.state.processes = [rec if p.name == "kueue" else p for p in self.state.processes]
        (self.state_dir / "state.json").write_text(self.state.model_dump_json(indent=2))
        url = f"http://127.0.0.1:{self.state.ports['kueue_health']}/readyz"
        procs.wait_for("kueue /readyz", lambda: httpx.get(url, timeout=2).status_code == 200, timeout, rec)
        return time.monotonic() - t0

    @classmethod
    def attach(cls, state_dir: Path | None = None) -> DevCluster | None:
        """The cluster recorded in state_dir if every one of its processes still runs."""
        f = (state_dir or default_state_dir()) / "state.json"
        if not f.exists():
            return None
        state = read_state(f)
        if state.processes and all(state.running().values()):
            return cls(state)
        return None

    @classmethod
    def up(
        cls,
        state_dir: Path | None = None,
        nodes: list[GpuNodeSpec] | None = None,
        addons: tuple[str, ...] = ALL_ADDONS,
        log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
        audit_policy: str | None = None,
        real_node: bool = True,
        kueue_overrides: Mapping[str, Any] | None = None,
        kueue_feature_gates: Mapping[str, bool] | None = None,
        extra_crds: bool = True,
        metrics_store: str = victoriametrics.PROMETHEUS,
    ) -> DevCluster:
        """`audit_policy`: an audit Policy (YAML text); the apiserver then writes its audit log to
        `<state_dir>/logs/audit.log` (the scale bench counts the controller's requests there).
        `real_node`: also start the real node (kubelet, containerd, runc: ghostgpu.devcluster.realnode).
        If it cannot start, the rest of the cluster still runs and `state.real_node_error` says why.
        `nodes`: the kwok nodes (None: default_nodes(); [] starts none, e.g. a MultiKueue manager).
        `kueue_overrides`: merged into Kueue's Configuration at start (merge_overrides), e.g. a
        `multiKueue` section; `kueue_feature_gates`: added to Kueue's --feature-gates flag (Kueue
        refuses gates in both the flag and the Configuration's `featureGates`). `extra_crds`: also
        install the CRDs of kinds no controller here runs (ServiceMonitor, Argo CD, Flux, the
        manager kinds of the actuator table); without them the control plane is lighter and
        Kueue sets up no integration for those kinds. `metrics_store`: what the `prometheus` addon
        runs to scrape and answer queries, Prometheus or VictoriaMetrics' single-node server (the
        same scrape configuration, the same port and state.prometheus_url)."""
        state_dir = state_dir or default_state_dir()
        existing = cls.attach(state_dir)
        if existing is not None:
            log(f"devcluster already running (state {state_dir}); reusing it")
            return existing
        unknown = set(addons) - set(ALL_ADDONS)
        if unknown:
            raise ValueError(f"unknown addon(s) {sorted(unknown)}; expected some of {list(ALL_ADDONS)}")
        if metrics_store not in victoriametrics.METRICS_STORES:
            raise ValueError(
                f"metrics store {metrics_store!r}: expected one of {list(victoriametrics.METRICS_STORES)}"
            )
        tools = Toolchain.locate()
        needed = ["etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kwok"]
        needed += EXTRA_CRD_DIRS if extra_crds else []
        needed += ["kueue"] if "kueue" in addons else []
        needed += ["kyverno_admission", "kyverno_background"] if "kyverno" in addons else []
        needed += [metrics_store] if "prometheus" in addons else []
        needed += ["kubelet", "containerd", "ctr", "runc", "containerd_shim"] if real_node else []
        missing = tools.missing(*needed)
        if missing:
            build = "hack/testbin" + (f" kueue@{tools.kueue_version}" if str(tools.kueue) in missing else "")
            raise FileNotFoundError(f"devcluster binaries missing (run {build}): " + ", ".join(missing))
        cls._stop_recorded(state_dir)  # a half-dead previous cluster: clear it first
        if state_dir.exists():
            shutil.rmtree(state_dir)
        starter = _Starter(
            state_dir,
            tools,
            default_nodes() if nodes is None else nodes,
            tuple(addons),
            log,
            audit_policy,
            real_node,
            kueue_overrides=kueue_overrides,
            kueue_feature_gates=kueue_feature_gates,
            extra_crds=extra_crds,
            metrics_store=metrics_store,
        )
        try:
            state = starter.run()
        except BaseException:
            starter.stop_all()
            raise
        return cls(state)

    def down(self) -> None:
        DevCluster._stop_recorded(self.state_dir)

    @staticmethod
    def _stop_recorded(state_dir: Path) -> list[str]:
        f = state_dir / "state.json"
        if not f.exists():
            return realnode.cleanup(state_dir) if (state_dir / "realnode").exists() else []
        state = read_state(f)
        stopped = []
        for p in reversed(state.processes):  # dependents first, etcd last
            if procs.alive(p):
                procs.stop(p)
                stopped.append(p.name)
        if (state_dir / "realnode").exists():
            # Its containers, shims, mounts and cgroups outlive kubelet and containerd.
            stopped += realnode.cleanup(state_dir)
        # Only meaningful right after we stopped something: once the recorded processes are long
        # gone, other programs may legitimately have the same (randomly picked) ports.
        busy = [f"{n}:{port}" for n, port in state.ports.items() if stopped and procs.port_open(port)]
        if busy:
            raise RuntimeError(f"ports still in use after stopping the devcluster: {', '.join(busy)}")
        return stopped


def merge_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` applied: nested mappings merge, None removes the key, anything else
    replaces it (a list is replaced whole)."""
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = value
    return out


def down(state_dir: Path | None = None) -> list[str]:
    """Stop every process recorded in state_dir; returns their names. Safe when nothing runs."""
    return DevCluster._stop_recorded(state_dir or default_state_dir())


def status(state_dir: Path | None = None) -> ClusterState | None:
    f = (state_dir or default_state_dir()) / "state.json"
    return read_state(f) if f.exists() else None


def read_state(f: Path) -> ClusterState:
    """What `up` recorded; a file that is not one is named, with what to do about it."""
    try:
        return ClusterState.model_validate_json(f.read_text())
    except ValueError as exc:  # pydantic's ValidationError, bad JSON included
        from ghostgpu.boundary import input_error

        first = (str(exc).splitlines() or [""])[-2:][0].strip()
        raise input_error(
            f"{f}: not a devcluster state file ({first})",
            "stop the processes it lists by hand and remove it, or give another --state-dir",
        ) from None


class _Starter:
    def __init__(
        self,
        state_dir: Path,
        tools: Toolchain,
        nodes: list[GpuNodeSpec],
        addons: tuple[str, ...],
        log: Callable[[str], None],
        audit_policy: str | None = None,
        real_node: bool = False,
        *,
        kueue_overrides: Mapping[str, Any] | None = None,
        kueue_feature_gates: Mapping[str, bool] | None = None,
        extra_crds: bool = True,
        metrics_store: str = victoriametrics.PROMETHEUS,
    ) -> None:
        self.dir = state_dir
        self.metrics_store = metrics_store
        self.extra_crds = extra_crds
        self.kueue_overrides = dict(kueue_overrides or {})
        self.kueue_feature_gates = dict(kueue_feature_gates or {})
        self.real_node = real_node
        self.audit_policy = audit_policy
        self.tools = tools
        self.nodes = nodes
        self.addons = addons
        self.log = log
        self.logs = state_dir / "logs"
        self.logs.mkdir(parents=True)
        self.pki = CertAuthority(state_dir / "pki")
        names = ["etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok", "kueue_webhook"]
        names += [
            "kueue_health",
            "kueue_metrics",
            "kueue_visibility",
            "kyverno_webhook",
            "kyverno_metrics",
            "kyverno_bg_metrics",
        ]
        names += ["dcgm", "prometheus"]
        names += ["kubelet", "kubelet_healthz", "cri_stream"] if real_node else []
        self.ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
        self.kubeconfig = state_dir / "kubeconfig"
        self.state = ClusterState(
            state_dir=str(state_dir),
            kubeconfig=str(self.kubeconfig),
            server=f"https://127.0.0.1:{self.ports['apiserver']}",
            ports=self.ports,
            addons=list(addons),
            nodes=[n.name for n in nodes],
            kueue_version=tools.kueue_version if "kueue" in addons else None,
            metrics_store=metrics_store,
        )
        self.t0 = time.monotonic()

    # ----- bookkeeping -----
    def _save(self) -> None:
        (self.dir / "state.json").write_text(self.state.model_dump_json(indent=2))

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> procs.ProcessRecord:
        rec = procs.start(name, argv, self.logs, env=env, cwd=self.dir)
        self.state.processes.append(rec)
        self._save()
        return rec

    def _mark(self, what: str) -> None:
        t = round(time.monotonic() - self.t0, 1)
        self.state.startup_seconds[what] = t
        self._save()
        self.log(f"[devcluster {t:6.1f}s] {what} ready")

    def stop_all(self) -> None:
        """A failed start: everything it started goes, the real node's host traces too (its mounts,
        cgroups and containers outlive its processes, and no state is left for `down` to find)."""
        for p in reversed(self.state.processes):
            procs.stop(p)
        if (self.dir / "realnode").exists():
            realnode.cleanup(self.dir)

    def _https_ok(self, port: int, path: str, client_cert: bool = True) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki.cert_path))
        if client_cert:
            ctx.load_cert_chain(str(self.pki.dir / "admin.crt"), str(self.pki.dir / "admin.key"))
        r = httpx.get(f"https://127.0.0.1:{port}{path}", verify=ctx, timeout=2)
        return r.status_code == 200

    def _insecure_ok(self, url: str) -> bool:
        return httpx.get(url, verify=False, timeout=2).status_code == 200

    # ----- the sequence -----
    def run(self) -> ClusterState:
        self._save()
        self._certs()
        self._etcd()
        self._apiserver()
        self.kube = Kube(self.kubeconfig)
        self._controllers()  # they need no CRDs: let them start while the CRDs go in
        self._crds_and_bootstrap()
        self._kwok()
        if "kueue" in self.addons:
            self._kueue()
        if "kyverno" in self.addons:
            self._kyverno()
        if "prometheus" in self.addons:
            self._prometheus()
        self._nodes()
        if self.real_node:
            self._start_real_node()
        self._wait_addons()
        self._mark("cluster")
        return self.state

    def _certs(self) -> None:
        self.pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ips=("127.0.0.1", "10.96.0.1"),
        )
        self.pki.issue("admin", "ghostgpu-admin", org="system:masters", client=True)
        self.pki.issue("kubelet-client", "kube-apiserver-kubelet-client", org="system:masters", client=True)
        self.pki.issue("kwok", "kwok", server=True, dns=("localhost",), ips=("127.0.0.1",))
        if self.real_node:
            node = realnode.REAL_NODE_NAME
            self.pki.issue("real-node", f"system:node:{node}", org="system:nodes", client=True)
            self.pki.issue("real-node-serving", node, server=True, dns=(node,), ips=("127.0.0.1",))
        kueue_dir = self.dir / "kueue-certs"
        kueue_dir.mkdir()
        pair = self.pki.issue(
            "kueue-webhook", "kueue-webhook", server=True, dns=("localhost",), ips=("127.0.0.1",)
        )
        shutil.copy(pair.cert, kueue_dir / "tls.crt")
        shutil.copy(pair.key, kueue_dir / "tls.key")
        service_account_keys(self.pki.dir)
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "ghostgpu-devcluster",
                            "cluster": {
                                "server": self.state.server,
                                "certificate-authority": str(self.pki.cert_path),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": "ghostgpu-admin",
                            "user": {
                                "client-certificate": str(self.pki.dir / "admin.crt"),
                                "client-key": str(self.pki.dir / "admin.key"),
                            },
                        }
                    ],
                    "contexts": [
                        {
                            "name": "ghostgpu-devcluster",
                            "context": {"cluster": "ghostgpu-devcluster", "user": "ghostgpu-admin"},
                        }
                    ],
                    "current-context": "ghostgpu-devcluster",
                },
                sort_keys=False,
            )
        )

    def _etcd(self) -> None:
        p, peer = self.ports["etcd"], self.ports["etcd_peer"]
        rec = self._start(
            "etcd",
            [
                str(self.tools.etcd),
                "--name=devcluster",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p}",
                f"--advertise-client-urls=http://127.0.0.1:{p}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=devcluster=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",  # a throw-away test store: durability costs start-up time
                "--log-level=warn",
            ],
        )
        procs.wait_for(
            "etcd /health",
            lambda: httpx.get(f"http://127.0.0.1:{p}/health", timeout=2).json().get("health") == "true",
            60,
            rec,
        )
        self._mark("etcd")

    def _audit_flags(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(self.audit_policy)
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.logs / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # every event is on disk when its request returns
            "--audit-log-maxsize=100000",  # MB; rotated parts (0 means 100 MB) are read too
        ]

    def _apiserver(self) -> None:
        pki = self.pki.dir
        port = self.ports["apiserver"]
        rec = self._start(
            "kube-apiserver",
            [
                str(self.tools.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={self.pki.cert_path}",
                # Node: the real node's kubelet acts as system:node:<name>, as on a real cluster.
                "--authorization-mode=Node,RBAC",
                # The real kubelet by its Hostname (`localhost`: it refuses a loopback node IP);
                # kwok's nodes have none and are reached by their InternalIP 127.0.0.1.
                "--kubelet-preferred-address-types=Hostname,InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                # Exec to kwok pods goes apiserver -> kwok's kubelet endpoint with this identity.
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self._audit_flags(),
            ],
        )
        procs.wait_for("kube-apiserver /readyz", lambda: self._https_ok(port, "/readyz"), 120, rec)
        self._mark("kube-apiserver")

    def _crds_and_bootstrap(self) -> None:
        crds = load_yaml_docs(sorted(self.tools.kwok_crd_dir.glob("*.yaml")))
        if self.extra_crds:
            # ServiceMonitor and PrometheusRule, so the controller/ bundle applies as in prod.
            crds += load_yaml_docs(sorted(self.tools.monitoring_crd_dir.glob("*.yaml")))
            # Application, ApplicationSet, AppProject: examples/argocd/ is dry-run against them.
            crds += load_yaml_docs(sorted(self.tools.argocd_crd_dir.glob("*.yaml")))
            # Flux's Kustomization: the GitOps pre-flight reads one (no Flux controller runs).
            crds += load_yaml_docs(sorted(self.tools.flux_crd_dir.glob("*.yaml")))
            # LeaderWorkerSet, InferenceService, ScaledObject (no controller runs): every actuator's
            # stop and restore is written against the real schema; installed before Kyverno
            # starts, so the tracking policy's rules for these kinds are admitted at once.
            crds += load_yaml_docs(sorted(self.tools.owner_crd_dir.glob("*.yaml")))
        ca = self.pki.pem
        if "kueue" in self.addons:
            crds += components.kueue_crds(
                self.tools.kueue_crd_dir, self.tools.kueue_webhook_dir, self.ports["kueue_webhook"], ca
            )
        if "kyverno" in self.addons:
            crds += load_yaml_docs(sorted(self.tools.kyverno_crd_dir.rglob("*.yaml")))
        crds = [c for c in crds if c.get("kind") == "CustomResourceDefinition"]
        self.kube.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")  # discover once
        # Kyverno's CRDs are megabytes of schema; a few in flight at once halves this step.
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(self.kube.apply, crds))
        self.kube.wait_crds_established([c["metadata"]["name"] for c in crds])
        if "kueue" in self.addons:
            self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
        if "kyverno" in self.addons:
            self.kube.apply_all(components.kyverno_bootstrap())
        self._mark(f"{len(crds)} CRDs")

    def _controllers(self) -> None:
        kc = str(self.kubeconfig)
        pki = self.pki.dir
        self._kcm = self._start(
            "kube-controller-manager",
            [
                str(self.tools.kube_controller_manager),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['kcm']}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.pki.cert_path}",
                "--use-service-account-credentials=false",
                "--v=1",
            ],
        )
        self._sched = self._start(
            "kube-scheduler",
            [
                str(self.tools.kube_scheduler),
                # Its kubeconfig and leader election are in the config file (which overrides flags).
                f"--config={self._scheduler_config(kc)}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                "--v=1",
            ],
        )

    def _scheduler_config(self, kubeconfig: str) -> Path:
        path = self.dir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(realnode.scheduler_config(kubeconfig), sort_keys=True))
        return path

    def _kwok(self) -> None:
        cfg = components.kwok_stage_config(self.tools.kwok_stage_dir, self.dir / "kwok.yaml")
        shims = install_shims(self.dir / "exec-bin")
        (self.dir / "proctables").mkdir()
        port = self.ports["kwok"]
        pki = self.pki.dir
        self._kwok_rec = self._start(
            "kwok",
            [
                str(self.tools.kwok),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={cfg}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
                "--node-ip=127.0.0.1",
                f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}",
                f"--tls-cert-file={pki / 'kwok.crt'}",
                f"--tls-private-key-file={pki / 'kwok.key'}",
                "--cidr=10.0.0.1/16",
                "--node-lease-duration-seconds=40",
                "--enable-crds=Exec,ClusterExec",
            ],
            # kwok runs exec'd commands itself: our `ps` shim must come first on its PATH.
            env={"PATH": f"{shims}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        )

    def _kueue(self) -> None:
        ca = self.pki.pem
        cfg = components.kueue_config(
            self.ports["kueue_webhook"],
            self.ports["kueue_health"],
            self.ports["kueue_metrics"],
            self.dir / "kueue-certs",
            base=components.rendered_kueue_config(RENDERED_KUEUE_CONFIG),
        )
        cfg = merge_overrides(cfg, self.kueue_overrides)
        cfg_path = self.dir / "kueue-config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=True))
        self.kube.apply_all(
            components.kueue_webhook_configs(self.tools.kueue_webhook_dir, self.ports["kueue_webhook"], ca)
        )
        self._kueue_metrics_certs()
        self._kueue_rec = self._start(
            "kueue",
            [
                str(self.tools.kueue),
                f"--config={cfg_path}",
                f"--kubeconfig={self.kubeconfig}",
                components.kueue_feature_gates_flag(self.kueue_feature_gates),
            ],
        )

    def _kueue_metrics_certs(self) -> None:
        # Kueue (v0.17 to v0.19 at least) reads its metrics serving cert from this fixed path whenever
        # internal cert management is off (cmd/kueue/main.go); nothing verifies it here, any cert will do.
        # Every devcluster on the host (one per test worker) shares the path, so a valid pair already
        # there is kept, and a new one is written under a lock, each file renamed into place: a Kueue
        # starting in another cluster never reads one cluster's cert beside another's key.
        try:
            install_shared_pair(
                KUEUE_METRICS_CERT_DIR,
                lambda: self.pki.issue("kueue-metrics", "kueue-metrics", server=True, ips=("127.0.0.1",)),
            )
        except PermissionError as e:
            raise RuntimeError(
                f"Kueue needs its metrics certificate in {KUEUE_METRICS_CERT_DIR} (a fixed path in "
                f"Kueue's main.go) and this user cannot write there: {e}; run as root or use --no-kueue"
            ) from e

    def _kyverno(self) -> None:
        wport = self.ports["kyverno_webhook"]
        self._kyverno_rec = self._start(
            "kyverno-admission",
            [
                str(self.tools.kyverno_admission),
                f"--kubeconfig={self.kubeconfig}",
                f"--serverIP=127.0.0.1:{wport}",
                "--webhookServerHost=127.0.0.1",
                f"--webhookServerPort={wport}",
                "--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca",
                "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair",
                "--backgroundServiceAccountName=system:serviceaccount:kyverno:kyverno-background-controller",
                "--reportsServiceAccountName=system:serviceaccount:kyverno:kyverno-reports-controller",
                "--admissionReports=false",
                "--metricsHost=127.0.0.1",
                f"--metricsPort={self.ports['kyverno_metrics']}",
                "--controllerRuntimeMetricsAddress=0",
                # Refresh discovery when a CRD appears: tests install manager CRDs (KubeRay's
                # RayCluster, test doubles) after Kyverno started; without it Kyverno refuses
                # those kinds ("resource ... not found in group") until its 15 min resync.
                "--crdWatcher=true",
                "--disableLogColor",
                "-v=2",
            ],
            env=components.kyverno_env("kyverno-admission-controller"),
        )
        self._kyverno_bg_rec = self._start(
            "kyverno-background",
            [
                str(self.tools.kyverno_background),
                f"--kubeconfig={self.kubeconfig}",
                "--metricsHost=127.0.0.1",
                f"--metricsPort={self.ports['kyverno_bg_metrics']}",
                "--controllerRuntimeMetricsAddress=0",
                # Refresh discovery when a CRD appears: tests install manager CRDs (KubeRay's
                # RayCluster, test doubles) after Kyverno started; without it Kyverno refuses
                # those kinds ("resource ... not found in group") until its 15 min resync.
                "--crdWatcher=true",
                "--disableLogColor",
                "-v=2",
            ],
            env=components.kyverno_env("kyverno-background-controller"),
        )

    def _prometheus(self) -> None:
        dport, pport = self.ports["dcgm"], self.ports["prometheus"]
        self._dcgm_rec = self._start(
            "fake-dcgm-exporter", [sys.executable, "-m", "ghostgpu.devcluster.fake_dcgm", f"--port={dport}"]
        )
        cfg = self.dir / "prometheus.yml"
        targets = self.dir / SCRAPE_TARGETS_DIR
        (targets / components.TENANT_PODS_DIR).mkdir(parents=True)
        kubelet = None
        if self.real_node:  # scraped from the start; it answers once the real node runs
            pki = self.pki.dir
            kubelet = components.KubeletScrape(
                port=self.ports["kubelet"],
                ca_file=self.pki.cert_path,
                cert_file=pki / "kubelet-client.crt",
                key_file=pki / "kubelet-client.key",
            )
        config = components.prometheus_config(dport, targets, prometheus_port=pport, kubelet=kubelet)
        if self.metrics_store == victoriametrics.VICTORIAMETRICS:
            cfg = self.dir / "victoriametrics-scrape.yml"
            cfg.write_text(yaml.safe_dump(victoriametrics.scrape_config(config), sort_keys=True))
            argv = victoriametrics.argv(self.tools.victoriametrics, cfg, self.dir / "victoriametrics", pport)
            self._prom_rec = self._start("victoriametrics", argv)
            return
        cfg.write_text(yaml.safe_dump(config, sort_keys=True))
        self._prom_rec = self._start(
            "prometheus",
            [
                str(self.tools.prometheus),
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.dir / 'prometheus'}",
                f"--web.listen-address=127.0.0.1:{pport}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
        )

    def _nodes(self) -> None:
        procs.wait_for(
            "kube-controller-manager /healthz",
            lambda: self._insecure_ok(f"https://127.0.0.1:{self.ports['kcm']}/healthz"),
            90,
            self._kcm,
        )
        procs.wait_for(
            "kube-scheduler /healthz",
            lambda: self._insecure_ok(f"https://127.0.0.1:{self.ports['scheduler']}/healthz"),
            90,
            self._sched,
        )
        self._mark("controller-manager + scheduler")
        procs.wait_for(
            "kwok /healthz",
            lambda: self._insecure_ok(f"https://127.0.0.1:{self.ports['kwok']}/healthz"),
            60,
            self._kwok_rec,
        )
        for spec in self.nodes:
            self.kube.apply(node_manifest(spec))
        core = self.kube.api_client

        def nodes_ready() -> bool:
            items = client.CoreV1Api(core).list_node().items
            ready = {
                n.metadata.name
                for n in items
                if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            }
            return {s.name for s in self.nodes} <= ready

        procs.wait_for(f"{len(self.nodes)} kwok GPU nodes Ready", nodes_ready, 60, self._kwok_rec)
        # The default ServiceAccount must exist before pods can be created in a namespace.
        procs.wait_for(
            "default ServiceAccount",
            lambda: client.CoreV1Api(core).read_namespaced_service_account("default", "default") is not None,
            60,
            self._kcm,
        )
        self._mark(f"kwok + {len(self.nodes)} GPU nodes")

    def _start_real_node(self) -> None:
        """The real node; if it cannot start, it is cleaned away and the reason recorded."""
        try:
            self._real_node()
        except (RuntimeError, TimeoutError, OSError, client.ApiException) as e:
            self.log(f"[devcluster] real node failed: {e}")
            for p in [p for p in self.state.processes if p.name in ("kubelet", "containerd")]:
                procs.stop(p)
                self.state.processes.remove(p)
            realnode.cleanup(self.dir)
            self.state.real_node, self.state.real_node_error = None, str(e)
            self._save()

    def _real_node(self) -> None:
        images = realnode.build_images()
        self.state.node_images = images
        lay = realnode.Layout(self.dir)
        realnode.prepare(lay)
        lay.containerd_config.write_text(
            realnode.containerd_config(
                lay, self.tools.runc, self.tools.cni_bin_dir, images.pause, self.ports["cri_stream"]
            )
        )
        # The shim is found on containerd's PATH: ours first.
        path = f"{self.tools.containerd_shim.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        ctrd = self._start(
            "containerd",
            [str(self.tools.containerd), f"--config={lay.containerd_config}", "--log-level=warn"],
            env={**realnode.NO_PULLS_ENV, "PATH": path},
        )
        version = [str(self.tools.ctr), "--address", str(lay.socket), "version"]
        procs.wait_for(
            "containerd socket",
            lambda: subprocess.run(version, capture_output=True, check=False).returncode == 0,
            30,
            ctrd,
        )
        realnode.import_images(self.tools.ctr, lay, images)
        self._mark("containerd + node images")
        spec = realnode.gpu_node_spec(self.nodes)
        realnode.write_kubelet_files(
            lay,
            self.state.server,
            self.pki.dir,
            self.pki.cert_path,
            (self.ports["kubelet"], self.ports["kubelet_healthz"]),
            spec,
        )
        realnode.hold_sysctls(self.dir)  # before the kubelet changes them
        kubelet = self._start(
            "kubelet",
            realnode.kubelet_argv(self.tools.kubelet, lay, spec),
            env={**realnode.NO_PULLS_ENV, "PATH": path},
        )
        core = client.CoreV1Api(self.kube.api_client)

        def ready() -> bool:
            n = core.read_node(spec.name)
            return any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])

        procs.wait_for("real node Ready", ready, 90, kubelet)
        # An extended resource, the documented way: the kubelet keeps it and enforces it.
        core.patch_node_status(spec.name, {"status": {"capacity": {GPU_RESOURCE: str(spec.gpus)}}})
        procs.wait_for(
            "real node allocatable nvidia.com/gpu",
            lambda: (core.read_node(spec.name).status.allocatable or {}).get(GPU_RESOURCE) == str(spec.gpus),
            30,
            kubelet,
        )
        self.state.real_node = spec.name
        self.state.nodes.append(spec.name)
        self._mark("real node")

    def _wait_addons(self) -> None:
        if "kueue" in self.addons:
            procs.wait_for(
                "kueue /readyz",
                lambda: (
                    httpx.get(f"http://127.0.0.1:{self.ports['kueue_health']}/readyz", timeout=2).status_code
                    == 200
                ),
                120,
                self._kueue_rec,
            )
            self._mark("kueue")
        if "kyverno" in self.addons:
            names = ["kyverno-resource-mutating-webhook-cfg", "kyverno-resource-validating-webhook-cfg"]

            def kyverno_ready() -> bool:
                return self._insecure_ok(
                    f"https://127.0.0.1:{self.ports['kyverno_webhook']}/health/readiness"
                ) and all(
                    self.kube.get("admissionregistration.k8s.io/v1", k, n) is not None
                    for k, n in zip(
                        ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"], names, strict=True
                    )
                )

            procs.wait_for("kyverno webhooks registered", kyverno_ready, 180, self._kyverno_rec)
            # Both controllers run their work loops only as leaders: a held lease means started.
            for lease in ("kyverno", "kyverno-background-controller"):
                procs.wait_for(
                    f"leader lease {lease}",
                    lambda lease=lease: bool(
                        client.CoordinationV1Api(self.kube.api_client)
                        .read_namespaced_lease(lease, components.KYVERNO_NAMESPACE)
                        .spec.holder_identity
                    ),
                    90,
                    self._kyverno_bg_rec if "background" in lease else self._kyverno_rec,
                )
            self._mark("kyverno")
        if "prometheus" in self.addons:
            procs.wait_for(
                f"{self.metrics_store} /-/ready",
                lambda: httpx.get(f"{self.state.prometheus_url}/-/ready", timeout=2).status_code == 200,
                60,
                self._prom_rec,
            )
            procs.wait_for(
                "fake dcgm-exporter",
                lambda: httpx.get(f"{self.state.dcgm_url}/healthz", timeout=2).status_code == 200,
                30,
                self._dcgm_rec,
            )
            self._mark(f"{self.metrics_store} + fake dcgm-exporter")


def status_lines(state: ClusterState | None) -> list[str]:
    if state is None:
        return ["devcluster: not started (no state.json)"]
    run = state.running()
    lines = [
        f"devcluster state: {state.state_dir}",
        f"kubeconfig: {state.kubeconfig}",
        f"server: {state.server}",
    ]
    if state.kueue_version:
        lines.append(f"kueue: {state.kueue_version}")
    if "prometheus" in state.addons:
        lines += [f"{state.metrics_store}: {state.prometheus_url}", f"fake dcgm-exporter: {state.dcgm_url}"]
    for p in state.processes:
        lines.append(f"  {p.name:<26} pid {p.pid:<8} {'running' if run[p.name] else 'STOPPED'}  log {p.log}")
    lines.append(f"nodes: {', '.join(state.nodes)}")
    if state.real_node:
        lines.append(f"real node: {state.real_node} (kubelet + containerd; pods need hostNetwork: true)")
    elif state.real_node_error:
        lines.append(f"real node: FAILED: {state.real_node_error}")
    lines.append("startup: " + json.dumps(state.startup_seconds))
    return lines
