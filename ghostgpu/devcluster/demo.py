"""`ghostgpu devcluster demo`: the controller catching ghosts on the devcluster's real node.

A small fleet in two team namespaces runs real processes (kubelet, containerd, runc); only the GPU
is a double (the fake dcgm-exporter serves utilization: zero for the ghosts, non-zero for the live
trainer). A Kueue Job waits behind the ghosts: Kueue's topology-aware scheduling counts the pods held
outside Kueue against the node, so it is admitted only once the ghosts are stopped. The controller
runs in shadow (verdicts, `ghostgpu status`, `ghostgpu report`), then in enforce (the ghosts
scaled to zero by their Deployment/StatefulSet), then `ghostgpu restore` brings one back."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from rich.console import Console
from rich.table import Table

from ghostgpu.boundary import BoundaryError
from ghostgpu.devcluster.cluster import DevCluster, default_state_dir
from ghostgpu.devcluster.fleet import (
    GPU_TOLERATION,
    SLEEP_LONG,
    Box,
    RealShape,
    deployment,
    real_node_pod_spec,
    sh,
    the_running_pod,
)
from ghostgpu.devcluster.paths import REPO_ROOT, TESTBIN_FIX
from ghostgpu.devcluster.realnode import REAL_NODE_GPUS, REAL_NODE_LABEL, REAL_NODE_TAINT

RESEARCH, INFERENCE = "team-research", "team-inference"
LEASE_NS = "ghostgpu-system"
OPT_IN = {"ghostgpu.io/reclaim": "enabled"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
HOSTNAME = "kubernetes.io/hostname"
RECLAIMABLE = frozenset({"FINISHED_IDLE", "ZOMBIE_CRASHED"})
JOB_NAME, JOB_GPUS = "finetune", 12
CLUSTER_CLOCK = re.compile(r"^\[devcluster[^]]*\]\s*")  # "[devcluster   4.1s] etcd ready"


DEMO_FIX = (
    "the lines above say what failed; `ghostgpu devcluster demo --keep` leaves the cluster up to "
    "look at (docs/devcluster.md)"
)


class DemoError(BoundaryError):
    """A situation the demo cannot go on from: what happened (the first line, then any log lines)
    and what to do."""

    def __init__(self, what: str, fix: str = DEMO_FIX) -> None:
        first, *rest = what.splitlines() or [""]
        super().__init__(f"error: devcluster demo: {first}", *rest, f"fix: {fix}")


@dataclass(frozen=True)
class Workload:
    """One member of the demo fleet and the verdict its real processes should earn."""

    name: str
    namespace: str
    kind: str  # Deployment or StatefulSet: the manager that stops and restores it
    story: str
    box: Box
    util: float  # what the fake dcgm-exporter serves for its GPUs (percent)
    fb_mib: int  # framebuffer memory in use
    expect: str

    @property
    def key(self) -> str:  # as the decision log names it
        return f"{self.kind}/{self.namespace}/{self.name}"


FLEET = (
    Workload(
        "notebook", RESEARCH, "StatefulSet", "notebook; its kernel finished an hour ago",
        sh("python3 -c 'print(\"kernel done\")' && sleep infinity", gpus=4), 0.0, 0, "FINISHED_IDLE",
    ),
    Workload(
        "trainer-crashed", RESEARCH, "Deployment", "trainer that crashed and left a zombie",
        sh("(python3 -c 'import os; os.kill(os.getpid(), 9)' & exec sleep infinity)", gpus=8),
        0.0, 0, "ZOMBIE_CRASHED",
    ),
    Workload(
        "train-llama", RESEARCH, "Deployment", "live training job",
        Box(["python3", "-c", SLEEP_LONG], gpus=8), 87.0, 61000, "ACTIVE",
    ),
    Workload(
        "vllm", INFERENCE, "Deployment", "vLLM-like server, idle at night",
        Box(["/usr/bin/dumb-init", "--", "/bin/sh", "-c", f'python3 -c "{SLEEP_LONG}"'], gpus=2),
        0.0, 1800, "ACTIVE",
    ),
    Workload(
        "eval-hourly", INFERENCE, "Deployment", "hourly periodic job, between runs",
        sh("while true; do python3 -c 'print(1)'; sleep 3600; done", gpus=1), 0.0, 0, "ACTIVE",
    ),
)  # fmt: skip
BY_KEY = {w.key: w for w in FLEET}
RESTORED = next(w for w in FLEET if w.name == "notebook")


def controller_config(dest: Path, prometheus_url: str, mode: str) -> Path:
    """examples/ghostgpu.yaml with a demo's pace: a poll every 2 s, verdicts after 3 samples, and a
    long window (IDLE_HELD) no demo run reaches."""
    cfg = yaml.safe_load((REPO_ROOT / "examples" / "ghostgpu.yaml").read_text())
    # The devcluster's Prometheus scrapes every second: a reading is the busiest sample of 2 s.
    cfg["controller"]["metrics"]["scrapeInterval"] = "1s"
    cfg["controller"].update(
        mode=mode,
        # The processes come from exec'd `ps` here: the demo runs no node agent (whose DaemonSet the
        # example's agent mode renders), and without one every idle workload would stay UNKNOWN.
        processSource="exec",
        leaseName=f"ghostgpu-demo-{uuid.uuid4().hex[:6]}",
        pollInterval="2s",
        window=3,
        longWindow=300,
        startupGrace="1s",
        staleAfter="30s",
        prometheus={"url": prometheus_url, "timeout": "5s"},
        # The default tau (0.275) escalates some stops to a person; the demo shows them done.
        autonomy={"tau": 0.4},
    )
    path = dest / f"ghostgpu-{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class ControllerProcess:
    """One `ghostgpu controller` process, its log and decision log in the state directory."""

    def __init__(self, cluster: DevCluster, mode: str) -> None:
        dest = cluster.state_dir / "demo"
        dest.mkdir(exist_ok=True)
        self.mode = mode
        self.log_path = dest / f"controller-{mode}.log"
        self.decisions = dest / f"decisions-{mode}.jsonl"
        config = controller_config(dest, cluster.state.prometheus_url, mode)
        cmd = [
            sys.executable, "-m", "ghostgpu.cli", "controller",
            "--config", str(config), "--kubeconfig", str(cluster.kubeconfig),
            "--host", "127.0.0.1", "--port", "0", "--identity", f"demo-{mode}",
            "--lease-namespace", LEASE_NS, "--lease-duration", "6", "--renew-deadline", "4",
            "--retry-period", "1", "--decision-log", str(self.decisions),
        ]  # fmt: skip
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)

    def polls(self) -> int:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text()[-1500:]
            raise DemoError(f"the {self.mode} controller exited {self.proc.returncode}:\n{tail}")
        return sum(1 for ln in self.log_path.read_text().splitlines() if '"msg":"poll"' in ln)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def latest_decisions(path: Path) -> dict[str, dict[str, Any]]:
    """Each workload's last decision line (verdict, reasons, action) in a decision log."""
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if "verdict" in d and "workload" in d:
            out[d["workload"]] = d
    return out


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.5)
    raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")


class Demo:
    def __init__(self, cluster: DevCluster, console: Console) -> None:
        self.cluster = cluster
        self.console = console
        api = cluster.kube.api_client
        self.core, self.apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self.batch, self.co = client.BatchV1Api(api), client.CustomObjectsApi(api)
        self.pods: dict[str, str] = {}
        self.controllers: list[ControllerProcess] = []
        self.verdicts: dict[str, str] = {}  # workload key -> last verdict the controller gave it
        self.restore_output = ""

    # ----- the fleet -----
    def create_fleet(self) -> None:
        kube = self.cluster.kube
        images = self.cluster.state.node_images
        assert images is not None  # the real node runs
        by_kind = {"workload": images.workload, "distroless": images.distroless}
        for ns in (RESEARCH, INFERENCE, LEASE_NS):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for w in FLEET:
            shape = RealShape(w.name, {"main": w.box})
            kube.apply(deployment(shape, w.namespace, by_kind, kind=w.kind, name=w.name))
        for w in FLEET:
            self.pods[w.key] = wait_for(
                lambda w=w: self.running_pod(w), 120, f"{w.namespace}/{w.name} running"
            )
        for w in FLEET:
            self.cluster.dcgm.set(
                w.namespace,
                self.pods[w.key],
                util=w.util,
                fb_used_mib=w.fb_mib,
                container="main",
                node="localhost",
            )
        # Opted in once its workloads run: they bypassed Kueue, as ghosts do.
        for ns in (RESEARCH, INFERENCE):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": OPT_IN}})

    def running_pod(self, w: Workload) -> str | None:
        return the_running_pod(self.core, w.namespace, w.name)

    def replicas(self, w: Workload) -> int:
        read = (
            self.apps.read_namespaced_stateful_set
            if w.kind == "StatefulSet"
            else self.apps.read_namespaced_deployment
        )
        return int(read(w.name, w.namespace).spec.replicas)

    # ----- the Kueue Job waiting behind the ghosts -----
    def kueue_objects(self) -> list[dict[str, Any]]:
        """A topology-aware flavor for the real node: Kueue counts what pods outside Kueue hold on it."""
        tolerations = [GPU_TOLERATION, {"key": REAL_NODE_TAINT.key, "operator": "Exists"}]
        quota = [{"name": "nvidia.com/gpu", "nominalQuota": REAL_NODE_GPUS}]
        return [
            {"kind": "Topology", "metadata": {"name": "demo-hosts"},
             "spec": {"levels": [{"nodeLabel": HOSTNAME}]}},
            {"kind": "ResourceFlavor", "metadata": {"name": "demo-real-node"},
             "spec": {"nodeLabels": {REAL_NODE_LABEL: "true"}, "topologyName": "demo-hosts",
                      "tolerations": tolerations}},
            {"kind": "ClusterQueue", "metadata": {"name": "demo-research"},
             "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": RESEARCH}},
                      "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                          "flavors": [{"name": "demo-real-node", "resources": quota}]}]}},
            # Not named "default": Kueue would default every new workload in the namespace into it.
            {"kind": "LocalQueue", "metadata": {"name": "jobs", "namespace": RESEARCH},
             "spec": {"clusterQueue": "demo-research"}},
        ]  # fmt: skip

    def submit_job(self) -> None:
        kube = self.cluster.kube
        for obj in self.kueue_objects():
            kube.apply({"apiVersion": "/".join(KUEUE_API), **obj})
        images = self.cluster.state.node_images
        assert images is not None
        box = sh(f"python3 -c 'print(\"fine-tuning on {JOB_GPUS} GPUs\")'; sleep 5", gpus=JOB_GPUS)
        spec = {**real_node_pod_spec({"train": box}, {"workload": images.workload}), "restartPolicy": "Never"}
        kube.apply(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": JOB_NAME, "namespace": RESEARCH, "labels": {QUEUE_LABEL: "jobs"}},
                "spec": {
                    "suspend": True,
                    "template": {
                        "metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": HOSTNAME}},
                        "spec": spec,
                    },
                },
            }
        )

    def job_state(self) -> str:
        """waiting (Kueue found it does not fit), admitted, or queued (not looked at yet)."""
        wls = self.co.list_namespaced_custom_object(*KUEUE_API, RESEARCH, "workloads")["items"]
        conds = [c for w in wls for c in (w.get("status") or {}).get("conditions") or []]
        if any(c["type"] == "Admitted" and c["status"] == "True" for c in conds):
            return "admitted"
        if any(c["type"] == "QuotaReserved" and c["status"] == "False" for c in conds):
            return "waiting"
        return "queued"

    def job_message(self) -> str:
        wls = self.co.list_namespaced_custom_object(*KUEUE_API, RESEARCH, "workloads")["items"]
        for w in wls:
            for c in (w.get("status") or {}).get("conditions") or []:
                if c["type"] == "QuotaReserved":
                    return str(c.get("message", ""))
        return ""

    # ----- what a person looks at -----
    def verdict_table(self, title: str, decisions: dict[str, dict[str, Any]]) -> Table:
        table = Table(title=title, title_justify="left")
        for col in ("workload", "what it is", "GPUs", "util (double)", "verdict", "reasons"):
            table.add_column(col, no_wrap=col not in ("reasons", "what it is"))
        for w in FLEET:
            d = decisions.get(w.key)
            verdict = d["verdict"] if d else "-"
            reasons = "; ".join(d.get("reasons") or []) if d else "not judged yet"
            style = "red" if verdict in RECLAIMABLE else "green" if verdict == "ACTIVE" else "yellow"
            table.add_row(
                f"{w.namespace}/{w.name}", w.story, str(w.box.gpus), f"{w.util:g}%",
                f"[{style}]{verdict}[/]", reasons,
            )  # fmt: skip
        return table

    def run_cli(self, *args: str) -> str:
        """A `ghostgpu` command as a person would type it; its output shown and returned."""
        env = {**os.environ, "COLUMNS": str(self.console.width)}
        self.console.print(f"[bold]$ ghostgpu {' '.join(args)}[/]")
        r = subprocess.run(
            [sys.executable, "-m", "ghostgpu.cli", *args],
            capture_output=True, text=True, cwd=REPO_ROOT, env=env, check=False,
        )  # fmt: skip
        self.console.out(r.stdout.rstrip(), highlight=False)
        if r.returncode != 0:
            raise DemoError(f"`ghostgpu {' '.join(args)}` exited {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def shadow(self, polls: int) -> None:
        ctl = ControllerProcess(self.cluster, "shadow")
        self.controllers.append(ctl)
        self.console.rule("[bold]shadow mode: the controller judges, touches nothing")
        seen, deadline = 0, time.monotonic() + 60 + 4 * polls
        while True:
            n = ctl.polls()
            if n > seen:
                seen = n
                decisions = latest_decisions(ctl.decisions)
                self.console.print(self.verdict_table(f"poll {n} (shadow)", decisions))
                settled = all(
                    decisions.get(w.key, {}).get("verdict") in (RECLAIMABLE | {"ACTIVE"}) for w in FLEET
                )
                if n >= polls and (settled or time.monotonic() > deadline):
                    break
            time.sleep(0.3)
        self.verdicts.update({k: d["verdict"] for k, d in latest_decisions(ctl.decisions).items()})
        kube = str(self.cluster.kubeconfig)
        self.console.print(
            f"Kueue Job {RESEARCH}/{JOB_NAME} ({JOB_GPUS} GPUs): {self.job_state()}: {self.job_message()}"
        )
        self.run_cli("status", "--kubeconfig", kube)
        self.run_cli("report", str(ctl.decisions))
        untouched = {w.name: self.replicas(w) for w in FLEET}
        self.console.print(f"replicas after shadow (nothing touched): {untouched}")
        ctl.stop()

    def enforce(self) -> None:
        ctl = ControllerProcess(self.cluster, "enforce")
        self.controllers.append(ctl)
        self.console.rule("[bold]enforce mode: the ghosts are stopped through their managers")
        ghosts = [w for w in FLEET if self.verdicts.get(w.key) in RECLAIMABLE]
        shown: tuple[Any, ...] = ()

        def progress() -> bool:
            ctl.polls()  # raises if the controller died
            state = (tuple(self.replicas(w) for w in ghosts), self.job_state())
            nonlocal shown
            if state != shown:
                shown = state
                stopped = ", ".join(
                    f"{w.kind.lower()}/{w.name}={r}" for w, r in zip(ghosts, state[0], strict=True)
                )
                self.console.print(f"replicas {stopped}; Kueue Job {JOB_NAME}: {state[1]}")
            return all(r == 0 for r in state[0]) and state[1] == "admitted"

        wait_for(progress, 180, "the ghosts stopped and the Kueue Job admitted")
        decisions = latest_decisions(ctl.decisions)
        self.verdicts.update({k: d["verdict"] for k, d in decisions.items()})
        ctl.stop()
        self.run_cli("status", "--kubeconfig", str(self.cluster.kubeconfig))

    def restore(self) -> None:
        w = RESTORED
        self.console.rule(f"[bold]restore: {w.namespace}/{w.name} comes back")
        self.restore_output = self.run_cli(
            "restore",
            f"{w.kind.lower()}/{w.name}",
            "-n",
            w.namespace,
            "--kubeconfig",
            str(self.cluster.kubeconfig),
        )
        wait_for(lambda: self.running_pod(w), 120, f"{w.namespace}/{w.name} running again")

    def final_table(self) -> Table:
        table = Table(title="demo result", title_justify="left")
        for col in ("workload", "kind", "verdict", "expected", "replicas", "outcome"):
            table.add_column(col, no_wrap=True)
        for w in FLEET:
            verdict = self.verdicts.get(w.key, "-")
            if w is RESTORED:
                outcome = "stopped, restored"
            elif verdict in RECLAIMABLE:
                outcome = "stopped"
            else:
                outcome = "kept running"
            table.add_row(
                f"{w.namespace}/{w.name}", w.kind, verdict, w.expect, str(self.replicas(w)), outcome
            )
        table.add_row(f"{RESEARCH}/{JOB_NAME}", "Job (Kueue)", "-", "-", "-", self.job_state())
        return table

    def stop_controllers(self) -> None:
        for ctl in self.controllers:
            ctl.stop()


def preflight() -> None:
    """The reasons the demo cannot start, said before anything starts."""
    from ghostgpu.devcluster.paths import Toolchain

    if os.geteuid() != 0:
        raise DemoError(
            "the demo runs a real kubelet, containerd and runc (mounts, cgroups, sysctls): not root",
            "run it as root",
        )
    try:
        missing = Toolchain.locate().missing()
    except FileNotFoundError as e:
        raise DemoError(str(e), TESTBIN_FIX) from e
    if missing:
        raise DemoError("devcluster binaries missing: " + ", ".join(missing), TESTBIN_FIX)
    if not (REPO_ROOT / "kueue" / "kustomization.yaml").is_file():
        raise DemoError(f"no rendered bundles in {REPO_ROOT}", f"run `ghostgpu render -o {REPO_ROOT}`")


def demo_state_dir() -> Path:
    return default_state_dir().parent / "demo"


def run(state_dir: Path | None, *, keep: bool, polls: int, console: Console) -> None:
    """The whole demo; raises DemoError with what to do when it cannot go on."""
    from ghostgpu.devcluster.bundles import apply_bundles

    preflight()
    state_dir = state_dir or demo_state_dir()
    if DevCluster.attach(state_dir) is not None:
        raise DemoError(
            f"a devcluster already runs in {state_dir}",
            f"stop it with `ghostgpu devcluster down --state-dir {state_dir}`, or pass another --state-dir",
        )
    t0 = time.monotonic()
    cluster: DevCluster | None = None
    demo: Demo | None = None
    try:
        with console.status("starting the devcluster ...") as status:

            def progress(msg: str) -> None:
                # "[devcluster   4.1s] kube-apiserver ready": the demo's own clock replaces the cluster's
                line = f"[{time.monotonic() - t0:4.0f}s] {CLUSTER_CLOCK.sub('', msg)}"
                status.update(f"starting the devcluster: {line}")
                if not console.is_terminal:
                    console.print(f"starting the devcluster: {line}", highlight=False)

            try:
                cluster = DevCluster.up(state_dir, log=progress)
            except (FileNotFoundError, RuntimeError, TimeoutError, ValueError) as e:
                down_quietly(state_dir)
                raise DemoError(f"the devcluster did not start: {e}") from e
            if cluster.state.real_node_error:
                err = cluster.state.real_node_error
                hint = (
                    "; build the node images: hack/build-image --node-images" if "build-image" in err else ""
                )
                raise DemoError(f"the real node did not start: {err}{hint}")
            status.update("applying the rendered bundles (kueue/ policies/ controller/) ...")
            errors = [e for errs in apply_bundles(cluster.kube).values() for e in errs]
            if errors:
                raise DemoError("the rendered bundles were refused:\n" + "\n".join(errors))
            demo = Demo(cluster, console)
            status.update("creating the fleet on the real node ...")
            demo.create_fleet()
            status.update("submitting a Kueue Job behind the ghosts ...")
            demo.submit_job()
            wait_for(lambda: demo.job_state() == "waiting", 60, "Kueue to find the Job does not fit")
        console.print(
            f"devcluster up in {time.monotonic() - t0:.0f}s; real node `localhost` "
            f"({REAL_NODE_GPUS} GPUs as an extended resource), fleet running in {RESEARCH} and {INFERENCE}"
        )
        console.print(
            "GPU utilization comes from the fake dcgm-exporter (the one double: no GPU here): "
            "0% for the ghosts and the idle server, 87% for the live trainer; the processes are real."
        )
        demo.shadow(polls)
        demo.enforce()
        demo.restore()
        console.rule("[bold]result")
        console.print(demo.final_table())
        console.print(f"done in {time.monotonic() - t0:.0f}s")
    finally:
        if demo is not None:
            demo.stop_controllers()
        if keep and cluster is not None:
            print_keep(console, cluster)
        elif cluster is not None or (state_dir / "state.json").exists():
            with console.status("cleaning up (processes, mounts, cgroups) ..."):
                down_quietly(state_dir)
            console.print(f"cleaned up: the devcluster in {state_dir} is stopped")


def down_quietly(state_dir: Path) -> None:
    from ghostgpu.devcluster.cluster import down

    down(state_dir)


def print_keep(console: Console, cluster: DevCluster) -> None:
    kc, sd = cluster.kubeconfig, cluster.state_dir
    console.print(
        "\n".join(
            [
                f"the devcluster keeps running (state {sd}). Explore it:",
                f"  export KUBECONFIG={kc}",
                f"  kubectl get deploy,statefulset,pods -n {RESEARCH} -o wide; kubectl get workloads -A",
                f"  ghostgpu status --kubeconfig {kc}",
                f"  ghostgpu report {sd / 'demo' / 'decisions-shadow.jsonl'}",
                f"  kubectl exec -n {INFERENCE} deploy/vllm -- ps -eo pid,stat,args   # the real processes",
                f"stop it: ghostgpu devcluster down --state-dir {sd}",
            ]
        ),
        highlight=False,
    )
