"""The reconcile loop without a cluster: scripted signal sources and a recording fake cluster.

What could break and is asserted here: who gets judged (opt-in, exemptions, grace, opt-out later),
that a failed signal never reclaims, that shadow never writes anything but verdict annotations and
Events, that enforce scales exactly the reclaimable ones once, that a stale read, a conflict, a
lost leadership or an exemption added at the last moment all prevent the action, and that
escalations are sent once per verdict.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.books.decisions import DecisionLog, parse_lines, summarize
from ghostgpu.controller.inventory import WorkloadRef, gpu_predicate, pod_view, workload_from
from ghostgpu.controller.judge import planner as planner_module
from ghostgpu.controller.kube import AdmissionDenied, Conflict, NotFound, WouldMutate
from ghostgpu.controller.ledger import (
    LEDGER_PRUNE_INTERVAL_S,
    LedgerEntry,
    ReplicaLedger,
    ledger_key,
    ref_of_key,
)
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.observe.observer import RECLAIM_SETTLE_SECONDS
from ghostgpu.controller.reconciler import Reconciler, Snapshot
from ghostgpu.signals.artifacts import FileArtifactProbe, Measurement
from ghostgpu.signals.podexec import ExecFailed, ExecResult, PodRef
from ghostgpu.signals.processes import ExecProcessSource
from ghostgpu.signals.utilization import PodKey, PodReading
from ghostgpu.verdict import FailureReason, SignalFailure

IS_GPU = gpu_predicate(["nvidia.com/gpu"])
NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
NS = "team-a"


def iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def deployment(name: str, *, ann: dict[str, str] | None = None, replicas: int = 1, ns: str = NS) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": "100",
            "labels": {"ghostgpu.io/tracked": "true"},
            "annotations": dict(ann or {}),
            "creationTimestamp": iso(NOW - timedelta(hours=2)),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
            },
        },
    }


def pod_for(name: str, *, started: datetime | None = None, ns: str = NS) -> dict:
    return {
        "metadata": {
            "name": f"{name}-abc12-xyz",
            "namespace": ns,
            "uid": f"uid-pod-{name}",
            "labels": {"app": name, "pod-template-hash": "abc12"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": f"{name}-abc12", "controller": True}],
        },
        "spec": {
            "nodeName": "gpu-0",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": {"phase": "Running", "startTime": iso(started or NOW - timedelta(hours=1))},
    }


class FakeCluster:
    """Records writes; `objects` is what a fresh GET returns."""

    def __init__(self, objects: dict[WorkloadRef, dict]) -> None:
        self.objects = objects
        self.patches: list[tuple[WorkloadRef, dict, str | None]] = []
        self.scaled: list[tuple[WorkloadRef, int]] = []
        self.evicted: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.conflict_on: set[str] = set()
        self.deny: set[str] = set()
        # workloads whose write the dry-run shows Kueue mutating (0 ready replicas, LocalQueue
        # `default`): kube.Cluster raises WouldMutate before writing anything
        self.would_mutate: set[str] = set()
        self.currents: list[tuple[WorkloadRef, bool]] = []  # (ref, the caller passed `current`)
        self.pdb_protected: set[str] = set()
        self.pods: list[dict] = []
        self.pod_annotations: dict[str, dict[str, str]] = {}
        self.nodes_annotated: list[str] = []
        # ConfigMaps with real resourceVersion semantics (the replica ledger)
        self.configmaps: dict[tuple[str, str], dict] = {}
        self.cm_writes = 0
        self.cm_conflicts = 0  # the next N ConfigMap writes answer 409 (a concurrent writer)
        self.cm_forbidden = False
        self.scale_fails = 0  # the next N scale calls fail (apiserver 500)

    async def get(self, ref: WorkloadRef) -> dict:
        if ref not in self.objects:
            raise NotFound(str(ref))
        return json.loads(json.dumps(self.objects[ref]))

    async def get_configmap(self, namespace: str, name: str) -> dict | None:
        cm = self.configmaps.get((namespace, name))
        return json.loads(json.dumps(cm)) if cm is not None else None

    def _cm_write_allowed(self) -> None:
        if self.cm_forbidden:
            raise RuntimeError("403 Forbidden: configmaps is forbidden")
        if self.cm_conflicts:
            self.cm_conflicts -= 1
            raise Conflict("ConfigMap")

    async def create_configmap(
        self, namespace: str, name: str, data: Mapping[str, str], *, labels=None
    ) -> dict:
        self._cm_write_allowed()
        if (namespace, name) in self.configmaps:
            raise Conflict("exists")
        self.cm_writes += 1
        self.configmaps[(namespace, name)] = {
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.cm_writes)},
            "data": dict(data),
        }
        return await self.get_configmap(namespace, name)  # type: ignore[return-value]

    async def replace_configmap(self, obj: Mapping[str, Any]) -> dict:
        self._cm_write_allowed()
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if self.configmaps[key]["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise Conflict("stale resourceVersion")
        self.cm_writes += 1
        self.configmaps[key] = {**json.loads(json.dumps(obj)), "metadata": {**obj["metadata"]}}
        self.configmaps[key]["metadata"]["resourceVersion"] = str(self.cm_writes)
        return await self.get_configmap(*key)  # type: ignore[return-value]

    async def patch_annotations(
        self, ref: WorkloadRef, ann: Mapping[str, str | None], *, resource_version=None, current=None
    ):
        self.currents.append((ref, current is not None))
        if ref.kind == "Pod":
            self.pod_annotations.setdefault(ref.name, {}).update(ann)  # type: ignore[arg-type]
            for pod in self.pods:  # what the pod watch would deliver
                if pod["metadata"]["name"] == ref.name:
                    pod["metadata"].setdefault("annotations", {}).update(ann)
            return {}
        if ref.name in self.deny:
            raise AdmissionDenied('admission webhook "vdeployment.kb.io" denied the request')
        if ref.name in self.would_mutate:
            raise WouldMutate(f"{ref}: the admission chain would change metadata.labels[queue-name]")
        if resource_version and ref.name in self.conflict_on:
            raise Conflict(str(ref))
        self.patches.append((ref, dict(ann), resource_version))
        meta = self.objects[ref]["metadata"]
        for k, v in ann.items():
            if v is None:
                meta["annotations"].pop(k, None)
            else:
                meta["annotations"][k] = v
        return self.objects[ref]

    async def scale(self, ref: WorkloadRef, replicas: int, *, resource_version: str | None = None) -> None:
        if self.scale_fails:
            self.scale_fails -= 1
            raise RuntimeError("500 Internal Server Error")
        meta = self.objects[ref]["metadata"]
        if resource_version and resource_version != meta["resourceVersion"]:
            raise Conflict(str(ref))
        self.scaled.append((ref, replicas))
        self.objects[ref]["spec"]["replicas"] = replicas
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    async def annotate_node(self, node: str, annotations: Mapping[str, str]) -> None:
        self.nodes_annotated.append(node)

    async def evict(self, namespace: str, pod: str) -> str:
        self.evicted.append(pod)
        return "blocked" if pod in self.pdb_protected else "evicted"

    async def event(
        self, involved: Mapping[str, Any], *, reason: str, message: str, type_: str = "Normal"
    ) -> None:
        self.events.append((involved["metadata"]["name"], reason))


class ScriptedUtilization:
    def __init__(self) -> None:
        self.values: dict[str, float | SignalFailure] = {}
        self.memory: dict[str, int | SignalFailure] = {}  # framebuffer bytes; default 0 (no context)
        self.queries: list[list[PodKey]] = []

    async def poll(
        self, pods: Iterable[PodKey], *, now: float, devices: object = None, uids: object = None
    ) -> dict[PodKey, PodReading]:
        pods = list(pods)
        self.queries.append(pods)
        out = {}
        for p in pods:
            app = p.name.split("-abc12")[0]
            v = self.values.get(app, SignalFailure(reason=FailureReason.MISSING))
            out[p] = PodReading(v, (), self.memory.get(app, 0))
        return out


def ps(*rows: str) -> str:
    """procps's listing for the controller's argv: "pid ppid stat etimes args" rows."""
    return "PID PPID STAT ELAPSED COMMAND\n" + "".join(f"{r}\n" for r in rows)


class ScriptedExec:
    def __init__(self) -> None:
        self.tables: dict[str, str | ExecFailed] = {}
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls.append((pod.name, argv))
        app = pod.name.split("-abc12")[0]
        t = self.tables.get(
            app,
            ps("1 0 Ss 900 sh -c python train.py", "9 1 R 900 python train.py"),
        )
        if isinstance(t, ExecFailed):
            raise t
        return ExecResult(t, "", 0)


class Harness:
    def __init__(self, tmp: Path, *, mode: str = "shadow", **cfg: Any) -> None:
        self.cfg = ControllerConfig.model_validate(
            {"mode": mode, "window": 3, "longWindow": 6, "pollInterval": "60s", "startupGrace": "10m", **cfg}
        )
        self.objects: dict[WorkloadRef, dict] = {}
        self.pods: list[dict] = []
        self.namespaces = {NS: {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "research"}}
        self.cluster = FakeCluster(self.objects)
        self.cluster.pods = self.pods
        self.util = ScriptedUtilization()
        self.exec = ScriptedExec()
        self.leader = True
        self.escalations: list[str] = []
        self.metrics = ControllerMetrics()
        self.log = DecisionLog(tmp / "decisions.jsonl")
        self.clock = NOW.timestamp()

        self.rec = self.reconciler()

    def reconciler(self) -> Reconciler:
        async def escalate(decision: Any, wl: Any, pods: Any = ()) -> None:
            self.escalations.append(wl.ref.name)

        return Reconciler(
            self.cfg,
            cluster=self.cluster,  # type: ignore[arg-type]
            utilization=self.util,  # type: ignore[arg-type]
            processes=ExecProcessSource(self.exec, concurrency=2),
            files=FileArtifactProbe(self.exec),
            s3=None,
            metrics=self.metrics,
            decision_log=self.log,
            is_leader=lambda: self.leader,
            clock=lambda: self.clock,
            escalate=escalate,
            ledger=ReplicaLedger(self.cluster, "ghostgpu-system"),  # type: ignore[arg-type]
        )

    def add(
        self,
        name: str,
        *,
        util: float | SignalFailure | None = 0.0,
        table: str | ExecFailed | None = None,
        ann: dict[str, str] | None = None,
        started: datetime | None = None,
        ns: str = NS,
    ) -> None:
        d = deployment(name, ann=ann, ns=ns)
        self.objects[WorkloadRef("Deployment", ns, name)] = d
        self.pods.append(pod_for(name, started=started, ns=ns))
        if util is not None:
            self.util.values[name] = util
        if table is not None:
            self.exec.tables[name] = table

    def snapshot(self) -> Snapshot:
        workloads = {}
        for obj in self.objects.values():
            wl = workload_from("Deployment", obj, IS_GPU)
            workloads[wl.ref] = wl
        live = [
            p
            for p in self.pods
            if self.objects[
                WorkloadRef("Deployment", p["metadata"]["namespace"], p["metadata"]["labels"]["app"])
            ]["spec"]["replicas"]
        ]
        return Snapshot(self.namespaces, workloads, [pod_view(p, IS_GPU) for p in live], [])

    async def polls(self, n: int) -> Any:
        result = None
        for _ in range(n):
            result = await self.rec.poll_once(self.snapshot())
            self.clock += 60
        return result

    def verdict(self, name: str) -> str | None:
        return self.objects[WorkloadRef("Deployment", NS, name)]["metadata"]["annotations"].get(
            "ghostgpu.io/verdict"
        )

    def replicas(self, name: str) -> int:
        return int(self.objects[WorkloadRef("Deployment", NS, name)]["spec"]["replicas"])


FINISHED = ps("1 0 Ss 900 sh -c python train.py; sleep infinity", "7 1 S 600 sleep infinity")
ZOMBIE = ps("1 0 Ss 900 sh -c python train.py", "12 1 Z 600 [python] <defunct>")


async def test_shadow_judges_records_and_touches_nothing(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.add("busy", util=80.0)
    h.add("done", table=FINISHED)
    h.add("crashed", table=ZOMBIE)
    h.add(
        "gap",
        table=ps("1 0 Ss 900 sh -c python train.py", "12 1 Sl 900 python train.py"),
    )
    h.add("broken", util=SignalFailure(reason=FailureReason.HTTP_ERROR))
    await h.polls(2)
    # fewer than K samples: nobody is judged yet, busy or not, and a warm-up writes nothing
    assert {h.verdict(n) for n in ("busy", "done", "broken")} == {None}
    assert h.cluster.patches == [] and h.cluster.events == []
    result = await h.polls(2)
    assert h.verdict("done") == "FINISHED_IDLE" and h.verdict("crashed") == "ZOMBIE_CRASHED"
    assert h.verdict("broken") == "UNKNOWN"
    # A first plain ACTIVE verdict (busy) is judged but not written: no annotation, no Event, no
    # request. An ACTIVE that says more (a batch gap: zero utilization, live work) is written.
    judged = {r.name: j.verdict.kind.value for r, j in result.judged.items()}
    assert judged["busy"] == judged["gap"] == "ACTIVE"
    assert h.verdict("busy") is None and h.verdict("gap") == "ACTIVE"
    assert not [n for n, _ in h.cluster.events if n == "busy"]
    assert not [r for r, _, _ in h.cluster.patches if r.name == "busy"]
    assert h.cluster.scaled == [] and h.cluster.evicted == []
    assert all(
        k in ("ghostgpu.io/verdict", "ghostgpu.io/evidence") for _, ann, _ in h.cluster.patches for k in ann
    )
    assert [e for e in h.cluster.events if e[1] == "WouldReclaim"] == [
        ("crashed", "WouldReclaim"),
        ("done", "WouldReclaim"),
    ]
    # one Event per verdict change, not per poll
    assert [r for n, r in h.cluster.events if n == "done"] == ["VerdictFinishedIdle", "WouldReclaim"]
    # one batched utilization query per poll, processes only for all-zero windows
    assert len(h.util.queries) == 4 and all(len(q) == 5 for q in h.util.queries)
    probed = {name.split("-abc12")[0] for name, _ in h.exec.calls}
    assert probed == {"done", "crashed", "gap"}
    # the decision log feeds the report
    rep = summarize(parse_lines(h.log.read_bytes().decode().splitlines()))
    assert rep.polls == 4 and rep.gpu_hours_would_reclaim == pytest.approx(2 * 2 * 60 / 3600 * 2)
    assert [m.outcome for m in rep.misses if m.workload.endswith("/broken")] == ["persisted"]


async def test_enforce_scales_exactly_the_reclaimable_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce", kueueNudge=True)
    h.add("busy", util=80.0)
    h.add("done", table=FINISHED)
    h.add("crashed", table=ZOMBIE)
    h.add(
        "held",
        table=ps("1 0 Ss 900 tini -- jupyter-lab", "8 1 Sl 900 jupyter-lab --port 8888"),
    )
    h.add("exempt", ann={"ghostgpu.io/reclaim-policy": "never"}, table=FINISHED)
    h.add("procs-forbidden", table=ExecFailed(FailureReason.FORBIDDEN, "HTTP 403"))
    await h.polls(7)
    assert sorted(r.name for r, n in h.cluster.scaled) == ["crashed", "done"]
    assert all(n == 0 for _, n in h.cluster.scaled)
    assert h.verdict("held") == "IDLE_HELD" and h.verdict("procs-forbidden") == "UNKNOWN"
    assert h.verdict("exempt") is None
    for name in ("done", "crashed"):
        ann = h.objects[WorkloadRef("Deployment", NS, name)]["metadata"]["annotations"]
        assert ann["ghostgpu.io/reclaimed-from-replicas"] == "1"
        assert sum(1 for n, r in h.cluster.events if n == name and r == "Reclaimed") == 1
    # the reclaim annotation was written with a resourceVersion precondition
    assert all(
        rv == "100" for _, ann, rv in h.cluster.patches if "ghostgpu.io/reclaimed-from-replicas" in ann
    )
    assert h.metrics.reclaims.labels(NS, "FINISHED_IDLE", "scale-to-zero")._value.get() == 1
    # Kueue is told once that capacity was freed on the node of the reclaimed pods
    assert h.cluster.nodes_annotated == ["gpu-0"]


async def test_kueue_nudge_is_off_by_default(tmp_path: Path) -> None:
    """Without controller.kueueNudge the rendered RBAC has no patch on nodes: never try."""
    h = Harness(tmp_path, mode="enforce")
    h.add("done", table=FINISHED)
    await h.polls(4)
    assert [r.name for r, _ in h.cluster.scaled] == ["done"]
    assert h.cluster.nodes_annotated == []


def test_kueue_nudge_cli_flag_overrides_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import ghostgpu.controller.app as app_mod
    from ghostgpu.cli import app

    seen: list[bool] = []

    async def fake_run(loaded: Any, **kwargs: Any) -> None:
        assert kwargs.get("kueue_nudge") is None
        seen.append(loaded.controller.kueue_nudge)

    monkeypatch.setattr(app_mod, "run_controller", fake_run)
    cfg = tmp_path / "controller.yaml"
    cfg.write_text("kueueNudge: true\n")
    for args, want in (([], False), (["-c", str(cfg)], True), (["-c", str(cfg), "--no-kueue-nudge"], False)):
        seen.clear()
        out = CliRunner().invoke(app, ["controller", *args])
        assert out.exit_code == 0, out.output
        assert seen == [want], args
    out = CliRunner().invoke(app, ["controller", "--kueue-nudge"])
    assert out.exit_code == 0 and seen[-1] is True


async def test_guards_before_acting(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce")
    h.add("conflict", table=FINISHED)
    h.add("already-zero", table=FINISHED)
    h.add("late-exempt", table=FINISHED)
    h.add("lost-lease", table=FINISHED)
    h.cluster.conflict_on.add("conflict")
    await h.polls(2)
    snap = h.snapshot()  # the watch cache, about to go stale
    # what a fresh read shows: someone scaled one to zero, an owner exempted another
    h.objects[WorkloadRef("Deployment", NS, "already-zero")]["spec"]["replicas"] = 0
    h.objects[WorkloadRef("Deployment", NS, "late-exempt")]["metadata"]["annotations"][
        "gpu-eviction-policy"
    ] = "never"
    # leadership: held at the start of the poll and for "conflict", lost before "lost-lease"
    answers = iter([True, True, False])
    h.rec.is_leader = lambda: next(answers)
    result = await h.rec.poll_once(snap)
    outcomes = {r.name: o for r, o in result.actions}
    assert outcomes == {
        "already-zero": "already-zero",
        "conflict": "conflict",
        "late-exempt": "exempt",
        "lost-lease": "not-leader",
    }
    assert h.cluster.scaled == []


async def test_follower_never_writes(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce")
    h.add("done", table=FINISHED)
    h.leader = False
    result = await h.polls(5)
    assert h.cluster.patches == [] and h.cluster.events == [] and h.cluster.scaled == []
    assert result.judged[WorkloadRef("Deployment", NS, "done")].verdict.kind.value == "FINISHED_IDLE"
    assert h.log.read_bytes() == b"", "only the leader keeps the decision log"
    h.leader = True  # takeover: the window is already warm, the new leader acts on its next poll
    await h.polls(1)
    assert [r.name for r, _ in h.cluster.scaled] == ["done"]


async def test_grace_opt_out_and_new_pods_reset_the_window(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.add("young", table=FINISHED, started=NOW - timedelta(minutes=1))
    h.add("other-ns", table=FINISHED, ns="team-b")  # namespace not opted in
    result = await h.polls(1)
    assert result.states["grace"] == 1 and not result.judged
    h.namespaces["team-b"] = {"ghostgpu.io/reclaim": "enabled"}
    h.clock += 600  # grace over
    await h.polls(3)
    assert h.verdict("young") == "FINISHED_IDLE"
    assert (
        h.objects[WorkloadRef("Deployment", "team-b", "other-ns")]["metadata"]["annotations"][
            "ghostgpu.io/verdict"
        ]
        == "FINISHED_IDLE"
    )
    # opting out later: the workload is forgotten and never touched again
    h.namespaces["team-b"] = {}
    writes = len(h.cluster.patches)
    result = await h.polls(2)
    assert WorkloadRef("Deployment", "team-b", "other-ns") not in result.judged
    assert all(ref.namespace != "team-b" for ref, _, _ in h.cluster.patches[writes:])
    # replaced pods: old zeros must not count for the new pod
    h.pods = [p for p in h.pods if p["metadata"]["labels"]["app"] != "young"]
    new = pod_for("young", started=NOW - timedelta(hours=1))
    new["metadata"]["uid"] = "uid-new"
    h.pods.append(new)
    result = await h.polls(1)
    assert result.judged[WorkloadRef("Deployment", NS, "young")].verdict.kind.value == "UNKNOWN"


async def test_artifact_growth_keeps_it_alive_and_failure_is_unknown(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.add("writer", table=FINISHED, ann={"ghostgpu.io/artifacts": "file:///data/ckpt"})
    h.add("bad-uri", table=FINISHED, ann={"ghostgpu.io/artifacts": "file:///data/../etc"})
    sizes = iter([100, 200, 300, 300, 300, 300])

    async def measure(pod: PodRef, target: Any) -> Measurement:
        return Measurement(next(sizes) * 1024, False)

    h.rec.observer.files.measure = measure  # type: ignore[method-assign]
    result = await h.polls(3)
    # 100 KiB -> 300 KiB inside the window (a first ACTIVE verdict is not written)
    assert result.judged[WorkloadRef("Deployment", NS, "writer")].verdict.kind.value == "ACTIVE"
    assert h.verdict("bad-uri") == "UNKNOWN"
    await h.polls(3)
    assert h.verdict("writer") == "FINISHED_IDLE"


async def test_escalation_is_sent_once_per_verdict(tmp_path: Path) -> None:
    # tau 0: every non-observational action escalates
    h = Harness(tmp_path, mode="enforce", autonomy={"tau": 0.0})
    h.add("done", table=FINISHED)
    await h.polls(6)
    assert h.cluster.scaled == []
    assert h.escalations == ["done"]
    assert sum(1 for n, r in h.cluster.events if r == "ReclaimEscalated") == 1
    ann = h.objects[WorkloadRef("Deployment", NS, "done")]["metadata"]["annotations"]
    assert json.loads(ann["ghostgpu.io/escalated"])["action"] == "scale_to_zero"


async def test_per_verdict_switch_disables_reclaim(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce", actions={"reclaim": {"FINISHED_IDLE": False}})
    h.add("done", table=FINISHED)
    h.add("crashed", table=ZOMBIE)
    await h.polls(4)
    assert [r.name for r, _ in h.cluster.scaled] == ["crashed"]


LEDGER = ("ghostgpu-system", "ghostgpu-replica-ledger")


def ledger_data(h: Harness) -> dict[str, dict[str, Any]]:
    cm = h.cluster.configmaps.get(LEDGER) or {}
    return {k: json.loads(v) for k, v in (cm.get("data") or {}).items()}


async def test_unwritable_workload_records_on_pods_and_scales_via_the_ledger(tmp_path: Path) -> None:
    """Kueue's webhook refuses any metadata write to a pre-existing Deployment once the namespace
    has a LocalQueue `default`: verdicts go to the pods, the replica count to the ledger ConfigMap,
    and only once that is stored is the Deployment scaled (through the scale subresource)."""
    h = Harness(tmp_path, mode="enforce")
    h.add("legacy", table=FINISHED)
    h.add("writable", table=FINISHED)
    h.cluster.deny.add("legacy")
    await h.polls(5)
    pod = "legacy-abc12-xyz"
    assert h.cluster.pod_annotations[pod]["ghostgpu.io/verdict"] == "FINISHED_IDLE"
    assert sorted(r.name for r, n in h.cluster.scaled) == ["legacy", "writable"]
    key = ledger_key(WorkloadRef("Deployment", NS, "legacy"))
    assert key == "team-a.deployment.legacy"
    entries = ledger_data(h)
    assert list(entries) == [key], "the annotation stays the record where it can be written"
    assert entries[key]["replicas"] == 1 and entries[key]["uid"] == "uid-legacy" and entries[key]["at"]
    assert (
        "ghostgpu.io/reclaimed-from-replicas"
        not in h.objects[WorkloadRef("Deployment", NS, "legacy")]["metadata"]["annotations"]
    )
    assert not any(r == "ReclaimBlocked" for _, r in h.cluster.events)
    assert sum(1 for n, r in h.cluster.events if n == "legacy" and r == "Reclaimed") == 1
    # the verdict read back from the pods: one Event per change, not one per poll
    assert [r for n, r in h.cluster.events if n == "legacy" and r.startswith("Verdict")] == [
        "VerdictFinishedIdle",
    ]
    assert h.metrics.write_fallbacks.labels(NS)._value.get() == 1  # the one verdict write (no warm-up write)
    # a stale watch cache still shows the dying pod: no exec, no verdict write onto the workload
    # (at zero ready replicas Kueue's webhook would accept one and add queue-name to it)
    h.exec.tables["legacy"] = ExecFailed(FailureReason.NOT_FOUND, "pod gone")
    snap = h.snapshot()
    stale = Snapshot(snap.namespaces, snap.workloads, [pod_view(pod_for("legacy"), IS_GPU)], [])
    writes, pod_writes, execs = len(h.cluster.patches), dict(h.cluster.pod_annotations), len(h.exec.calls)
    result = await h.rec.poll_once(stale)
    assert result.states["reclaimed"] == 2 and not result.judged
    assert len(h.cluster.patches) == writes and h.cluster.pod_annotations == pod_writes
    assert len(h.exec.calls) == execs
    # later polls: counted as reclaimed (from the ledger) and as recovered GPU-hours; never acted twice
    result = await h.polls(2)
    assert result.states["reclaimed"] == 2
    assert len(h.cluster.scaled) == 2
    # both reclaimed at poll 3 (window 3); 2 workloads x 2 GPUs recovered at polls 4-5, the stale one, 6-7
    assert h.metrics.gpu_hours_recovered.labels(NS, "all")._value.get() == pytest.approx(
        5 * 2 * 2 * 60 / 3600
    )
    # the skip is bounded: old pods still running long after the reclaim (a person restored it
    # before the scale-down reached them) are judged again instead of being ignored forever
    # (the stale poll above, right after the reclaim, was skipped)
    h.clock += RECLAIM_SETTLE_SECONDS
    result = await h.rec.poll_once(stale)
    assert [r.name for r in result.judged] == ["legacy"]


async def test_ledger_write_retries_on_conflict_and_blocks_when_impossible(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce")
    h.add("legacy", table=FINISHED)
    h.cluster.deny.add("legacy")
    # another (existing) workload's entry exists; a concurrent writer wins the first two writes
    h.objects[WorkloadRef("StatefulSet", "other", "x")] = {"metadata": {"name": "x", "uid": "uid-x"}}
    await ReplicaLedger(h.cluster, LEDGER[0]).record(  # type: ignore[arg-type]
        WorkloadRef("StatefulSet", "other", "x"), LedgerEntry(3, "uid-x", "2026-01-01T00:00:00Z")
    )
    h.cluster.cm_conflicts = 2
    await h.polls(3)
    assert [r.name for r, _ in h.cluster.scaled] == ["legacy"]
    assert set(ledger_data(h)) == {"other.statefulset.x", "team-a.deployment.legacy"}, (
        "merged, not overwritten"
    )
    # neither the annotation nor the ledger can be written: no scale, ReclaimBlocked once per verdict
    h = Harness(tmp_path, mode="enforce")
    h.add("forbidden", table=FINISHED)
    h.cluster.deny.add("forbidden")
    h.cluster.cm_forbidden = True
    await h.polls(5)
    assert h.cluster.scaled == [] and h.replicas("forbidden") == 1
    assert [n for n, r in h.cluster.events if r == "ReclaimBlocked"] == ["forbidden"]
    # a conflict storm that never ends is a failure too, not a scale
    h.cluster.cm_forbidden, h.cluster.cm_conflicts = False, 1000
    await h.polls(2)
    assert h.cluster.scaled == []


async def test_ledger_scale_precondition_and_failover_never_act_twice(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce")
    h.add("legacy", table=FINISHED)
    h.cluster.deny.add("legacy")
    await h.polls(2)
    # the object changes between the fresh read and the scale (another actor): 409, no scale
    real_record = h.rec.records.ledger.record  # type: ignore[union-attr]

    async def record_then_bump(ref: WorkloadRef, entry: LedgerEntry) -> None:
        await real_record(ref, entry)
        meta = h.objects[ref]["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    h.rec.records.ledger.record = record_then_bump  # type: ignore[union-attr,method-assign]
    result = await h.polls(1)
    assert dict((r.name, o) for r, o in result.actions)["legacy"] == "conflict"
    assert h.cluster.scaled == []
    h.rec.records.ledger.record = real_record  # type: ignore[union-attr,method-assign]
    await h.polls(1)
    assert [r.name for r, _ in h.cluster.scaled] == ["legacy"]
    # a new leader with a stale cache: the fresh read shows 0 replicas, nothing happens twice
    stale = Harness(tmp_path, mode="enforce")
    stale.objects.update(h.objects)
    stale.cluster = h.cluster
    stale.rec = stale.reconciler()  # on the shared cluster and its ledger
    snap = h.snapshot()
    snap = Snapshot(snap.namespaces, snap.workloads, [pod_view(pod_for("legacy"), IS_GPU)], [])
    stale.util.values["legacy"] = 0.0
    stale.exec.tables["legacy"] = FINISHED
    for _ in range(3):
        result = await stale.rec.poll_once(snap)
        stale.clock += 60
    assert dict((r.name, o) for r, o in result.actions)["legacy"] == "already-zero"
    assert len(h.cluster.scaled) == 1
    assert sum(1 for n, r in h.cluster.events if n == "legacy" and r == "Reclaimed") == 1


async def test_restore_from_the_ledger(tmp_path: Path) -> None:
    from ghostgpu.controller.ops import RestoreError, restore_workload

    h = Harness(tmp_path, mode="enforce")
    h.add("legacy", table=FINISHED)
    h.cluster.deny.add("legacy")
    await h.polls(4)
    ref = WorkloadRef("Deployment", NS, "legacy")
    assert h.replicas("legacy") == 0
    ledger = ReplicaLedger(h.cluster, LEDGER[0])  # type: ignore[arg-type]
    # a failed scale keeps the record (restore can be run again)
    h.cluster.scale_fails = 1
    with pytest.raises(RuntimeError):
        await restore_workload(h.cluster, ref, ledger)
    assert ledger_data(h)[ledger_key(ref)]["replicas"] == 1
    patches = len(h.cluster.patches)
    done = await restore_workload(h.cluster, ref, ledger)
    assert done.replicas == 1 and h.replicas("legacy") == 1
    assert ledger_data(h) == {}, "the record is cleared once restored"
    assert len(h.cluster.patches) == patches, "the unwritable workload's metadata is never patched"
    assert ("legacy", "Restored") in h.cluster.events
    with pytest.raises(RestoreError, match="not reclaimed"):
        await restore_workload(h.cluster, ref, ledger)
    # an entry left by an earlier object of the same name is not applied to the new one
    await ledger.record(ref, LedgerEntry(4, "uid-previous", "2026-01-01T00:00:00Z"))
    with pytest.raises(RestoreError, match="earlier object"):
        await restore_workload(h.cluster, ref, ledger)
    assert h.replicas("legacy") == 1


async def test_the_leader_prunes_ledger_entries_only_once_their_workload_is_provably_gone(
    tmp_path: Path,
) -> None:
    """Entries of deleted or re-created workloads go (restore refuses them; the ConfigMap is read
    every poll and holds 1 MiB at most); anything in doubt stays, because a lost count is lost."""
    h = Harness(tmp_path, mode="enforce")
    h.add("legacy", table=FINISHED)
    h.cluster.deny.add("legacy")
    await h.polls(4)
    assert h.replicas("legacy") == 0 and list(ledger_data(h)) == ["team-a.deployment.legacy"]
    ledger = ReplicaLedger(h.cluster, LEDGER[0])  # type: ignore[arg-type]
    entry = lambda uid: LedgerEntry(2, uid, "2026-01-01T00:00:00Z")  # noqa: E731
    gone = WorkloadRef("Deployment", NS, "deleted.by.its.team")  # dots in a name are allowed
    recreated = WorkloadRef("Deployment", NS, "recreated")
    untracked = WorkloadRef("StatefulSet", "other", "db")  # exists, but not in the tracked cache
    doubtful = WorkloadRef("StatefulSet", "other", "flaky")
    long = WorkloadRef("Deployment", "n" * 63, "x" * 253)  # key shortened with a digest
    h.objects[recreated] = deployment("recreated", replicas=0)  # the same name, a new uid
    h.objects[untracked] = {"metadata": {"name": "db", "namespace": "other", "uid": "uid-db"}}
    h.objects[doubtful] = {"metadata": {"name": "flaky", "namespace": "other", "uid": "uid-flaky"}}
    uids = {
        gone: "uid-gone",
        recreated: "uid-old",
        untracked: "uid-db",
        doubtful: "uid-flaky",
        long: "uid-long",
    }
    for ref, uid in uids.items():
        await ledger.record(ref, entry(uid))
    asked: list[WorkloadRef] = []
    real_get = h.cluster.get

    async def get(ref: WorkloadRef) -> dict:
        asked.append(ref)
        if ref == doubtful:
            raise RuntimeError("500 Internal Server Error")
        return await real_get(ref)

    h.cluster.get = get  # type: ignore[method-assign]
    snapshot = lambda: Snapshot(  # noqa: E731  (the tracked cache: legacy and recreated, not the others)
        h.namespaces, {r: w for r, w in h.snapshot().workloads.items() if r.namespace == NS}, [], []
    )
    await h.rec.poll_once(snapshot())  # within the interval of the last round: nothing is checked
    assert len(ledger_data(h)) == 6 and not [r for r in asked if r != recreated]
    h.clock += LEDGER_PRUNE_INTERVAL_S
    h.leader = False
    await h.rec.poll_once(snapshot())
    assert len(ledger_data(h)) == 6, "a follower never prunes"
    h.leader = True
    asked.clear()
    await h.rec.poll_once(snapshot())
    assert set(ledger_data(h)) == {ledger_key(r) for r in (WorkloadRef("Deployment", NS, "legacy"), untracked,
                                                           doubtful, long)}  # fmt: skip
    # legacy is in the cache with its entry's uid, and the long key cannot be read back: no GET
    assert sorted(map(str, asked)) == sorted(map(str, [gone, recreated, untracked, doubtful]))
    h.cluster.get = real_get  # type: ignore[method-assign]
    del h.objects[doubtful]
    h.clock += LEDGER_PRUNE_INTERVAL_S
    await h.rec.poll_once(snapshot())
    assert ledger_key(doubtful) not in ledger_data(h), "gone once the doubt is lifted (404)"
    assert h.replicas("legacy") == 0 and ledger_data(h)[ledger_key(WorkloadRef("Deployment", NS, "legacy"))]


async def test_ledger_remove_stale_keeps_an_entry_rewritten_meanwhile(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ledger = ReplicaLedger(h.cluster, LEDGER[0])  # type: ignore[arg-type]
    ref = WorkloadRef("Deployment", NS, "web")
    assert await ledger.remove_stale({ledger_key(ref): "uid-a"}) == 0  # no ConfigMap yet
    await ledger.record(ref, LedgerEntry(3, "uid-b", ""))  # a new reclaim of the re-created object
    assert await ledger.remove_stale({ledger_key(ref): "uid-a"}) == 0
    assert ledger_data(h)[ledger_key(ref)]["uid"] == "uid-b"
    h.cluster.cm_conflicts = 2  # a concurrent writer: read again, still remove only what matches
    assert await ledger.remove_stale({ledger_key(ref): "uid-b"}) == 1 and ledger_data(h) == {}


def test_ledger_keys_read_back_to_their_workload() -> None:
    for ref in (
        WorkloadRef("Deployment", "team-a", "web"),
        WorkloadRef("StatefulSet", "ns", "db.primary.v2"),
    ):
        assert ref_of_key(ledger_key(ref)) == ref
    assert ref_of_key(ledger_key(WorkloadRef("Deployment", "n" * 63, "x" * 253))) is None
    for odd in ("", "ns", "ns.deployment", "ns.cronjob.x", ".deployment.x"):
        assert ref_of_key(odd) is None


def test_ledger_keys_and_entries() -> None:
    long = WorkloadRef("Deployment", "n" * 63, "x" * 253)
    key = ledger_key(long)
    assert len(key) == 253 and key != ledger_key(WorkloadRef("Deployment", "n" * 63, "x" * 252 + "y"))
    assert LedgerEntry.parse('{"replicas": 2, "uid": "u", "at": ""}') == LedgerEntry(2, "u", "")
    for bad in (
        "",
        "[]",
        '{"replicas": "2", "uid": "u"}',
        '{"replicas": -1, "uid": "u"}',
        '{"replicas": true}',
    ):
        assert LedgerEntry.parse(bad) is None


async def test_bare_pod_eviction_and_pdb_block(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce", autonomy={"tau": 0.4})
    for name in ("lonely", "guarded"):
        obj = pod_for(name)
        del obj["metadata"]["ownerReferences"]
        obj["metadata"]["name"] = name
        obj["metadata"]["labels"] = {"ghostgpu.io/tracked": "true", "app": name}
        obj["metadata"]["annotations"] = {}
        obj["metadata"]["resourceVersion"] = "7"
        h.objects[WorkloadRef("Pod", NS, name)] = obj
        h.exec.tables[name] = FINISHED
        h.util.values[name] = 0.0
    h.cluster.pdb_protected.add("guarded")

    def snapshot() -> Snapshot:
        workloads = {}
        pods = []
        for ref, obj in h.objects.items():
            wl = workload_from("Pod", obj, IS_GPU)
            workloads[ref] = wl
            if ref.name not in h.cluster.evicted or ref.name in h.cluster.pdb_protected:
                pods.append(pod_view(obj, IS_GPU))
        return Snapshot(h.namespaces, workloads, pods, [])

    for _ in range(6):
        await h.rec.poll_once(snapshot())
        h.clock += 60
    assert h.cluster.evicted.count("lonely") == 1
    assert h.cluster.evicted.count("guarded") >= 2, "a blocked eviction is retried every poll"
    assert [r for n, r in h.cluster.events if n == "guarded" and r == "EvictionBlocked"] == [
        "EvictionBlocked"
    ]
    assert h.cluster.scaled == [], "a bare pod is never scaled or deleted, only evicted"


async def test_kueue_would_mutate_the_workload_so_verdicts_go_to_pods_and_the_count_to_the_ledger(
    tmp_path: Path,
) -> None:
    """At 0 ready replicas Kueue's webhook would accept a metadata write and add queue-name: the
    dry-run in kube.Cluster sees it (WouldMutate) and nothing reaches the workload; the fallback is
    the refused write's (pods, ledger). A workload whose dry-run is clean is written as before."""
    h = Harness(tmp_path, mode="enforce")
    h.add("unready", table=ZOMBIE)
    h.add("writable", table=ZOMBIE)
    h.cluster.would_mutate.add("unready")
    await h.polls(5)
    unready = WorkloadRef("Deployment", NS, "unready")
    assert not [r for r, _, _ in h.cluster.patches if r == unready], "never written"
    assert not h.objects[unready]["metadata"]["annotations"]
    assert h.cluster.pod_annotations["unready-abc12-xyz"]["ghostgpu.io/verdict"] == "ZOMBIE_CRASHED"
    assert "writable-abc12-xyz" not in h.cluster.pod_annotations
    assert h.verdict("writable") == "ZOMBIE_CRASHED"
    assert sorted(r.name for r, n in h.cluster.scaled) == ["unready", "writable"]
    assert list(ledger_data(h)) == [ledger_key(unready)]
    assert h.metrics.write_fallbacks.labels(NS)._value.get() == 1  # the one verdict write (no warm-up write)
    # every workload write handed the dry-run its copy of the object (no extra GET)
    assert all(given for ref, given in h.cluster.currents if ref.kind == "Deployment")


async def test_escalation_annotation_falls_back_to_the_pods_too(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce", autonomy={"tau": 0.0})
    h.add("done", table=FINISHED)
    h.cluster.would_mutate.add("done")
    await h.polls(6)
    assert h.escalations == ["done"] and h.cluster.scaled == []
    assert not h.objects[WorkloadRef("Deployment", NS, "done")]["metadata"]["annotations"]
    pod = h.cluster.pod_annotations["done-abc12-xyz"]
    assert json.loads(pod["ghostgpu.io/escalated"])["action"] == "scale_to_zero"


async def test_restore_leaves_the_metadata_alone_when_kueue_would_mutate_it(tmp_path: Path) -> None:
    from ghostgpu.controller.ops import restore_workload

    h = Harness(tmp_path, mode="enforce")
    h.add("done", table=FINISHED)
    await h.polls(4)
    ref = WorkloadRef("Deployment", NS, "done")
    assert h.replicas("done") == 0
    assert h.objects[ref]["metadata"]["annotations"]["ghostgpu.io/reclaimed-from-replicas"] == "1"
    # a LocalQueue `default` appeared since: clearing the record would make Kueue add queue-name
    h.cluster.would_mutate.add("done")
    patches = len(h.cluster.patches)
    done = await restore_workload(h.cluster, ref, ReplicaLedger(h.cluster, LEDGER[0]))  # type: ignore[arg-type]
    assert done.replicas == 1 and h.replicas("done") == 1
    assert len(h.cluster.patches) == patches, "no metadata write"
    assert ("done", "Restored") in h.cluster.events


async def test_a_restart_keeps_the_recorded_verdicts_through_its_warm_up(tmp_path: Path) -> None:
    """A controller that (re)starts has empty windows: its first polls are warm-up UNKNOWNs. They
    must not overwrite the verdicts the previous controller recorded, nor write anything at all
    (at 10,000 workloads that was 20,000 requests per restart)."""
    h = Harness(tmp_path)
    evidence = '{"reasons":["utilization-nonzero"]}'
    h.add("busy", util=80.0, ann={"ghostgpu.io/verdict": "ACTIVE", "ghostgpu.io/evidence": evidence})
    h.add("done", table=FINISHED, ann={"ghostgpu.io/verdict": "ACTIVE", "ghostgpu.io/evidence": evidence})
    await h.polls(2)
    assert (h.verdict("busy"), h.verdict("done")) == ("ACTIVE", "ACTIVE")
    assert h.cluster.patches == [] and h.cluster.events == []
    await h.polls(1)  # window full (K = 3): real verdicts, written only where they changed
    assert (h.verdict("busy"), h.verdict("done")) == ("ACTIVE", "FINISHED_IDLE")
    assert [n for n, _ in h.cluster.events if n in ("busy", "done")] == ["done", "done"]
    assert {ref.name for ref, _, _ in h.cluster.patches} == {"done"}


async def test_progress_moves_with_each_workload_written(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.add("broken", util=SignalFailure(reason=FailureReason.HTTP_ERROR))
    h.add("done", table=FINISHED)
    seen: list[float | None] = []
    original = h.rec.actor.apply

    async def apply(*args: object, **kwargs: object) -> str:
        seen.append(h.rec.last_progress)
        h.clock += 7  # each write takes time
        return await original(*args, **kwargs)  # type: ignore[arg-type]

    h.rec.actor.apply = apply  # type: ignore[method-assign]
    await h.polls(3)  # K = 3: the third poll writes both first verdicts
    assert len(seen) == 2 and seen[1] is not None
    assert h.rec.last_progress is not None and h.rec.last_progress > seen[1]


async def test_verdict_writes_overlap_but_stay_bounded_and_ordered_per_workload(tmp_path: Path) -> None:
    """The first verdicts of a fleet are one write each: a few in flight at once (not one after
    another, not one task per workload), each workload's annotations before its Event."""
    from ghostgpu.controller.act.actor import WRITE_CONCURRENCY

    h = Harness(tmp_path)
    names = [f"w{i:02d}" for i in range(3 * WRITE_CONCURRENCY)]
    for name in names:
        h.add(name, util=SignalFailure(reason=FailureReason.HTTP_ERROR))  # UNKNOWN: recorded
    in_flight, peak, order = 0, 0, []
    patch, event = h.cluster.patch_annotations, h.cluster.event

    async def slow_patch(ref: WorkloadRef, ann: Any, **kw: Any) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)  # a round trip
        in_flight -= 1
        order.append(("patch", ref.name))
        return await patch(ref, ann, **kw)

    async def logged_event(involved: Any, **kw: Any) -> None:
        order.append(("event", involved["metadata"]["name"]))
        await event(involved, **kw)

    h.cluster.patch_annotations = slow_patch  # type: ignore[method-assign]
    h.cluster.event = logged_event  # type: ignore[method-assign]
    await h.polls(3)  # K = 3: every workload's first verdict
    assert {h.verdict(n) for n in names} == {"UNKNOWN"}
    assert 1 < peak <= WRITE_CONCURRENCY
    for name in names:
        assert order.index(("patch", name)) < order.index(("event", name))


async def test_a_busy_workload_is_planned_again_only_when_its_objects_or_verdict_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workload its window keeps settling, with the same cached objects, keeps last poll's plan
    (at 50,000 pods, plan() and the recorded-verdict reads were a per-workload cost of every poll);
    a new verdict or a new object (an annotation written by anyone) is planned again."""
    h = Harness(tmp_path)
    h.add("busy", util=80.0)
    planned: list[str] = []
    real_plan = planner_module.plan

    def counting_plan(wl: Any, *args: Any, **kwargs: Any) -> Any:
        planned.append(wl.ref.name)
        return real_plan(wl, *args, **kwargs)

    monkeypatch.setattr(planner_module, "plan", counting_plan)
    snap = h.snapshot()  # the watch caches' objects: the same ones while nothing changes
    for _ in range(5):
        result = await h.rec.poll_once(snap)
        h.clock += 60
    # warm-up UNKNOWN (polls 1-2: planned once), then ACTIVE from poll 3 on (planned once)
    assert planned == ["busy", "busy"]
    assert result.judged[WorkloadRef("Deployment", NS, "busy")].verdict.kind.value == "ACTIVE"
    assert h.cluster.patches == []
    # someone leaves a stale finding on it: a new object, planned again, and ACTIVE written back
    h.objects[WorkloadRef("Deployment", NS, "busy")]["metadata"]["annotations"].update(
        {"ghostgpu.io/verdict": "FINISHED_IDLE", "ghostgpu.io/evidence": '{"reasons":["no-processes"]}'}
    )
    await h.rec.poll_once(h.snapshot())
    assert planned == ["busy"] * 3
    assert h.verdict("busy") == "ACTIVE"
    assert [ref.name for ref, _, _ in h.cluster.patches] == ["busy"]


async def test_every_failed_signal_is_counted_once_per_poll(tmp_path: Path) -> None:
    """ghostgpu_signal_failures_total: one per failed utilization reading (per pod), process
    listing and artifact measurement in each poll; working signals count nothing."""
    h = Harness(tmp_path)
    h.add("busy", util=80.0)
    h.add("broken", util=SignalFailure(reason=FailureReason.HTTP_ERROR))
    h.add("hidden", table=ExecFailed(FailureReason.FORBIDDEN, "no exec"))
    h.add("writer", table=FINISHED, ann={"ghostgpu.io/artifacts": "file:///data/ckpt"})

    async def measure(pod: PodRef, target: Any) -> SignalFailure:
        return SignalFailure(reason=FailureReason.TIMEOUT)

    h.rec.observer.files.measure = measure  # type: ignore[method-assign]
    await h.polls(4)  # window 3: process listings in polls 3-4; artifacts from the first zero on

    def failures(signal: str, reason: FailureReason) -> float:
        return h.metrics.signal_failures.labels(signal, reason.value)._value.get()

    assert failures("utilization", FailureReason.HTTP_ERROR) == 4
    assert failures("processes", FailureReason.FORBIDDEN) == 2
    assert failures("artifacts", FailureReason.TIMEOUT) == 4
    assert failures("utilization", FailureReason.MISSING) == 0


async def test_deleted_workloads_and_opted_out_namespaces_are_forgotten(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    for name in ("a", "b"):
        h.add(name, util=80.0)
    await h.polls(2)
    ref_a, ref_b = (WorkloadRef("Deployment", NS, n) for n in ("a", "b"))
    assert set(h.rec.states) == {ref_a, ref_b}
    del h.objects[ref_b]
    h.pods[:] = [p for p in h.pods if p["metadata"]["labels"]["app"] != "b"]
    await h.polls(1)
    assert set(h.rec.states) == {ref_a} and len(h.rec.states[ref_a].ring) == 3
    h.namespaces[NS] = {}  # opted out
    await h.polls(1)
    assert h.rec.states == {}
