"""`ghostgpu devcluster demo --provider kind`: one ghost caught and restored on a kind cluster.

The cluster is `ghostgpu devcluster up --provider kind`'s (Kueue and Kyverno in the cluster from
images built here). The bundles are rendered for it as a user renders them (examples/ghostgpu.yaml
with the host's Prometheus, processes read by exec, a demo's pace, enforcing) and applied as Argo CD
syncs them; the controller runs from hack/build-image's image with its own ServiceAccount. The GPU
signals come from the host (`kind.HostSignals`: the fake dcgm-exporter, the one double, and
Prometheus on the kind network's gateway). Then the ghost: a finished notebook holding one H100,
its namespace opted in, then given its team (in that order: docs/kind.md, Kueue's LocalQueue race),
stopped by the controller, brought back by `ghostgpu restore`.

The e2e test (tests/e2e/test_kind.py) runs the same steps: `KindDemo.started` and
`KindDemo.catch_and_restore`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from ghostgpu.devcluster import kind
from ghostgpu.devcluster.demo import DemoError, controller_config
from ghostgpu.devcluster.paths import REPO_ROOT, TESTBIN_FIX

# The ghost: a notebook whose kernel finished, holding one H100 (the example's flavor) and nothing
# running on it but `sh` waiting on `sleep infinity`.
GHOST_NS, GHOST = "team-kind", "notebook"
H100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # examples/ghostgpu.yaml's h100
NODE_GPUS = 8
TRACKED_PATH = "{.metadata.labels.ghostgpu\\.io/tracked}"
OPT_IN, TEAM = "ghostgpu.io/reclaim=enabled", "ghostgpu.io/team=research"
LEDGER = "ghostgpu-replica-ledger"
LEDGER_KEY = f"{GHOST_NS}.deployment.{GHOST}"
CONTROLLER_NS = "ghostgpu-system"
KIND_CLOCK = re.compile(r"^\[kind[^]]*\]\s*")  # "[kind  12.3s] applied Kueue (...)"

KIND_FIX = "hack/testbin kind kind-node kyverno-init, then see docs/kind.md for what the host needs"
KIND_DEMO_FIX = (
    "the lines above say what failed; `ghostgpu devcluster demo --provider kind --keep` leaves the "
    "kind cluster up to look at (docs/kind.md)"
)


def ghost_deployment(image: str) -> dict[str, Any]:
    """The finished notebook: one GPU, the real processes of a kernel that is done."""
    box = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "python3 -c 'print(\"kernel done\")' && sleep infinity"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    spec = {
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [box],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": GHOST, "namespace": GHOST_NS, "labels": {"app": GHOST}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": GHOST}},
            "template": {"metadata": {"labels": {"app": GHOST}}, "spec": spec},
        },
    }


def running_pod(pods: list[dict[str, Any]]) -> str | None:
    """The one pod Running with every container ready and not being deleted, else None."""
    running = [
        p["metadata"]["name"]
        for p in pods
        if p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and all(c.get("ready") for c in p["status"].get("containerStatuses") or [])
    ]
    return running[0] if len(running) == 1 else None


def reclaimed(logs: str) -> list[tuple[str, str]]:
    """(workload, verdict) of each `reclaimed` line of the controller's JSON log."""
    out = []
    for line in logs.splitlines():
        if '"msg":"reclaimed"' not in line:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        out.append((str(d.get("workload")), str(d.get("verdict"))))
    return out


def ledger_replicas(data: dict[str, str] | None, key: str = LEDGER_KEY) -> int | None:
    """The replica count the controller's ledger keeps for `key` (its ConfigMap's data), or None."""
    entry = (data or {}).get(key)
    return None if entry is None else int(json.loads(entry)["replicas"])


@dataclass
class GhostRun:
    """What the ghost's run showed: seconds since it started at each step, the controller's
    `reclaimed` lines, the ledger before and after the restore, `ghostgpu restore`'s output."""

    marks: dict[str, float] = field(default_factory=dict)
    reclaimed: list[tuple[str, str]] = field(default_factory=list)
    ledger_stopped: int | None = None
    ledger_restored: int | None = None
    restore_output: str = ""
    replicas: int = 0


def wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """cond()'s first truthy value; a kubectl that fails meanwhile (the object not made yet) is
    tried again, and its last error is said on a timeout."""
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            value = cond()
        except kind.KindError as e:
            value, last = None, str(e).splitlines()[-1]
        if value:
            return value
        time.sleep(0.5)
    said = f" (last: {last})" if last else ""
    raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}{said}", KIND_DEMO_FIX)


class KindDemo:
    """A kind cluster with the rendered bundles and the host's GPU signals, and the ghost's steps."""

    def __init__(self, cluster: kind.KindCluster, signals: kind.HostSignals, console: Console) -> None:
        self.cluster, self.signals, self.console = cluster, signals, console

    @classmethod
    @contextmanager
    def started(
        cls,
        state_dir: Path,
        console: Console,
        *,
        name: str = kind.CLUSTER,
        keep: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> Iterator[KindDemo]:
        """The cluster up, the signals on the host, the bundles rendered and applied; afterwards
        (also on a failure or Ctrl-C) the signals stopped and, unless `keep`, the cluster deleted."""
        say = progress or (lambda m: console.print(m, markup=False, highlight=False))
        cluster: kind.KindCluster | None = None
        signals: kind.HostSignals | None = None
        try:
            cluster = kind.up(state_dir, name=name, log=say)
            try:
                signals = kind.HostSignals(state_dir, kind.network_gateway(cluster.engine))
            except FileNotFoundError as e:  # no Prometheus built
                raise DemoError(str(e), TESTBIN_FIX) from e
            say(f"GPU signals on the host: Prometheus at {signals.url}, the fake dcgm-exporter behind it")
            root = render_bundles(state_dir, signals.url, say)
            kind.apply_rendered(cluster, root)
            yield cls(cluster, signals, console)
        finally:
            if signals is not None:
                signals.stop()
            # kind.up deletes what it made when it fails; a cluster it refused (one of that name
            # already there) is not this run's
            if cluster is not None and not keep:
                kind.down(state_dir, name)
                console.print(
                    f"cleaned up: the kind cluster {name!r}, the host's Prometheus and fake "
                    f"dcgm-exporter ({state_dir})",
                    highlight=False,
                )

    # ----- plumbing -----
    def kubectl(self, *args: str) -> str:
        return self.cluster.kubectl(*args)

    def jsonpath(self, *target: str, path: str) -> str:
        return self.kubectl(*target, "-o", f"jsonpath={path}")

    def typed(self, *args: str) -> str:
        """A kubectl command as a person would type it, shown."""
        self.console.print(f"[bold]$ kubectl {' '.join(args)}[/]")
        return self.kubectl(*args)

    def ghost_pod(self) -> str | None:
        out = self.kubectl("-n", GHOST_NS, "get", "pods", "-l", f"app={GHOST}", "-o", "json")
        return running_pod(json.loads(out)["items"])

    def ledger(self) -> dict[str, str]:
        return json.loads(
            self.jsonpath("-n", CONTROLLER_NS, "get", "configmap", LEDGER, path="{.data}") or "{}"
        )

    # ----- the ghost -----
    def catch_and_restore(self) -> GhostRun:
        """The node as an H100 node, the ghost, the opt-in, the team, the controller's stop,
        `ghostgpu restore`; what each step showed."""
        from ghostgpu.devcluster.fake_dcgm import FakeDcgmClient

        c, run, t0 = self.console, GhostRun(), time.monotonic()

        def tell(msg: str) -> None:  # names from the cluster: no rich markup
            c.print(msg, markup=False, highlight=False)

        def mark(what: str) -> str:
            run.marks[what] = round(time.monotonic() - t0, 1)
            return f"[{run.marks[what]:4.1f}s]"

        c.rule("[bold]a ghost: a notebook whose kernel finished, holding one H100")
        images = kind.node_images()
        self.cluster.load(Path(images["WORKLOAD_TAR"]))
        node = self.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}")
        # The node as an H100 node of 8 GPUs: the flavor's label, the extended resource as the
        # device plugin would advertise it (no GPU here: the fake dcgm-exporter is the one double).
        self.kubectl("label", "node", node, *(f"{k}={v}" for k, v in H100_LABELS.items()), "--overwrite")
        self.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"capacity": {"nvidia.com/gpu": str(NODE_GPUS)}}}),
        )  # fmt: skip
        wait(
            lambda: (
                self.jsonpath("get", "node", node, path="{.status.allocatable.nvidia\\.com/gpu}")
                == str(NODE_GPUS)
            ),
            60,
            f"the node's {NODE_GPUS} GPUs allocatable",
        )
        tell(
            f"node {node}: labelled as the example's h100 flavor, {NODE_GPUS} nvidia.com/gpu "
            "allocatable (as a device plugin would advertise them)"
        )
        self.typed("create", "namespace", GHOST_NS)
        self.console.print(
            "[bold]$ kubectl apply -f notebook.yaml[/]  # a Deployment asking for 1 GPU, no queue"
        )
        self.cluster.kubectl(
            "apply", "-f", "-", stdin=yaml.safe_dump(ghost_deployment(images["WORKLOAD_IMAGE"]))
        )
        pod = wait(self.ghost_pod, 120, "the ghost's pod running")
        FakeDcgmClient(self.signals.dcgm_url).set(GHOST_NS, pod, util=0.0, fb_used_mib=0, node=node)
        tell(
            f"{mark('ghost running')} {GHOST_NS}/{GHOST} running (pod {pod}, 1 GPU): `sh` waiting on "
            "`sleep infinity`; the fake dcgm-exporter serves 0% for it. Its namespace has no label "
            "yet: nothing tracks it"
        )

        c.rule("[bold]opt-in, then the team (in that order: docs/kind.md)")
        # Opted in after its workload was created: Kyverno's mutate-existing (background controller,
        # the release's RBAC plus policies/kyverno-rbac.yaml) labels the Deployment tracked.
        self.typed("label", "namespace", GHOST_NS, OPT_IN)
        wait(
            lambda: self.jsonpath("-n", GHOST_NS, "get", "deployment", GHOST, path=TRACKED_PATH) == "true",
            120,
            "Kyverno labelling the pre-existing Deployment tracked",
        )
        tell(
            f"{mark('tracked')} Kyverno labelled deployment/{GHOST} ghostgpu.io/tracked=true "
            "(mutate-existing: it predates the opt-in)"
        )
        # Its team: Kyverno generates the controller's RoleBinding (and the LocalQueue `default`).
        # With both labels at once Kueue may refuse Kyverno's label (docs/kind.md).
        self.typed("label", "namespace", GHOST_NS, TEAM)
        wait(
            lambda: (
                self.jsonpath(
                    "-n", GHOST_NS, "get", "rolebinding", "ghostgpu-controller", path="{.roleRef.name}"
                )
                == "ghostgpu-controller-namespaced"
            ),
            60,
            "the controller's RoleBinding generated",
        )
        tell(
            f"{mark('rolebinding')} Kyverno generated the controller's RoleBinding, the LocalQueue "
            "`default` and the team's ResourceQuota"
        )

        c.rule("[bold]enforce: the controller stops the ghost through its Deployment")
        # The controller (its ServiceAccount, enforce) execs `ps`, sees 0 % and finished processes,
        # and stops it through its owner. Kueue's webhook refuses metadata writes to the running
        # Deployment now that the namespace has a LocalQueue `default`, so the replica count is kept
        # in the controller's ledger (docs/controller.md) and the stop goes through `scale`.
        wait(
            lambda: self.jsonpath("-n", GHOST_NS, "get", "deployment", GHOST, path="{.spec.replicas}") == "0",
            180,
            "the controller stopping the ghost (replicas 0)",
        )
        logs = self.kubectl(
            "-n", CONTROLLER_NS, "logs", "-l", "app.kubernetes.io/name=ghostgpu-controller", "--tail=-1"
        )
        run.reclaimed = reclaimed(logs)
        run.ledger_stopped = ledger_replicas(self.ledger())
        said = ", ".join(f"{w} {v}" for w, v in run.reclaimed) or "no `reclaimed` line"
        tell(
            f"{mark('stopped')} deployment/{GHOST}: replicas 0. The controller's log: reclaimed {said}; "
            f"the replica count ({run.ledger_stopped}) kept in {CONTROLLER_NS}/{LEDGER}"
        )

        c.rule(f"[bold]restore: {GHOST_NS}/{GHOST} comes back")
        run.restore_output = self.run_cli("restore", f"deployment/{GHOST}", "-n", GHOST_NS)
        pod = wait(self.ghost_pod, 120, "the restored pod running")
        run.ledger_restored = ledger_replicas(self.ledger())
        run.replicas = int(self.jsonpath("-n", GHOST_NS, "get", "deployment", GHOST, path="{.spec.replicas}"))
        tell(
            f"{mark('restored')} {GHOST_NS}/{GHOST} running again (pod {pod}): Kueue's now, admitted "
            "through the LocalQueue `default` on the h100 flavor"
        )
        return run

    def run_cli(self, *args: str) -> str:
        """A `ghostgpu` command as a person would type it against this cluster; shown and returned."""
        return run_cli(self.console, *args, "--kubeconfig", str(self.cluster.kubeconfig))


def run_cli(console: Console, *args: str) -> str:
    env = {**os.environ, "COLUMNS": str(console.width)}
    console.print(f"[bold]$ ghostgpu {' '.join(args)}[/]")
    r = subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", *args],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, check=False,
    )  # fmt: skip
    console.out(r.stdout.rstrip(), highlight=False)
    if r.returncode != 0:
        raise DemoError(
            f"`ghostgpu {' '.join(args)}` exited {r.returncode}: {r.stderr.strip()}", KIND_DEMO_FIX
        )
    return r.stdout


def render_bundles(state_dir: Path, prometheus_url: str, say: Callable[[str], None]) -> Path:
    """The bundles as a user renders them for this cluster: examples/ghostgpu.yaml with the
    Prometheus it has, processes read by exec (no node agent: its series would need Prometheus to
    scrape pods inside the node), a demo's pace, enforcing. Their root (examples/ghostgpu.yaml
    beside kueue/ policies/ controller/, as `apply_rendered` reads them)."""
    cfg = controller_config(state_dir, prometheus_url, "enforce")
    root = state_dir / "rendered"
    (root / "examples").mkdir(parents=True, exist_ok=True)
    (root / "examples" / "ghostgpu.yaml").write_text(cfg.read_text())
    say(f"ghostgpu render -c {cfg} -o {root}")
    r = subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", "render", "-c", str(cfg), "-o", str(root)],
        capture_output=True, text=True, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    if r.returncode != 0:
        raise DemoError(f"ghostgpu render failed:\n{r.stderr.strip()[-2000:]}", KIND_DEMO_FIX)
    return root


def result_table(run: GhostRun) -> Table:
    table = Table(title="demo result", title_justify="left")
    for col in ("workload", "kind", "verdict", "expected", "replicas", "outcome"):
        table.add_column(col, no_wrap=True)
    verdict = next((v for w, v in run.reclaimed if w == f"Deployment/{GHOST_NS}/{GHOST}"), "-")
    outcome = "stopped, restored" if verdict != "-" and run.replicas == 1 else "not stopped"
    table.add_row(f"{GHOST_NS}/{GHOST}", "Deployment", verdict, "FINISHED_IDLE", str(run.replicas), outcome)
    return table


def demo_state_dir() -> Path:
    return kind.default_state_dir()


def preflight() -> None:
    """The reasons the demo cannot start (not root, kind or the node binaries not built, no
    container engine), said before anything starts."""
    try:
        kind.preflight()
    except kind.KindError as e:
        raise DemoError(str(e), KIND_FIX) from e


def run(state_dir: Path | None, *, keep: bool, console: Console) -> None:
    """The whole kind demo; raises DemoError (error:/fix:, exit 2) when it cannot go on."""
    preflight()
    state_dir = state_dir or demo_state_dir()
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        # "[kind  12.3s] applied Kueue (...)": the demo's own clock replaces the cluster's
        line = f"[{time.monotonic() - t0:4.0f}s] {KIND_CLOCK.sub('', msg)}"
        console.print(f"starting the kind cluster: {line}", markup=False, highlight=False)

    console.rule("[bold]a kind cluster: Kueue, Kyverno and the controller in it, from images built here")
    try:
        with KindDemo.started(state_dir, console, keep=keep, progress=progress) as demo:
            console.print(
                f"kind cluster {demo.cluster.name!r} ({demo.cluster.engine}) up with the rendered "
                f"bundles in {time.monotonic() - t0:.0f}s; the controller runs in {CONTROLLER_NS} "
                "(enforce, a poll every 2 s)"
            )
            console.print(
                "GPU utilization comes from the fake dcgm-exporter on the host (the one double: no GPU "
                "here); the processes are real, in the kind node's containers."
            )
            result = demo.catch_and_restore()
            console.rule("[bold]result")
            console.print(result_table(result))
            console.print(f"done in {time.monotonic() - t0:.0f}s")
            if keep:
                print_keep(console, demo.cluster, state_dir)
    except kind.KindError as e:
        raise DemoError(str(e), KIND_DEMO_FIX) from e


def print_keep(console: Console, cluster: kind.KindCluster, state_dir: Path) -> None:
    kc = cluster.kubeconfig
    console.print(
        "\n".join(
            [
                f"the kind cluster {cluster.name!r} keeps running; the host's Prometheus and fake "
                "dcgm-exporter are stopped (the controller's reads fail from now on). Explore it:",
                f"  export KUBECONFIG={kc}",
                f"  kubectl get deploy,pods -n {GHOST_NS}; kubectl get workloads -A",
                f"  kubectl -n {CONTROLLER_NS} logs deploy/ghostgpu-controller",
                f"stop it: ghostgpu devcluster down --provider kind --state-dir {state_dir}",
            ]
        ),
        highlight=False,
    )
