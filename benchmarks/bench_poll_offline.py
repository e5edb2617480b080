"""The controller's CPU per steady poll at fleet scale, offline: no cluster, no Prometheus.

Drives the real `Reconciler.poll_once` (agent mode, shadow, the bench's controller section:
`ghostgpu.scale.bench.controller_config`) over N one-pod workloads, bare pods (the scale bench's
fleet) or Deployments. What is real:

- the snapshot: `app.Informers.snapshot` over stores filled with the real watch transforms
  (`inventory.cached_pod`, `workload_from`, `keys.namespace_view`, the slim node);
- the Prometheus side: the controller's own `PrometheusClient` (httpx, streamed POST, the size
  cap) and `iter_answer`, over an `httpx.MockTransport` that answers with the body Prometheus
  writes for the agent-mode query on the bench's fleet (`scale/exporter.py`): one `util` series per
  pod; for each idle pod (every `--idle-stride`-th) its `fb` series and the node agent's `proc`
  and `scan` series of its container, as the agent prints them for `fleet.IDLE_TABLE`. The body of
  each poll is rendered before the poll, outside the measurement;
- the GC settings of `app.run_controller` (freeze, generation-0 threshold 50,000, a collection
  and a freeze after each poll, outside the measurement).

The kube side is a small in-memory cluster: a verdict annotation written to a pod or Deployment is
seen by the next poll's snapshot (as the watch would deliver it), so the fleet reaches its steady
state after the window fills.

Measured: `time.process_time()` around `poll_once` for each steady poll (after `--warmup` polls,
default window + 2), and around the app's whole cycle (`cycle`: `Informers.snapshot`, the poll,
`accounting_from` with no ClusterQueues, the collection after the poll). `--rooms` adds the CPU
per poll of each room's step. Run it niced on a shared machine, from the work tree (so that
`ghostgpu` is imported from it):

    PYTHONPATH=. nice -n 19 python benchmarks/bench_poll_offline.py --pods 10000 50000 --polls 5
    PYTHONPATH=. nice -n 19 python benchmarks/bench_poll_offline.py --pods 50000 --polls 3 --rooms
    PYTHONPATH=. nice -n 19 python benchmarks/bench_poll_offline.py --pods 50000 --profile poll.prof
    PYTHONPATH=. nice -n 19 python benchmarks/bench_poll_offline.py --pods 10000 --kind deployment
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import cProfile
import gc
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from ghostgpu.agent.exporter import live_roles, role_series
from ghostgpu.config import load_config_text
from ghostgpu.controller import keys
from ghostgpu.controller.app import (
    Informers,
    LoadedConfig,
    _slim_node,
    dra_extended_aliases,
    signal_sources,
)
from ghostgpu.controller.books.accounting import FlavorSpec
from ghostgpu.controller.books.books import accounting_from, untracked_of
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.inventory import WorkloadRef, cached_pod, gpu_predicate, workload_from
from ghostgpu.controller.kube import NotFound
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.reconciler import Reconciler
from ghostgpu.scale.bench import controller_config
from ghostgpu.scale.fleet import IDLE_TABLE, OPT_IN, FleetSpec, node_body
from ghostgpu.signals.agent import (
    PROGRAMS_LABEL,
    TRACKED_CONTAINER,
    TRACKED_NAMESPACE,
    TRACKED_POD,
    TRACKED_UID,
)
from ghostgpu.signals.artifacts import FileArtifactProbe
from ghostgpu.signals.podexec import ExecFailed
from ghostgpu.signals.processes import parse_ps
from ghostgpu.signals.prometheus import PrometheusClient
from ghostgpu.signals.utilization import FIELD_LABEL
from ghostgpu.verdict import FailureReason, ProcessPolicy, count_roles

PROM_URL = "http://prometheus.offline:9090"
T0 = 1_800_000_000.0
CONTAINER = "main"


def loaded_config(window: int) -> LoadedConfig:
    doc = controller_config(PROM_URL, window, "agent")
    whole = load_config_text(yaml.safe_dump(doc), "bench")
    flavors = [FlavorSpec(f.name, f.resource, dict(f.node_labels)) for f in whole.flavors if f.resource]
    return LoadedConfig(whole.controller, flavors)


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def pod_object(spec: FleetSpec, i: int, kind: str) -> dict[str, Any]:
    ns, name = spec.namespace(i), spec.pod(i)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{i:06d}",
        "resourceVersion": "1",
        "creationTimestamp": iso(T0 - 3600),
        "labels": {"ghostgpu.io/tracked": "true", "ghostgpu.io/scale-fleet": "true"},
    }
    if kind == "deployment":
        meta["name"] = f"{name}-7d9f8c6b5-x2x2x"
        meta["labels"] = {"app": name, "pod-template-hash": "7d9f8c6b5"}
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-7d9f8c6b5", "uid": f"rs-{i}",
             "controller": True}
        ]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": spec.node_of(i),
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": CONTAINER,
                    "image": "registry.local/train:fake",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
        "status": {"phase": "Running", "startTime": iso(T0 - 3600), "podIP": "10.0.0.1"},
    }


def deployment_object(spec: FleetSpec, i: int) -> dict[str, Any]:
    name = spec.pod(i)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": spec.namespace(i),
            "uid": f"dep-{i:06d}",
            "resourceVersion": "1",
            "creationTimestamp": iso(T0 - 3600),
            "labels": {"ghostgpu.io/tracked": "true"},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": CONTAINER, "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    ]
                },
            },
        },
    }


class Fleet:
    """The cluster: raw objects and the watch stores the snapshot reads."""

    def __init__(self, loaded: LoadedConfig, n: int, kind: str, idle_stride: int) -> None:
        cfg = loaded.controller
        known = [f.resource for f in loaded.flavors or [] if f.device_class is None]
        self.is_gpu = gpu_predicate(known, dra_extended_aliases(cfg))
        self.flavors = loaded.flavors or []
        self.spec = FleetSpec(idle_fraction=1 / idle_stride)
        self.kind = kind
        self.n = n
        self.informers = Informers(None, self.is_gpu)
        for ns in self.spec.namespace_names():
            obj = {"metadata": {"name": ns, "labels": dict(OPT_IN)}}
            self.informers.namespaces.store[("", ns)] = keys.namespace_view(obj)
        for j in range((n + 7) // 8):
            node = node_body(self.spec, j)
            self.informers.nodes.store[("", node["metadata"]["name"])] = _slim_node(node)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        for i in range(n):
            pod = pod_object(self.spec, i, kind)
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            self.pods[key] = pod
            self.informers.pods.store[key] = cached_pod(pod, self.is_gpu)
            if kind == "deployment":
                dep = deployment_object(self.spec, i)
                dkey = (dep["metadata"]["namespace"], dep["metadata"]["name"])
                self.deployments[dkey] = dep
                self.informers.deployments.store[dkey] = workload_from("Deployment", dep, self.is_gpu)

    def snapshot(self) -> Any:
        return self.informers.snapshot(self.flavors)

    # What the watch would deliver after a write.
    def updated(self, ref: WorkloadRef) -> None:
        key = (ref.namespace, ref.name)
        if ref.kind == "Pod":
            self.informers.pods.store[key] = cached_pod(self.pods[key], self.is_gpu)
        else:
            self.informers.deployments.store[key] = workload_from(
                "Deployment", self.deployments[key], self.is_gpu
            )


class OfflineCluster:
    """The kube.Cluster calls a shadow-mode poll makes: reads, verdict annotations, Events."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.field_manager = "ghostgpu-bench"
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0
        self.events = 0

    def _obj(self, ref: WorkloadRef) -> dict[str, Any]:
        src = self.fleet.pods if ref.kind == "Pod" else self.fleet.deployments
        obj = src.get((ref.namespace, ref.name))
        if obj is None:
            raise NotFound(str(ref))
        return obj

    async def get(self, ref: WorkloadRef) -> dict[str, Any]:
        return copy.deepcopy(self._obj(ref))

    async def patch_annotations(self, ref: WorkloadRef, ann: Any, *, resource_version: Any = None,
                                current: Any = None) -> dict[str, Any]:  # fmt: skip
        obj = self._obj(ref)
        meta = obj["metadata"]
        have = meta.setdefault("annotations", {})
        for k, v in ann.items():
            if v is None:
                have.pop(k, None)
            else:
                have[k] = v
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.writes += 1
        self.fleet.updated(ref)
        return copy.deepcopy(obj)

    async def event(self, involved: Any, *, reason: str, message: str, type_: str = "Normal") -> None:
        self.events += 1

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.configmaps.get((namespace, name)))

    async def create_configmap(self, namespace: str, name: str, data: Any, *, labels: Any = None) -> dict:
        self.configmaps[(namespace, name)] = {
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "data": dict(data),
        }
        return copy.deepcopy(self.configmaps[(namespace, name)])

    async def replace_configmap(self, obj: Any) -> dict:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        self.configmaps[key] = copy.deepcopy(dict(obj))
        return copy.deepcopy(self.configmaps[key])

    async def list(self, rtype: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return []


class NoExec:
    async def run(self, pod: Any, argv: Any, *, timeout: float) -> Any:
        raise ExecFailed(FailureReason.FORBIDDEN, "no exec in agent mode")


class Answers:
    """What Prometheus answers to the poll's query on the bench's fleet, rendered per poll."""

    def __init__(self, fleet: Fleet) -> None:
        counts = count_roles(parse_ps(IDLE_TABLE), ProcessPolicy())
        self.idle_roles = role_series(counts)
        self.idle_live = live_roles(counts)
        self.fleet = fleet
        self.body = b""
        self.requests = 0

    def render(self, now: float) -> None:
        spec, items = self.fleet.spec, []
        value = [round(now, 3), ""]
        for i in range(self.fleet.n):
            ns, pod_name = spec.namespace(i), self.fleet.spec.pod(i)
            if self.fleet.kind == "deployment":
                pod_name = f"{pod_name}-7d9f8c6b5-x2x2x"
            idle = spec.idle(i)
            items.append(
                {"metric": {FIELD_LABEL: "util", "namespace": ns, "pod": pod_name},
                 "value": [value[0], "0" if idle else "87"]}
            )  # fmt: skip
            if not idle:
                continue
            items.append(
                {"metric": {FIELD_LABEL: "fb", "namespace": ns, "pod": pod_name}, "value": [value[0], "0"]}
            )
            tracked = {
                TRACKED_CONTAINER: CONTAINER,
                TRACKED_NAMESPACE: ns,
                TRACKED_POD: pod_name,
                TRACKED_UID: f"uid-{i:06d}",
            }
            for role, n, programs in self.idle_roles:
                labels = {FIELD_LABEL: "proc", PROGRAMS_LABEL: programs, "role": role, **tracked}
                items.append({"metric": labels, "value": [value[0], str(n)]})
            scan = {FIELD_LABEL: "scan", "live_roles": self.idle_live, **tracked}
            items.append({"metric": scan, "value": [value[0], f"{now - 5:.3f}"]})
        self.body = orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": items}})

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return httpx.Response(200, content=self.body, headers={"Content-Type": "application/json"})


async def run(n: int, args: argparse.Namespace) -> dict[str, Any]:
    loaded = loaded_config(args.window)
    cfg = loaded.controller
    fleet = Fleet(loaded, n, args.kind, args.idle_stride)
    answers = Answers(fleet)
    prom = PrometheusClient(
        cfg.prometheus.url,
        timeout=cfg.prometheus.timeout.seconds,
        client=httpx.AsyncClient(transport=httpx.MockTransport(answers.handler)),
    )
    sources = signal_sources(cfg, prom, NoExec())  # type: ignore[arg-type]
    cluster = OfflineCluster(fleet)
    clock = [T0]
    tmp = tempfile.TemporaryDirectory()
    rec = Reconciler(
        cfg,
        cluster=cluster,  # type: ignore[arg-type]
        utilization=sources.utilization,
        processes=sources.processes,
        files=FileArtifactProbe(NoExec()),  # type: ignore[arg-type]
        s3=None,
        metrics=ControllerMetrics(),
        decision_log=DecisionLog(Path(tmp.name) / "decisions.jsonl"),
        clock=lambda: clock[0],
    )
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)
    warmup = args.warmup if args.warmup is not None else args.window + 2
    times: list[float] = []
    cycles: list[float] = []  # snapshot + poll + accounting + collection
    profiler = cProfile.Profile() if args.profile else None
    rooms: dict[str, float] = {}
    steady = False
    if args.rooms:

        def timed(owner: Any, name: str, label: str) -> None:
            fn = getattr(owner, name)

            def add(t0: float) -> None:
                if steady:
                    rooms[label] = rooms.get(label, 0.0) + time.process_time() - t0

            if asyncio.iscoroutinefunction(fn):

                async def wrapped_async(*a: Any, **kw: Any) -> Any:
                    t0 = time.process_time()
                    try:
                        return await fn(*a, **kw)
                    finally:
                        add(t0)

                setattr(owner, name, wrapped_async)
            else:

                def wrapped(*a: Any, **kw: Any) -> Any:
                    t0 = time.process_time()
                    try:
                        return fn(*a, **kw)
                    finally:
                        add(t0)

                setattr(owner, name, wrapped)

        # Nested: gather includes the utilization query and its parsing; keep the books' two parts.
        timed(rec.observer, "eligible", "observe: eligible")
        timed(rec.observer, "gather", "observe: gather (with the query)")
        timed(rec.observer.utilization, "poll", "  of which the query and its answer")
        timed(rec.judge, "judge", "judge")
        timed(rec.actor.stops, "guard_reverts", "act: revert guard")
        timed(rec.actor, "act", "act")
        timed(rec.books.decision_log, "record_poll", "books: decision log")
        timed(rec.books, "accrue", "books: gauges and GPU-hours")
    states: dict[str, int] = {}
    for k in range(warmup + args.polls):
        answers.render(clock[0])
        steady = k >= warmup
        c0 = time.process_time()
        snap = fleet.snapshot()
        c1 = time.process_time()
        if steady and profiler is not None:
            profiler.enable()
        t0 = time.process_time()
        result = await rec.poll_once(snap)
        elapsed = time.process_time() - t0
        if steady and profiler is not None:
            profiler.disable()
        # The rest of app.run_controller's cycle: the accounting (no ClusterQueues here) and the
        # collection of what the poll left.
        c2 = time.process_time()
        accounting_from(fleet.flavors, snap, [], result.judged, result.pods_of, untracked_of(snap, result))
        states = dict(result.states)
        del snap
        result = None
        gc.collect()
        gc.freeze()
        if steady:
            times.append(elapsed)
            cycles.append(c1 - c0 + elapsed + time.process_time() - c2)
        clock[0] += cfg.poll_interval.seconds
        print(f"  N={n} poll {k + 1}{'' if steady else ' (warm-up)'}: {elapsed:.3f} s CPU", file=sys.stderr)
    await prom.aclose()
    tmp.cleanup()
    if profiler is not None:
        out = args.profile if len(args.pods) == 1 else f"{args.profile}.{n}"
        profiler.dump_stats(out)
        pstats.Stats(out).sort_stats("cumulative").print_stats(args.profile_lines)
    gc.unfreeze()
    gc.collect()
    return {
        "pods": n,
        "best_s": round(min(times), 3),
        "median_s": round(statistics.median(times), 3),
        "us_per_workload": round(min(times) / n * 1e6, 1),
        "cycle_best_s": round(min(cycles), 3),
        "cycle_median_s": round(statistics.median(cycles), 3),
        "states": states,
        "writes": cluster.writes,
        "requests": answers.requests,
        "rooms_s_per_poll": {k: round(v / len(times), 3) for k, v in rooms.items()},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, nargs="+", default=[10_000, 50_000])
    p.add_argument("--polls", type=int, default=5, help="steady polls measured (>= 3)")
    p.add_argument("--warmup", type=int, default=None, help="polls before measuring (default window + 2)")
    p.add_argument("--window", type=int, default=5, help="controller.window (the scale bench's default)")
    p.add_argument("--kind", choices=("pod", "deployment"), default="pod")
    p.add_argument("--idle-stride", type=int, default=50, help="every k-th pod idle (the bench: 2 %%)")
    p.add_argument("--profile", default=None, help="cProfile the steady polls into this file")
    p.add_argument("--profile-lines", type=int, default=40)
    p.add_argument("--rooms", action="store_true", help="CPU per poll of each room's step too")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    results = [asyncio.run(run(n, args)) for n in args.pods]
    if args.json:
        print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
        return
    print(
        f"{'pods':>7} {'best s':>8} {'median s':>9} {'µs/workload':>12} {'cycle best/median s':>20}  states"
    )
    for r in results:
        print(
            f"{r['pods']:>7} {r['best_s']:>8.3f} {r['median_s']:>9.3f} "
            f"{r['us_per_workload']:>12.1f} {r['cycle_best_s']:>9.3f}/{r['cycle_median_s']:<10.3f} "
            f"{r['states']}"
        )
        for room, t in r["rooms_s_per_poll"].items():
            print(f"        {room:<40} {t:.3f} s")


if __name__ == "__main__":
    main()
