"""End to end: the controller as a real process against the devcluster (real apiserver, scheduler,
kwok nodes, exec through the apiserver into scripted process tables, the fake dcgm-exporter scraped
by a real Prometheus, Kueue).

Scenario: 3 ACTIVE (one in a batch gap: zero utilization, live processes),
2 FINISHED_IDLE, 1 ZOMBIE_CRASHED with a defunct child, 1 exempt, 1 IDLE_HELD, 1 whose Prometheus
series is missing. Shadow touches nothing and records verdicts + Events; enforce scales exactly the
FINISHED_IDLE and ZOMBIE_CRASHED ones to 0; `ghostgpu restore` brings them back. A second test
kills the leader mid-window and checks the other replica takes over and acts at most once.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import yaml
from cli_runs import restore
from kubernetes import client
from proctables import FINISHED, GAP, LIVE, NOTEBOOK, PERIODIC, ZOMBIE, rows

from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessTables
from ghostgpu.devcluster.kwok_exec import ProcessRow

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
POLL = 2  # seconds
WINDOW, LONG_WINDOW = 3, 7
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
LEASE_NS = "ghostgpu-system"
HOSTNAME = "kubernetes.io/hostname"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


# --- helpers -------------------------------------------------------------------------------------


def controller_config(
    tmp: Path, prometheus_url: str, mode: str, process_source: str = "exec", **extra: object
) -> Path:
    """examples/ghostgpu.yaml at the tests' pace. Processes come from exec by default: these tests
    script what `ps` prints in each pod (process_tables); agent mode reads the agent's series."""
    cfg = yaml.safe_load((REPO / "examples" / "ghostgpu.yaml").read_text())
    # The devcluster's Prometheus scrapes every second: a reading is the busiest sample of 2 s.
    cfg["controller"]["metrics"]["scrapeInterval"] = "1s"
    cfg["controller"].update(
        mode=mode,
        processSource=process_source,
        leaseName=f"ghostgpu-{uuid.uuid4().hex[:8]}",  # one lease per test: no stray holder carries over
        pollInterval=f"{POLL}s",
        window=WINDOW,
        longWindow=LONG_WINDOW,
        startupGrace="1s",
        staleAfter="30s",
        prometheus={"url": prometheus_url, "timeout": "5s"},
        # The default tau (0.275) escalates evicting all but the smallest bare pods (base risk 0.5: a
        # bare pod is not recreated); 0.4 lets this test exercise the Eviction API and the
        # PodDisruptionBudget path for every one of them.
        autonomy={"tau": 0.4},
        **extra,
    )
    path = tmp / f"ghostgpu-{mode}-{process_source}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Controller:
    """One `ghostgpu controller` process."""

    def __init__(self, kubeconfig: Path, config: Path, tmp: Path, name: str, *extra: str) -> None:
        self._port: int | None = None  # --port 0: the process binds a free port and logs it
        self.log_path = tmp / f"{name}.log"
        self.decisions = tmp / f"{name}-decisions.jsonl"
        self.name = name
        cmd = [
            sys.executable, "-m", "ghostgpu.cli", "controller",
            "--config", str(config), "--kubeconfig", str(kubeconfig),
            "--host", "127.0.0.1", "--port", "0", "--identity", name,
            "--lease-namespace", LEASE_NS, "--lease-duration", "6", "--renew-deadline", "4",
            "--retry-period", "1", "--decision-log", str(self.decisions), *extra,
        ]  # fmt: skip
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)

    @property
    def port(self) -> int | None:
        """The port the process bound (from its "controller starting" line); None until then."""
        if self._port is None:
            for line in self.log_path.read_text().splitlines():
                if '"msg":"controller starting"' in line:
                    self._port = int(json.loads(line)["port"])
                    break
        return self._port

    def metrics(self) -> str:
        if self.port is None:
            return ""  # not listening yet
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            named = line.startswith((name + "{", name + " "))
            if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def polls(self) -> int:
        return sum(1 for line in self.log_path.read_text().splitlines() if '"msg":"poll"' in line)

    def wait_polls(self, n: int, timeout: float = 120) -> None:
        start = self.polls()

        def done() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            return self.polls() >= start + n

        wait_for(done, timeout, f"{self.name}: {n} more polls")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def deployment(
    name: str, ns: str, *, annotations: dict[str, str] | None = None, gpus: int = 1, kind: str = "Deployment"
) -> dict:
    labels = {"app": name, "ghostgpu.io/tracked": "true"}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": H100,
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:latest",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def opt_in(cluster: DevCluster, ns: str) -> None:
    """Opt the namespace in once its workloads run (ghosts are workloads that bypassed Kueue).

    No `ghostgpu.io/team` label: with the rendered bundles applied, a team label makes Kyverno
    generate a LocalQueue `default`, after which Kueue's webhook refuses every metadata write to a
    pre-existing Deployment (test_unwritable_deployment_... covers that case)."""
    labels = {"ghostgpu.io/reclaim": "enabled"}
    cluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})


# Reclaimable verdicts, and what enforce mode reclaims (the PDB keeps guarded-pod).
RECLAIMABLE = {"finished-a", "finished-b", "zombie", "finished-pod", "guarded-pod"}
RECLAIMED = RECLAIMABLE - {"guarded-pod"}


class Scenario:
    """The issue's fleet in one opted-in namespace."""

    # name -> (util or None for "no series", process table, expected verdict)
    STATEFUL: ClassVar[frozenset[str]] = frozenset({"zombie"})  # a StatefulSet
    BARE: ClassVar[frozenset[str]] = frozenset(
        {"finished-pod", "guarded-pod"}
    )  # bare Pods; the rest Deployments
    FLEET: ClassVar[dict[str, tuple[float | None, list[ProcessRow], str]]] = {
        "active-train": (87.0, LIVE, "ACTIVE"),
        "active-serve": (35.0, LIVE, "ACTIVE"),
        "active-gap": (60.0, GAP, "ACTIVE"),  # util drops to 0 later: a batch gap
        "finished-a": (0.0, FINISHED, "FINISHED_IDLE"),
        "finished-b": (0.0, rows(), "FINISHED_IDLE"),  # header only: nothing but the probe
        "zombie": (0.0, ZOMBIE, "ZOMBIE_CRASHED"),
        "exempt": (0.0, FINISHED, "EXEMPT"),
        "held-notebook": (0.0, NOTEBOOK, "IDLE_HELD"),
        "no-series": (None, FINISHED, "UNKNOWN"),
        "finished-pod": (0.0, FINISHED, "FINISHED_IDLE"),  # evicted in enforce mode
        "guarded-pod": (0.0, FINISHED, "FINISHED_IDLE"),  # a PodDisruptionBudget forbids its eviction
        # A periodic job between runs: its shell waits on `sleep 3600`, a timer, never a holder.
        "periodic-job": (0.0, PERIODIC, "IDLE_HELD"),
        # Finished by its process table, but 4000 MiB of GPU memory is held: a context the listing
        # cannot see (another container, a hidden pid namespace) is a contradiction.
        "memory-ghost": (0.0, FINISHED, "UNKNOWN"),
    }
    MEMORY_MIB: ClassVar[dict[str, float]] = {"memory-ghost": 4000.0}

    def __init__(self, cluster: DevCluster, ns: str, tables: ProcessTables, dcgm: FakeDcgmClient) -> None:
        self.cluster, self.ns, self.tables, self.dcgm = cluster, ns, tables, dcgm
        self.apps = client.AppsV1Api(cluster.kube.api_client)
        self.core = client.CoreV1Api(cluster.kube.api_client)
        self.pods: dict[str, str] = {}

    def create(self) -> None:
        for name in self.FLEET:
            ann = {"ghostgpu.io/reclaim-policy": "never"} if name == "exempt" else {}
            workload = deployment(name, self.ns, annotations=ann, kind=self.kind(name))
            if name in self.BARE:
                template = workload["spec"]["template"]
                meta = {**workload["metadata"], **template["metadata"]}
                workload = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
            self.cluster.kube.apply(workload)
        self.cluster.kube.apply(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "guarded", "namespace": self.ns},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded-pod"}}},
            }
        )
        for name in self.FLEET:
            self.pods[name] = wait_for(lambda n=name: self.running_pod(n), 90, f"pod of {name} running")
        opt_in(self.cluster, self.ns)
        for name, (util, table, _) in self.FLEET.items():
            self.tables.set(self.ns, self.pods[name], table)
            if util is not None:
                self.dcgm.set(self.ns, self.pods[name], util=util, fb_used_mib=self.MEMORY_MIB.get(name))

    def running_pod(self, name: str) -> str | None:
        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"app={name}").items
        running = [
            p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]
        return running[0] if len(running) == 1 else None

    def annotations(self, name: str) -> dict[str, str]:
        return self.read(name).metadata.annotations or {}

    def verdict(self, name: str) -> str | None:
        return self.annotations(name).get("ghostgpu.io/verdict")

    def replicas(self, name: str) -> int:
        if name in self.BARE:  # 1 while the pod exists and is not being deleted
            try:
                return 0 if self.read(name).metadata.deletion_timestamp else 1
            except client.ApiException as exc:
                if exc.status == 404:
                    return 0
                raise
        return int(self.read(name).spec.replicas)

    def read(self, name: str) -> Any:
        if name in self.BARE:
            return self.core.read_namespaced_pod(name, self.ns)
        if name in self.STATEFUL:
            return self.apps.read_namespaced_stateful_set(name, self.ns)
        return self.apps.read_namespaced_deployment(name, self.ns)

    def kind(self, name: str) -> str:
        return "Pod" if name in self.BARE else "StatefulSet" if name in self.STATEFUL else "Deployment"

    def verdict_events(self, name: str) -> list[str]:
        evs = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        evs.sort(key=lambda e: (e.first_timestamp or e.event_time or 0, e.metadata.creation_timestamp))
        # kind must be set, or `kubectl describe deployment` would not show the Event
        kind = self.kind(name)
        return [e.reason for e in evs if e.reason.startswith("Verdict") and e.involved_object.kind == kind]

    def events(self, name: str, reason: str) -> int:
        evs = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return sum(1 for e in evs if e.reason == reason)

    # Plainly busy: their first ACTIVE verdict is not written (planner.silent_first) until it says
    # more (active-gap's batch gap, below).
    PLAIN_BUSY: ClassVar[frozenset[str]] = frozenset({"active-train", "active-serve", "active-gap"})

    def expected_verdicts(self) -> dict[str, str]:
        return {n: v for n, (_, _, v) in self.FLEET.items() if v != "EXEMPT"}

    def expected_annotations(self, *, gap: bool = False) -> dict[str, str | None]:
        """The verdict annotations: none on a plainly busy workload (active-gap's once its gap shows)."""
        written = self.PLAIN_BUSY - {"active-gap"} if gap else self.PLAIN_BUSY
        return {n: None if n in written else v for n, v in self.expected_verdicts().items()}

    def all_as_expected(self) -> bool:
        return all(self.verdict(n) == v for n, v in self.expected_annotations().items())


@pytest.fixture
def scenario(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
) -> Iterator[Scenario]:
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns = make_namespace({}, prefix="ghosts")  # opted in once the fleet runs (Scenario.create)
    sc = Scenario(devcluster, ns, process_tables, dcgm)
    sc.create()
    yield sc
    for name in sc.pods.values():
        process_tables.clear(ns, name)


def _camel(kind: str) -> str:
    return "Verdict" + "".join(p.capitalize() for p in kind.split("_"))


# --- the tests -----------------------------------------------------------------------------------


def test_shadow_then_enforce_then_restore(
    scenario: Scenario, devcluster: DevCluster, prometheus_url: str, tmp_path: Path
) -> None:
    sc = scenario
    # Shadow: long enough for the held notebook's zero run to pass longWindow.
    shadow = Controller(
        devcluster.kubeconfig, controller_config(tmp_path, prometheus_url, "shadow"), tmp_path, "shadow"
    )
    try:
        shadow.wait_polls(LONG_WINDOW + 1, timeout=180)
        wait_for(sc.all_as_expected, 60, "shadow verdicts")
        # The batch gap starts now: zero utilization, live processes, shorter than longWindow.
        # Wait for its own evidence (a full window of zeros), not for a poll count: that reading
        # lasts from WINDOW to LONG_WINDOW - 1 zero samples, after which it is IDLE_HELD.
        sc.dcgm.set(sc.ns, sc.pods["active-gap"], util=0.0)

        def gap_seen() -> dict[str, Any] | None:
            ev = json.loads(sc.annotations("active-gap").get("ghostgpu.io/evidence", "{}"))
            return ev if "idle-below-hold" in ev.get("reasons", []) else None

        gap_evidence = wait_for(gap_seen, 60, "the batch gap in active-gap's evidence")
        got = {n: sc.verdict(n) for n in sc.FLEET}
        assert got["exempt"] is None, "an exempt workload is never touched, not even annotated"
        assert {n: got[n] for n in sc.expected_verdicts()} == sc.expected_annotations(gap=True)
        assert gap_evidence["util"] == [0.0] * WINDOW and gap_evidence["procs"]["live"] >= 2
        assert "idle-below-hold" in gap_evidence["reasons"]
        zombie_evidence = json.loads(sc.annotations("zombie")["ghostgpu.io/evidence"])
        assert zombie_evidence["procs"] == {"live": 0, "defunct": 1, "holders": 1}  # the idle shell
        ghost = json.loads(sc.annotations("memory-ghost")["ghostgpu.io/evidence"])
        assert "memory-without-process" in ghost["reasons"] and ghost["gpu_mem_mib"] == 4000
        assert "timer" in sc.annotations("periodic-job")["ghostgpu.io/evidence"]
        assert "utilization-failed" in sc.annotations("no-series")["ghostgpu.io/evidence"]
        # Nothing touched: every Deployment still has its replica.
        assert {n: sc.replicas(n) for n in sc.FLEET} == dict.fromkeys(sc.FLEET, 1)
        # Events only when the verdict changes: no two equal consecutive Verdict events.
        for name, verdict in sc.expected_annotations(gap=True).items():
            seq = sc.verdict_events(name)
            if verdict is None:  # plainly busy from the start: nothing written, no Event
                assert seq == [], (name, seq)
                continue
            assert seq and seq[-1] == _camel(verdict), (name, seq)
            assert all(a != b for a, b in itertools.pairwise(seq)), (name, seq)
        for name in RECLAIMABLE:
            assert sc.events(name, "WouldReclaim") == 1
        assert shadow.metric("ghostgpu_would_reclaims_total", namespace=sc.ns) == len(RECLAIMABLE)
        assert shadow.metric("ghostgpu_reclaims_total", namespace=sc.ns) == 0
        assert shadow.metric("ghostgpu_ghost_gpus", namespace=sc.ns, verdict="FINISHED_IDLE") == 4
        assert shadow.metric("ghostgpu_poll_duration_seconds_count") >= LONG_WINDOW
        assert httpx.get(f"http://127.0.0.1:{shadow.port}/healthz").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{shadow.port}/readyz").status_code == 200
    finally:
        shadow.stop()

    # The shadow history: what would have been reclaimed, and the missing series as a miss.
    report = subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", "report", str(shadow.decisions), "--json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    rep = json.loads(report.stdout)
    assert rep["gpuHoursWouldReclaim"] > 0
    assert {w.split("/")[-1] for w in rep["wouldReclaim"]} == RECLAIMABLE
    no_series = [m for m in rep["misses"] if m["workload"].endswith("/no-series")]
    assert no_series and no_series[-1]["outcome"] == "persisted"

    # Enforce: exactly the FINISHED_IDLE and ZOMBIE_CRASHED ones go to zero after K polls.
    sc.dcgm.set(sc.ns, sc.pods["active-gap"], util=55.0)  # the gap ends
    enforce = Controller(
        devcluster.kubeconfig, controller_config(tmp_path, prometheus_url, "enforce"), tmp_path, "enforce"
    )
    try:
        enforce.wait_polls(WINDOW)
        reclaimed = RECLAIMED
        wait_for(lambda: all(sc.replicas(n) == 0 for n in reclaimed), 60, "ghosts scaled to 0 / evicted")
        wait_for(lambda: sc.events("guarded-pod", "EvictionBlocked") >= 1, 30, "the PDB blocks an eviction")
        enforce.wait_polls(3)  # more polls: nothing else is touched, nothing is acted on twice
        assert {n: sc.replicas(n) for n in sc.FLEET} == {n: (0 if n in reclaimed else 1) for n in sc.FLEET}
        for name in reclaimed - sc.BARE:
            assert sc.annotations(name)["ghostgpu.io/reclaimed-from-replicas"] == "1"
        for name in reclaimed:
            assert sc.events(name, "Reclaimed") == 1
        assert sc.events("guarded-pod", "EvictionBlocked") == 1, "retried every poll, announced once"
        assert enforce.metric("ghostgpu_reclaims_total", namespace=sc.ns) == len(reclaimed)
    finally:
        enforce.stop()

    # Restore brings them back.
    for name in ("finished-a", "zombie"):
        out = restore(devcluster, f"{sc.kind(name).lower()}/{name}", sc.ns)
        assert out.returncode == 0, out.stderr
        assert "to 1 replicas" in out.stdout
        assert sc.replicas(name) == 1
        assert "ghostgpu.io/reclaimed-from-replicas" not in sc.annotations(name)
        wait_for(lambda n=name: sc.running_pod(n), 60, f"{name} running again")
    again = restore(devcluster, "deployment/finished-a", sc.ns)
    assert again.returncode == 1 and "not reclaimed" in again.stderr


def test_leader_killed_mid_window(
    scenario: Scenario, devcluster: DevCluster, prometheus_url: str, tmp_path: Path
) -> None:
    """Two replicas in enforce mode; the leader is SIGKILLed before the window completes."""
    sc = scenario
    # The ghosts look busy until replica-a is dead: otherwise replica-a can complete a window (and be
    # killed between a scale and its Event) before replica-b has even synced. At most one stale zero
    # is read before the busy value is scraped; a window needs WINDOW zeros in a row.
    for name in RECLAIMED:
        sc.dcgm.set(sc.ns, sc.pods[name], util=50.0)
    cfg = controller_config(tmp_path, prometheus_url, "enforce")
    a = Controller(devcluster.kubeconfig, cfg, tmp_path, "replica-a")
    b: Controller | None = None
    try:
        wait_for(lambda: a.metric("ghostgpu_leader") == 1, 30, "replica-a leads")
        b = Controller(devcluster.kubeconfig, cfg, tmp_path, "replica-b")
        b.wait_polls(1)
        assert b.metric("ghostgpu_leader") == 0
        # Only the leader writes the decision log; the follower answers /decisions with it.
        through_b = httpx.get(f"http://127.0.0.1:{b.port}/decisions", timeout=30)
        assert through_b.status_code == 200 and through_b.content, through_b.text
        assert a.decisions.read_bytes().startswith(through_b.content)
        assert not b.decisions.exists() or not b.decisions.read_bytes()
        a.stop(signal.SIGKILL)  # mid-window: no graceful lease release
        killed_at = time.monotonic()
        for name in RECLAIMED:  # the idle window starts now, and only replica-b can complete it
            sc.dcgm.set(sc.ns, sc.pods[name], util=0.0)
        assert not [n for n in RECLAIMED if sc.replicas(n) == 0], "replica-a acted before it was killed"
        wait_for(
            lambda: b.metric("ghostgpu_leader") == 1, 12, "replica-b takes over within 2 lease durations"
        )
        takeover = time.monotonic() - killed_at
        assert takeover < 12
        b.wait_polls(1)
        own = httpx.get(f"http://127.0.0.1:{b.port}/decisions", timeout=30)
        assert own.status_code == 200 and own.content and b.decisions.read_bytes().startswith(own.content)
        reclaimed = RECLAIMED
        wait_for(lambda: all(sc.replicas(n) == 0 for n in reclaimed), 60, "ghosts scaled to 0 by replica-b")
        b.wait_polls(3)
        assert {n: sc.replicas(n) for n in sc.FLEET} == {n: (0 if n in reclaimed else 1) for n in sc.FLEET}
        for name in reclaimed:
            assert sc.events(name, "Reclaimed") == 1, f"{name} acted on more than once"
        print(f"leader failover took {takeover:.1f}s")
    finally:
        if b is not None:
            b.stop()
        a.stop()


def test_real_prometheus_utilization(
    devcluster: DevCluster, dcgm: FakeDcgmClient, prometheus_url: str
) -> None:
    """The batched query against the real Prometheus: values, label mapping, missing series."""
    import asyncio

    from ghostgpu.config import MetricsConfig
    from ghostgpu.signals.prometheus import PrometheusClient
    from ghostgpu.signals.utilization import PodKey, QuerySpec, UtilizationSource

    dcgm.set("team-x", "train-0", util=42.0, gpu=0)
    dcgm.set("team-x", "train-0", util=7.0, gpu=1)
    dcgm.set("team-x", "idle-0", util=0.0, xid=79.0)
    keys = [PodKey("team-x", "train-0"), PodKey("team-x", "idle-0"), PodKey("team-x", "gone-0")]

    async def poll() -> dict:
        async with PrometheusClient(prometheus_url, timeout=5) as c:
            spec = QuerySpec.from_preset(MetricsConfig().dcgm, max_sample_age=30)
            return await UtilizationSource(c, spec).poll(keys, now=time.time())

    def scraped() -> dict | None:
        # The three set() calls are not atomic: a scrape can land between them, so wait for
        # one that holds both pods' series rather than for the first pod alone.
        r = asyncio.run(poll())
        return r if r[keys[0]].utilization == 42.0 and r[keys[1]].xids else None

    out = wait_for(scraped, 30, "scrape of both pods")
    assert out[keys[1]].utilization == 0.0 and [x.code for x in out[keys[1]].xids] == [79]
    assert getattr(out[keys[2]].utilization, "reason", None) == "missing"


def kueue_release(dc: DevCluster) -> tuple[int, ...]:
    assert dc.state.kueue_version, "the devcluster records the Kueue release it runs"
    return tuple(int(x) for x in dc.state.kueue_version.lstrip("v").split("-")[0].split("."))


@pytest.mark.kueue
@pytest.mark.parametrize("nudge", [True, False], ids=["nudge", "no-nudge"])
def test_pending_job_admitted_once_ghosts_are_gone(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
    nudge: bool,
) -> None:
    """Kueue's topology-aware scheduling counts pods outside Kueue against node capacity: a Job that
    needs a whole node does not fit while two ghosts hold it, and is admitted once they are gone.
    Kueue < v0.19.1 retries it only on a node change (the nudge); v0.19.1+ also when a pod outside
    Kueue frees capacity (batched every 10 s), so there it is admitted without the nudge too."""
    if not nudge and kueue_release(devcluster) < (0, 19, 1):
        pytest.skip(f"Kueue {devcluster.state.kueue_version} does not retry TAS workloads on pod deletions")
    kube = devcluster.kube
    co = client.CustomObjectsApi(kube.api_client)
    batch = client.BatchV1Api(kube.api_client)
    core = client.CoreV1Api(kube.api_client)
    uid = uuid.uuid4().hex[:6]
    topo, flavor, cq = f"hosts-{uid}", f"tas-h100-{uid}", f"cq-{uid}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns = make_namespace({}, prefix="queue")  # opted in once the ghosts run
    gpu_toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    kueue_objs = [
        {"kind": "Topology", "metadata": {"name": topo}, "spec": {"levels": [{"nodeLabel": HOSTNAME}]}},
        {"kind": "ResourceFlavor", "metadata": {"name": flavor},
         # The kwok H100 nodes only: the real node carries the H100 labels too, behind its own taint.
         "spec": {"nodeLabels": {**H100, "type": "kwok"}, "topologyName": topo,
                  "tolerations": gpu_toleration}},
        {"kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                      "flavors": [{"name": flavor, "resources": [{"name": "nvidia.com/gpu",
                                                                                  "nominalQuota": 16}]}]}]}},
        # Not named "default": Kueue would default every new workload in the namespace into it.
        {"kind": "LocalQueue", "metadata": {"name": "jobs", "namespace": ns}, "spec": {"clusterQueue": cq}},
    ]  # fmt: skip
    for obj in kueue_objs:
        kube.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", **obj})
    controller: Controller | None = None
    try:
        # Two 4-GPU ghosts fill gpu-h100-0; a live 1-GPU trainer sits on gpu-h100-1.
        for name, node, gpus in (
            ("ghost-a", "gpu-h100-0", 4),
            ("ghost-b", "gpu-h100-0", 4),
            ("live", "gpu-h100-1", 1),
        ):
            dep = deployment(name, ns, gpus=gpus)
            dep["spec"]["template"]["spec"]["nodeSelector"] = {**H100, HOSTNAME: node}
            kube.apply(dep)
        sc = Scenario(devcluster, ns, process_tables, dcgm)
        for name in ("ghost-a", "ghost-b", "live"):
            sc.pods[name] = wait_for(lambda n=name: sc.running_pod(n), 90, f"{name} running")
        opt_in(devcluster, ns)
        for name in ("ghost-a", "ghost-b"):
            process_tables.set(ns, sc.pods[name], FINISHED)
            dcgm.set(ns, sc.pods[name], util=0.0)
        process_tables.set(ns, sc.pods["live"], LIVE)
        dcgm.set(ns, sc.pods["live"], util=90.0)

        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "needs-a-node", "namespace": ns, "labels": {QUEUE_LABEL: "jobs"}},
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "suspend": True,
                "template": {
                    "metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": HOSTNAME}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "train", "image": "trainer:latest",
                                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                    },
                },
            },
        }  # fmt: skip
        kube.apply(job)

        def cq_status() -> dict[str, Any]:
            return co.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", cq).get(
                "status", {}
            )

        def does_not_fit() -> bool:
            wls = co.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"]
            conds = [c for w in wls for c in (w.get("status") or {}).get("conditions") or []]
            pending = [c for c in conds if c["type"] == "QuotaReserved" and c["status"] == "False"]
            return any("fit" in c.get("message", "") for c in pending)

        wait_for(does_not_fit, 60, "Kueue to find that the Job does not fit")
        time.sleep(2 * POLL)  # for the negative below: nothing gets admitted meanwhile
        # The ClusterQueue's counters come from another Kueue reconciler, which batches its writes.
        wait_for(lambda: cq_status().get("pendingWorkloads") == 1, 30, "the ClusterQueue to count the Job")
        assert cq_status().get("admittedWorkloads", 0) == 0
        assert batch.read_namespaced_job("needs-a-node", ns).spec.suspend is True

        def status() -> dict[str, Any]:
            out = subprocess.run(
                [sys.executable, "-m", "ghostgpu.cli", "status", "--json",
                 "--kubeconfig", str(devcluster.kubeconfig)],
                capture_output=True, text=True, check=True, cwd=REPO,
            )  # fmt: skip
            return next(a for a in json.loads(out.stdout) if a["flavor"] == flavor)

        before = status()
        assert (
            before["allocatable"] == 16 and before["kueueAdmitted"] == 0 and before["kueueBelievesFree"] == 16
        )
        assert before["heldOutsideKueue"] >= 9 and before["gap"] >= 9

        # A TAS flavor: before v0.19.1 Kueue retries the pending Job only on a node change (the nudge).
        cfg = controller_config(tmp_path, prometheus_url, "enforce", kueueNudge=nudge)
        controller = Controller(devcluster.kubeconfig, cfg, tmp_path, "enforce")
        controller.wait_polls(1)
        wait_for(lambda: sc.replicas("ghost-a") == 0 and sc.replicas("ghost-b") == 0, 90, "ghosts reclaimed")
        admitted_at = time.monotonic()
        # Admission unsuspends the Job (and stays visible after kwok completes its pod at once).
        wait_for(
            lambda: batch.read_namespaced_job("needs-a-node", ns).spec.suspend is False, 60, "Kueue admits"
        )
        wls = co.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"]
        admitted = [
            c for w in wls for c in (w.get("status") or {}).get("conditions") or [] if c["type"] == "Admitted"
        ]
        assert admitted, "the workload carries Kueue's Admitted condition"
        print(f"Job admitted {time.monotonic() - admitted_at:.1f}s after the reclaim")
        assert sc.replicas("live") == 1
        # kwok completes a Job's pod as soon as it runs, so the admitted usage is short-lived: check
        # where the pod went (the node the ghosts held) and that the Job ran, then the books.
        job_pods = wait_for(
            lambda: [p for p in core.list_namespaced_pod(ns, label_selector="job-name=needs-a-node").items
                     if p.spec.node_name],
            30,
            "the Job's pod to be scheduled",
        )  # fmt: skip
        assert job_pods[0].spec.node_name == "gpu-h100-0"
        freed = core.read_node("gpu-h100-0").metadata.annotations or {}
        if nudge:
            assert "ghostgpu.io/capacity-freed-at" in freed, "the nudge that made Kueue retry"
        wait_for(
            lambda: (batch.read_namespaced_job("needs-a-node", ns).status.succeeded or 0) == 1, 60, "Job done"
        )
        assert sc.replicas("live") == 1
        after = status()
        assert after["outsideKueueByVerdict"].get("FINISHED_IDLE", 0) == 0
        # "live" was plainly busy all along: no verdict written, so `status` counts it PENDING
        assert after["outsideKueueByVerdict"].get("PENDING") == 1
        assert after["gap"] <= 1 < before["gap"]
    finally:
        if controller is not None:
            controller.stop()
        kube.delete("batch/v1", "Job", "needs-a-node", ns)
        for obj in reversed(kueue_objs):
            kube.delete(
                "kueue.x-k8s.io/v1beta2",
                obj["kind"],
                obj["metadata"]["name"],
                obj["metadata"].get("namespace"),
            )


@pytest.mark.kueue
def test_unwritable_deployment_is_reclaimed_via_the_ledger_and_restored(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    """A namespace with a LocalQueue `default` (what the rendered Kyverno policy generates for a
    team): Kueue's Deployment webhook defaults queue-name on UPDATE and then rejects it as immutable,
    so no metadata write to a pre-existing Deployment succeeds. The controller records verdicts on
    the pods, the replica count in the ledger ConfigMap in its own namespace, scales through the
    scale subresource, and `ghostgpu restore` brings it back from the ledger."""
    kube = devcluster.kube
    uid = uuid.uuid4().hex[:6]
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns = make_namespace({}, prefix="legacy")
    sc = Scenario(devcluster, ns, process_tables, dcgm)
    kube.apply(deployment("legacy-ghost", ns))
    sc.pods["legacy-ghost"] = wait_for(lambda: sc.running_pod("legacy-ghost"), 90, "legacy-ghost running")
    # Kueue's webhook only refuses while the Deployment has ready replicas; at 0 it would accept
    # the next metadata write and add queue-name itself.
    wait_for(lambda: (sc.read("legacy-ghost").status.ready_replicas or 0) >= 1, 60, "legacy-ghost ready")
    opt_in(devcluster, ns)
    selector = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    # With a LocalQueue `default`, Kueue's pod webhook puts every NEW pod in the namespace into it
    # (queue-name defaulted, scheduling-gated until admitted): the restored pod needs quota.
    gpu_toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"rf-{uid}"},
            "spec": {"nodeLabels": H100, "tolerations": gpu_toleration},
        }
    )
    quota = {"name": f"rf-{uid}", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{uid}"},
            "spec": {
                "namespaceSelector": selector,
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [quota]}],
            },
        }
    )
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "default", "namespace": ns},
            "spec": {"clusterQueue": f"cq-{uid}"},
        }
    )

    def annotate_refused() -> bool:
        try:
            sc.apps.patch_namespaced_deployment(  # dry run: admission runs, nothing is stored
                "legacy-ghost", ns, {"metadata": {"annotations": {"probe": "1"}}}, dry_run="All"
            )
        except client.ApiException as exc:
            return "admission webhook" in str(exc.body)
        return False

    wait_for(annotate_refused, 30, "Kueue's webhook to refuse metadata writes to legacy-ghost")
    key = f"{ns}.deployment.legacy-ghost"

    def ledger() -> dict[str, str]:
        try:
            cm = sc.core.read_namespaced_config_map("ghostgpu-replica-ledger", LEASE_NS)
        except client.ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(cm.data or {})

    process_tables.set(ns, sc.pods["legacy-ghost"], FINISHED)
    dcgm.set(ns, sc.pods["legacy-ghost"], util=0.0)
    controller = Controller(
        devcluster.kubeconfig, controller_config(tmp_path, prometheus_url, "enforce"), tmp_path, "enforce"
    )
    try:
        controller.wait_polls(WINDOW + 2)

        def pod_verdict() -> str | None:
            try:
                pod = sc.core.read_namespaced_pod(sc.pods["legacy-ghost"], ns)
            except client.ApiException:
                return "gone"  # already reclaimed: the verdict was on it
            return (pod.metadata.annotations or {}).get("ghostgpu.io/verdict")

        wait_for(lambda: pod_verdict() in ("FINISHED_IDLE", "gone"), 60, "verdict on the pod")
        wait_for(lambda: sc.replicas("legacy-ghost") == 0, 60, "legacy-ghost scaled to 0 via the ledger")
        entry = json.loads(ledger()[key])
        deployed = sc.read("legacy-ghost")
        assert entry["replicas"] == 1 and entry["uid"] == deployed.metadata.uid
        controller.wait_polls(2)
        assert sc.events("legacy-ghost", "Reclaimed") == 1, "acted on once"
        assert sc.events("legacy-ghost", "ReclaimBlocked") == 0
        assert "ghostgpu.io/reclaimed-from-replicas" not in sc.annotations("legacy-ghost")
        assert QUEUE_LABEL not in (deployed.metadata.labels or {}), "ghostgpu never adds queue-name"
        assert controller.metric("ghostgpu_annotation_fallbacks_total", namespace=ns) >= 1
        assert controller.metric("ghostgpu_reclaims_total", namespace=ns) == 1
    finally:
        controller.stop()
    try:
        out = restore(devcluster, "deployment/legacy-ghost", ns)
        assert out.returncode == 0, out.stderr
        assert "to 1 replicas" in out.stdout
        assert sc.replicas("legacy-ghost") == 1
        assert key not in ledger(), "the ledger entry is cleared once restored"
        assert QUEUE_LABEL not in (sc.read("legacy-ghost").metadata.labels or {})
        # the new pod went through Kueue (its pod webhook defaulted queue-name) and was admitted
        new_pod = wait_for(lambda: sc.running_pod("legacy-ghost"), 90, "legacy-ghost running again")
        assert new_pod != sc.pods["legacy-ghost"]
        assert (sc.core.read_namespaced_pod(new_pod, ns).metadata.labels or {}).get(QUEUE_LABEL) == "default"
        again = restore(devcluster, "deployment/legacy-ghost", ns)
        assert again.returncode == 1 and "not reclaimed" in again.stderr
    finally:
        kube.delete("kueue.x-k8s.io/v1beta2", "LocalQueue", "default", ns)
        kube.delete("apps/v1", "Deployment", "legacy-ghost", ns)
        kube.delete("kueue.x-k8s.io/v1beta2", "ClusterQueue", f"cq-{uid}")
        kube.delete("kueue.x-k8s.io/v1beta2", "ResourceFlavor", f"rf-{uid}")


@pytest.mark.kueue
def test_verdict_on_a_deployment_with_no_ready_replicas_never_adds_queue_name(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    """A namespace with a LocalQueue `default` and a pre-existing Deployment whose pod runs but is
    not ready (a crash-looping zombie): Kueue's Deployment webhook would *accept* a metadata write
    at 0 ready replicas and add queue-name to it (and Kueue's labels to its pod template). The
    controller's dry-run sees that, writes nothing to the Deployment and records the verdict on
    the pod instead."""
    kube = devcluster.kube
    uid = uuid.uuid4().hex[:6]
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns = make_namespace({}, prefix="unready")
    sc = Scenario(devcluster, ns, process_tables, dcgm)
    name = "unready-ghost"
    kube.apply(deployment(name, ns))
    sc.pods[name] = pod = wait_for(lambda: sc.running_pod(name), 90, f"{name} running")
    # kwok made the pod Ready once (its stage matches Pending pods only): take that back.
    raw = sc.core.api_client.sanitize_for_serialization(sc.core.read_namespaced_pod(pod, ns))
    for cond in raw["status"].get("conditions") or []:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond["status"] = "False"
    for cs in raw["status"].get("containerStatuses") or []:
        cs["ready"] = False
    sc.core.replace_namespaced_pod_status(pod, ns, raw)
    wait_for(lambda: (sc.read(name).status.ready_replicas or 0) == 0, 60, f"{name} at 0 ready replicas")
    opt_in(devcluster, ns)
    gpu_toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"rf-{uid}"},
            "spec": {"nodeLabels": H100, "tolerations": gpu_toleration},
        }
    )
    quota = {"name": f"rf-{uid}", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{uid}"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [quota]}],
            },
        }
    )
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "default", "namespace": ns},
            "spec": {"clusterQueue": f"cq-{uid}"},
        }
    )

    def annotate_would_add_queue_name() -> bool:
        dry = sc.apps.patch_namespaced_deployment(  # dry run: admission runs, nothing is stored
            name, ns, {"metadata": {"annotations": {"probe": "1"}}}, dry_run="All"
        )
        return (dry.metadata.labels or {}).get(QUEUE_LABEL) == "default"

    # The bug's precondition: a plain annotation write would be accepted and roll it into Kueue.
    wait_for(annotate_would_add_queue_name, 30, f"Kueue's webhook to default queue-name on {name}")
    generation = sc.read(name).metadata.generation
    process_tables.set(ns, pod, FINISHED)
    dcgm.set(ns, pod, util=0.0)
    controller = Controller(
        devcluster.kubeconfig, controller_config(tmp_path, prometheus_url, "shadow"), tmp_path, "shadow"
    )
    try:
        controller.wait_polls(WINDOW + 2)

        def pod_verdict() -> str | None:
            annotations = sc.core.read_namespaced_pod(pod, ns).metadata.annotations or {}
            return annotations.get("ghostgpu.io/verdict")

        wait_for(lambda: pod_verdict() == "FINISHED_IDLE", 60, "the verdict recorded on the pod")
        controller.wait_polls(2)
        deployed = sc.read(name)
        assert QUEUE_LABEL not in (deployed.metadata.labels or {}), "ghostgpu never adds queue-name"
        assert not any(k.startswith("kueue.x-k8s.io/") for k in deployed.spec.template.metadata.labels or {})
        assert deployed.metadata.generation == generation, "the pod template is unchanged"
        assert "ghostgpu.io/verdict" not in (deployed.metadata.annotations or {})
        assert (deployed.status.ready_replicas or 0) == 0, "still the 0-ready case"
        assert controller.metric("ghostgpu_annotation_fallbacks_total", namespace=ns) >= 1
        assert sc.events(name, "WouldReclaim") == 1
    finally:
        controller.stop()
        kube.delete("kueue.x-k8s.io/v1beta2", "LocalQueue", "default", ns)
        kube.delete("apps/v1", "Deployment", name, ns)
        kube.delete("kueue.x-k8s.io/v1beta2", "ClusterQueue", f"cq-{uid}")
        kube.delete("kueue.x-k8s.io/v1beta2", "ResourceFlavor", f"rf-{uid}")


def test_risk_gate_scales_the_cheap_reclaim_and_escalates_the_dear_one(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    """Enforce mode with the default tau: two FINISHED_IDLE workloads. Scaling a 1-GPU
    Deployment to 0 scores below tau and is done alone (with its replica record); evicting a bare
    Pod (not recreated) scores above it and is escalated instead: the pod stays, an Event
    `ReclaimEscalated` and the annotation `ghostgpu.io/escalated` say why, and a local
    Alertmanager-compatible receiver gets a v2 POST naming the pod."""
    kube = devcluster.kube
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns = make_namespace({}, prefix="gate")  # opted in once the workloads run
    sc = Scenario(devcluster, ns, process_tables, dcgm)
    cheap, dear = "finished-a", "finished-pod"  # a Deployment; a bare Pod (Scenario.BARE)
    kube.apply(deployment(cheap, ns))
    template = deployment(dear, ns)["spec"]["template"]
    pod_meta = {"name": dear, "namespace": ns, "labels": template["metadata"]["labels"]}
    kube.apply({"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]})

    received: list[tuple[str, Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append((self.path, json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    controller: Controller | None = None
    try:
        for name in (cheap, dear):
            sc.pods[name] = wait_for(lambda n=name: sc.running_pod(n), 90, f"pod of {name} running")
        opt_in(devcluster, ns)
        for name in (cheap, dear):
            process_tables.set(ns, sc.pods[name], FINISHED)
            dcgm.set(ns, sc.pods[name], util=0.0)
        config = controller_config(tmp_path, prometheus_url, "enforce")
        cfg = yaml.safe_load(config.read_text())
        # The default tau (no override), and the webhook pointing at the local receiver.
        webhook = f"http://127.0.0.1:{receiver.server_address[1]}/api/v2/alerts"
        cfg["controller"]["autonomy"] = {"escalation": {"webhookUrl": webhook}}
        config.write_text(yaml.safe_dump(cfg))
        controller = Controller(devcluster.kubeconfig, config, tmp_path, "gate")
        controller.wait_polls(WINDOW)

        # (a) below tau: scaled to 0, with the replica record, alone.
        wait_for(lambda: sc.replicas(cheap) == 0, 60, f"{cheap} scaled to 0")
        # (b) above tau: escalated, with the webhook received.
        wait_for(lambda: sc.events(dear, "ReclaimEscalated") >= 1, 60, f"{dear} escalated")
        wait_for(lambda: received, 30, "the Alertmanager POST")
        controller.wait_polls(3)  # more polls: the escalation is not repeated, the pod not touched

        assert sc.annotations(cheap)["ghostgpu.io/reclaimed-from-replicas"] == "1"
        assert sc.events(cheap, "Reclaimed") == 1
        assert sc.events(cheap, "ReclaimEscalated") == 0
        assert "ghostgpu.io/escalated" not in sc.annotations(cheap)

        assert sc.replicas(dear) == 1, "the escalated pod is still there, not being deleted"
        assert sc.running_pod(dear) == dear
        assert sc.events(dear, "Reclaimed") == 0 and sc.events(dear, "ReclaimEscalated") == 1
        assert sc.verdict(dear) == "FINISHED_IDLE"
        escalated = json.loads(sc.annotations(dear)["ghostgpu.io/escalated"])
        assert escalated["action"] == "evict_pod", escalated
        assert escalated["score"] >= escalated["tau"], escalated  # the gate's own numbers
        assert escalated["tauSource"] == "tau (global)", "the default tau, no per-type entry"
        evs = sc.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={dear}").items
        (message,) = [e.message for e in evs if e.reason == "ReclaimEscalated"]
        assert message.startswith("FINISHED_IDLE: score ") and ">= tau (global)" in message, message
        assert "escalated to a person" in message

        assert len(received) == 1, received
        path, alerts = received[0]
        assert path == "/api/v2/alerts"
        (alert,) = alerts
        labels = alert["labels"]
        assert labels["alertname"] == "GhostGPUActionEscalated"
        assert (labels["kind"], labels["name"], labels["namespace"]) == ("Pod", dear, ns)
        assert labels["action"] == "evict_pod" and labels["verdict"] == "FINISHED_IDLE"
        assert float(alert["annotations"]["score"]) >= float(alert["annotations"]["tau"])
        assert alert["startsAt"].endswith("Z")

        # The decision log ("none" before the window fills): one reclaim alone, one escalated.
        actions: dict[str, set[str]] = {}
        for line in controller.decisions.read_text().splitlines():
            d = json.loads(line)
            if "kind" in d:
                continue  # poll markers and `left` lines of the run-length log carry no action
            actions.setdefault(d["workload"].rsplit("/", 1)[-1], set()).add(d["action"])
        assert actions[cheap] - {"none"} == {"scale-to-zero"}, actions
        assert actions[dear] - {"none"} == {"escalate"}, actions
        assert controller.metric("ghostgpu_reclaims_total", namespace=ns) == 1
        assert controller.metric("ghostgpu_escalations_total", namespace=ns) == 1
    finally:
        if controller is not None:
            controller.stop()
        receiver.shutdown()
        receiver.server_close()
        for name in sc.pods.values():
            process_tables.clear(ns, name)
