"""Orchestration of `ghostgpu bench scale`: one local control plane, a fleet grown to each N in
turn, and at each N the controller (probe.py) in agent mode and in exec mode, and the naive
baseline (naive.py), each measured in its own process against the same pods, metrics and
Prometheus."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from ghostgpu.controller.app import CONTROLLER_USER_AGENT
from ghostgpu.devcluster import procs
from ghostgpu.devcluster.cluster import DevCluster
from ghostgpu.devcluster.nodes import GpuNodeSpec
from ghostgpu.devcluster.paths import REPO_ROOT
from ghostgpu.scale import backends, sessions
from ghostgpu.scale.exporter import SCRAPE_INTERVAL, start_metrics
from ghostgpu.scale.fleet import (
    GPUS_PER_NODE,
    FleetSpec,
    KubeHTTP,
    ensure_base,
    ensure_session_execs,
    grow_pods,
    pod_uids,
)
from ghostgpu.signals.utilization import PodKey, QuerySpec, every_signal_query

# The controller's two process sources, measured in this order at each N: agent mode (the
# default of a new render) is the `ghostgpu` side of every table, exec mode keeps a row of its own.
PROCESS_SOURCES = ("agent", "exec")

Log = Callable[[str], None]


@dataclass
class Side:
    """Per-poll cost of one implementation at one N (steady-state medians; peak RSS is the max)."""

    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    prometheus_queries: float
    apiserver_requests: float
    exec_calls: float
    polls: int
    extrapolated_from: int | None = None  # naive only: pods actually visited per run
    # ghostgpu only: process CPU from one poll's end to the next one's, i.e. the poll plus what the
    # process does between polls (post-poll GC, watch events, the health server). `cpu_s` is the
    # poll alone (first snapshot to the accounting); the CPU target is checked against both.
    cycle_cpu_s: float | None = None
    # ghostgpu only: steady writes per poll (the budgeted requests but exec), what "requests <=
    # 5 + writes" allows beyond the 5.
    writes: float | None = None


@dataclass
class IdleSessionsRun:
    """The agent-mode controller again with `controller.idleSessions` on (sessions.py), against the
    same fleet, right after the run without it: its steady poll, what the history read cost it and
    Prometheus, and what the ladder said."""

    side: Side
    sessions: int  # idle-session pods in the fleet (IDLE_HELD when the verdict is reached)
    policy: dict[str, Any]  # controller.idleSessions as the bench set it
    states: dict[str, int] = field(default_factory=dict)  # the last poll's verdicts
    # sessions.steady_history: history queries per poll and their wall time in the controller, the
    # act room's wall time, the candidates and the ladder's steps.
    history: dict[str, Any] = field(default_factory=dict)
    # sessions.history_cost: the history query timed against the bench's Prometheus (best of 3):
    # the ladder's, a stop's re-read, and the default policy's (3 h, lookback 8 h).
    cost: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)  # decision-log rows by action
    polls: list[dict[str, Any]] = field(default_factory=list)
    series_age_s: float | None = None  # how long the sessions' series existed at the run's start


@dataclass
class SizeResult:
    n: int
    idle: int
    nodes: int
    ghostgpu: Side
    naive: Side
    warmup: list[dict[str, Any]] = field(default_factory=list)  # the controller's first polls
    states: dict[str, int] = field(default_factory=dict)
    server_side: dict[str, float] = field(default_factory=dict)
    # The floor of one poll, measured in the same run on the same machine (floor_of_poll): CPU
    # seconds to parse one Prometheus answer with the reading, oldest sample time and GPU memory of
    # all N pods (3 series per pod, fixed whatever the controller's query asks) and map each sample.
    floor_s: float | None = None
    # Beside it, labelled apart: the same with the node agent's series of every pod's container.
    floor_agent_s: float | None = None
    # The bench's Prometheus at this N (querycost.py): best wall seconds of the poll's query in
    # agent mode, without the agent's parts, and of the utilization expression alone; the agent's
    # series per container; Prometheus's head series.
    query_s: dict[str, float] = field(default_factory=dict)
    agent_series: dict[str, Any] = field(default_factory=dict)
    prometheus_series: float | None = None
    # The first-verdict poll (poll K) against the apiserver budget, client and server side.
    first_verdict: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    # Every poll of the controller as the probe measured it, and its start-up (cache sync) figures:
    # the raw rows behind the medians, kept in --json-out so the docs cite the command's output.
    polls: list[dict[str, Any]] = field(default_factory=list)
    startup: dict[str, Any] = field(default_factory=dict)
    # The same controller with `processSource: exec` (ps exec'd into each idle candidate), started
    # after the agent-mode run against the same fleet; its last poll's verdict states beside it.
    exec_mode: Side | None = None
    exec_states: dict[str, int] = field(default_factory=dict)
    # The store every figure above was measured against, and per backend (--backend, that one
    # first) the agent-mode controller against it (ghostgpu.scale.backends).
    backend: str = "prometheus"
    backends: dict[str, backends.BackendResult] = field(default_factory=dict)
    # `--idle-sessions`: the run with controller.idleSessions on (None: not measured).
    idle_sessions: IdleSessionsRun | None = None

    @property
    def idle_sessions_extra_cpu_s(self) -> float | None:
        """The steady cycle's CPU with idle sessions on less the same run's without them."""
        i, a = self.idle_sessions, self.ghostgpu
        if i is None or i.side.cycle_cpu_s is None or a.cycle_cpu_s is None:
            return None
        return round(i.side.cycle_cpu_s - a.cycle_cpu_s, 4)

    @property
    def idle_sessions_floor_ratio(self) -> float | None:
        i = self.idle_sessions
        if i is None or i.side.cycle_cpu_s is None or not self.floor_s:
            return None
        return i.side.cycle_cpu_s / self.floor_s

    @property
    def exec_cpu_per_candidate_s(self) -> float | None:
        """What exec mode's steady cycle costs beyond agent mode's, per idle candidate (one exec
        each): the price of the process signal by exec, beside the compiled client's exec floor."""
        e, a = self.exec_mode, self.ghostgpu
        if e is None or e.cycle_cpu_s is None or a.cycle_cpu_s is None or not self.idle:
            return None
        return (e.cycle_cpu_s - a.cycle_cpu_s) / self.idle

    @property
    def floor_ratio(self) -> float | None:
        """The controller's steady CPU per poll-to-poll cycle as a multiple of the floor."""
        cycle = self.ghostgpu.cycle_cpu_s
        return cycle / self.floor_s if cycle is not None and self.floor_s else None

    def ratio(self, attr: str) -> float | None:
        mine, theirs = getattr(self.ghostgpu, attr), getattr(self.naive, attr)
        return theirs / mine if mine else None


@dataclass
class BenchConfig:
    sizes: Sequence[int] = (100, 1000, 10000, 50000)
    nodes: int = 0  # 0: enough 8-GPU nodes for the largest fleet (6,250 for 50,000 pods)
    idle_fraction: float = 0.02
    window: int = 5
    steady_polls: int = 3
    naive_polls: int = 2
    naive_sample: int = 1000
    state_dir: Path = Path("/tmp/ghostgpu-scale")
    keep_cluster: bool = False
    # The controller's apiserver budget (controller.apiserver; the bench keeps the defaults).
    qps: float = 20.0
    burst: int = 30
    # The metrics stores measured (ghostgpu.scale.backends): the first in full, the others again.
    backends: Sequence[str] = ("prometheus",)
    # Idle sessions (sessions.py): a share of the idle pods are idle Jupyter sessions, every
    # controller run keeps longWindow = window (so they reach IDLE_HELD within the run), and the
    # agent-mode controller runs once more with controller.idleSessions on. Off: the fleet and the
    # runs are as they were, so earlier results stay comparable.
    idle_sessions: bool = False
    session_fraction: float = 0.5
    session_after_s: int = sessions.SessionPolicy().after_s
    session_warn_before_s: int = sessions.SessionPolicy().warn_before_s

    @property
    def session_policy(self) -> sessions.SessionPolicy:
        return sessions.SessionPolicy(after_s=self.session_after_s, warn_before_s=self.session_warn_before_s)

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = max(1, -(-max(self.sizes) // GPUS_PER_NODE))


# Writes and exec at Metadata level, nothing else: what the controller's budget governs.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources: [{group: "", resources: [pods/exec]}]
  - level: None
    verbs: [get, list, watch]
  - level: Metadata
"""


def floor_of_poll(body: bytes, pods: Sequence[tuple[str, str]], *, repeat: int = 5) -> float:
    """The least a poll that reads every signal can do: parse one Prometheus answer for all N pods
    (orjson) and map each sample to its pod. CPU seconds of this thread, best of `repeat`.

    With the garbage collector off: the answer's 150,000 new dicts at N = 50,000 set off collections
    that scan whatever else the bench process holds: with it on, the same work measured 0.20-0.47 s
    offline by the size of an unrelated heap (0.42-0.59 s in earlier bench runs); 0.18 s with it off."""
    best = float("inf")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.thread_time()
            by_pod: dict[tuple[str, str], list[float]] = {p: [] for p in pods}
            for item in orjson.loads(body)["data"]["result"]:
                m = item["metric"]
                values = by_pod.get((m.get("namespace", ""), m.get("pod", "")))
                if values is not None:
                    values.append(float(item["value"][1]))
            best = min(best, time.thread_time() - t0)
            del by_pod
    finally:
        if was_enabled:
            gc.enable()
    return best


def audit_requests(path: Path, t0: float, t1: float) -> dict[str, list[float]]:
    """Receive times (epoch s) of the audited requests (writes and exec) between t0 and t1, by
    user agent, each request once (a long-running exec has two audit events). Lease writes are
    kept apart (`<agent> leases`): leader election is outside the budget by design."""
    out: dict[str, list[float]] = {}
    seen: set[str] = set()
    # the file and any rotated parts (audit-<time>.log) beside it
    for part in sorted(path.parent.glob(f"{path.stem}*{path.suffix}")):
        _read_audit(part, t0, t1, seen, out)
    return out


def _read_audit(path: Path, t0: float, t1: float, seen: set[str], out: dict[str, list[float]]) -> None:
    with path.open("rb") as f:
        for line in f:
            ev = orjson.loads(line)
            if ev.get("auditID") in seen:
                continue
            seen.add(ev.get("auditID"))
            ts = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if t0 <= ts <= t1:
                agent = str(ev.get("userAgent", ""))
                if (ev.get("objectRef") or {}).get("resource") == "leases":
                    agent += " leases"
                out.setdefault(agent, []).append(ts)


def budget_check(times: Sequence[float], qps: float) -> dict[str, float]:
    """How close a request stream came to a token bucket: `peak_burst` is the largest
    count(i..j) - qps * (t_j - t_i) over all runs i..j (at most `burst` when the budget held; the
    server's receive times add network jitter), `max_per_s` the most requests in any 1 s."""
    ts = sorted(times)
    peak = 0.0
    best = float("-inf")  # max over i <= j of qps * t_i - i
    lo = 0
    max_per_s = 0
    for j, t in enumerate(ts):
        best = max(best, qps * t - j)
        peak = max(peak, (j + 1) - qps * t + best)
        while t - ts[lo] >= 1.0:
            lo += 1
        max_per_s = max(max_per_s, j - lo + 1)
    span = ts[-1] - ts[0] if ts else 0.0
    return {
        "requests": len(ts),
        "span_s": round(span, 3),
        "peak_burst": round(peak, 2),
        "max_per_s": max_per_s,
        "mean_per_s": round(len(ts) / span, 2) if span else float(len(ts)),
    }


def controller_config(
    prom_url: str,
    window: int,
    process_source: str = "agent",
    backend: str | None = None,
    *,
    long_window: int | None = None,
    idle_sessions: sessions.SessionPolicy | None = None,
) -> dict[str, Any]:
    """examples/ghostgpu.yaml (flavors known, so no Kueue discovery per poll) with the controller
    section the bench needs: shadow mode, a 1 s poll interval, no start-up grace, and the process
    source measured (agent: the exporter's agent series; exec: kwok answers `ps` with the fleet's
    tables). With idle sessions in the fleet, `long_window` (the window: IDLE_HELD is reached at
    the first verdict, not after 30 polls) and, for one run, `controller.idleSessions`."""
    doc = yaml.safe_load((REPO_ROOT / "examples" / "ghostgpu.yaml").read_text())
    doc["controller"] = {
        **(doc.get("controller") or {}),
        "mode": "shadow",
        "processSource": process_source,
        "pollInterval": "1s",
        "startupGrace": "1s",
        "window": window,
        "prometheus": {"url": prom_url, "timeout": "60s"},
        # The bench's Prometheus scrapes every SCRAPE_INTERVAL (exporter.start_metrics).
        "metrics": {**(doc.get("controller") or {}).get("metrics", {}), "scrapeInterval": SCRAPE_INTERVAL},
    }
    if long_window is not None:
        doc["controller"]["longWindow"] = long_window
    if idle_sessions is not None:
        doc["controller"]["idleSessions"] = idle_sessions.config()
    return backends.with_backend(dict(doc), backend or backends.backend_at(prom_url))


async def _apiserver_exec_total(kube: KubeHTTP) -> float:
    r = await kube.client.get("/metrics")
    r.raise_for_status()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in r.text.splitlines()
        if line.startswith("apiserver_request_total{") and 'subresource="exec"' in line
    )


def _wait_series(prom_url: str, n: int, log: Log, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    have = -1.0
    while time.monotonic() < deadline:
        r = httpx.get(f"{prom_url}/api/v1/query", params={"query": "count(DCGM_FI_DEV_GPU_UTIL)"}, timeout=30)
        if r.status_code == 200:
            res = r.json()["data"]["result"]
            have = float(res[0]["value"][1]) if res else 0.0
            if have >= n:
                log(f"[bench] the metrics store holds {have:.0f} utilization series")
                return
        time.sleep(2)
    raise TimeoutError(f"the metrics store has {have:.0f} of {n} series after {timeout:.0f}s")


def _run(argv: list[str], log_file: Path, timeout: float) -> None:
    with log_file.open("ab") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[2]} exited {proc.returncode}; see {log_file}")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


POLL_KEYS = (
    "poll",
    "wall_s",
    "cpu_s",
    "process_cpu_s",
    "gc_s",
    "rss_mib",
    "peak_rss_mib",
    "prometheus_queries",
    "apiserver_requests",
    "exec_calls",
    "lease_requests",
    "budgeted_requests",
    "states",
)


def poll_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probe's rows, reduced to the figures the docs cite (missing keys are left out)."""
    return [{k: r[k] for k in POLL_KEYS if k in r} for r in rows]


def summarise_controller(rows: list[dict[str, Any]], window: int) -> tuple[Side, list[dict[str, Any]]]:
    """Polls 1..window+1 are warm-up: polls 1..window-1 fill the windows (their warm-up UNKNOWN is
    not written), poll `window` records the first real verdict of every new workload (a dry-run,
    the write and an Event each); later polls are the steady state."""
    warm, steady = rows[: window + 1], rows[window + 1 :]
    if not steady:
        raise ValueError("no steady-state polls measured")
    med = lambda k: statistics.median(r[k] for r in steady)  # noqa: E731
    prev = rows[window : len(rows) - 1]  # each steady poll's predecessor
    cycles = [b["process_cpu_s"] - a["process_cpu_s"] for a, b in zip(prev, steady, strict=True)]
    side = Side(
        wall_s=med("wall_s"),
        cpu_s=med("cpu_s"),
        peak_rss_mib=max(r["peak_rss_mib"] for r in rows),
        prometheus_queries=med("prometheus_queries"),
        apiserver_requests=med("apiserver_requests"),
        exec_calls=med("exec_calls"),
        polls=len(steady),
        cycle_cpu_s=round(statistics.median(cycles), 4),
        writes=statistics.median(r.get("budgeted_requests", 0) - r["exec_calls"] for r in steady),
    )
    keep = (
        "poll",
        "wall_s",
        "cpu_s",
        "peak_rss_mib",
        "prometheus_queries",
        "apiserver_requests",
        "exec_calls",
    )
    return side, [{k: r[k] for k in keep} for r in warm]


def summarise_naive(rows: list[dict[str, Any]], n: int) -> Side:
    visited = rows[0]["visited"]
    scale = n / visited if visited else 1.0
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    return Side(
        wall_s=med("wall_s") * scale,
        cpu_s=med("cpu_s") * scale,
        peak_rss_mib=max(r["peak_rss_mib"] for r in rows),
        # the pod list is one paginated call whatever the sample; per-pod work scales
        prometheus_queries=med("prometheus_queries") * scale,
        apiserver_requests=(med("apiserver_requests") - med("exec_calls")) + med("exec_calls") * scale,
        exec_calls=med("exec_calls") * scale,
        polls=len(rows),
        extrapolated_from=visited if visited < n else None,
    )


async def _bench(cfg: BenchConfig, log: Log) -> list[SizeResult]:
    state = cfg.state_dir
    state.mkdir(parents=True, exist_ok=True)
    spec = FleetSpec(
        nodes=cfg.nodes,
        idle_fraction=cfg.idle_fraction,
        session_fraction=cfg.session_fraction if cfg.idle_sessions else 0.0,
    )
    cluster = DevCluster.up(
        state / "cluster",
        nodes=[GpuNodeSpec(name="cpu-0", gpus=0)],
        addons=(),
        log=log,
        audit_policy=AUDIT_POLICY,
    )
    fleet_file = state / "fleet.json"
    fleet_file.write_text("[]")
    metric_procs, exporter_url, prom_url = start_metrics(
        state, fleet_file, scrape_interval=SCRAPE_INTERVAL, cadvisor=cfg.idle_sessions
    )
    kube = KubeHTTP(cluster.state.server, Path(cluster.state.state_dir) / "pki")
    stores = backends.Stores(state, exporter_url, metric_procs[-1], prom_url, log)
    results: list[SizeResult] = []
    try:
        procs.wait_for(
            "prometheus", lambda: httpx.get(f"{prom_url}/-/ready", timeout=2).status_code == 200, 60
        )
        procs.wait_for(
            "exporter", lambda: httpx.get(f"{exporter_url}/healthz", timeout=2).status_code == 200, 30
        )
        await ensure_base(kube, spec, state / "ps-table.txt", log=log)
        created = 0
        for n in sorted(cfg.sizes):
            await grow_pods(kube, spec, created, n, log=log)
            if cfg.idle_sessions:
                made = await ensure_session_execs(kube, spec, created, n, state / "session-table.txt")
                log(f"[fleet] {made} idle sessions answer `ps` with the session's processes")
            created = n
            uids = await pod_uids(kube)
            rows = [fleet_row(spec, i, uids, sessions=cfg.idle_sessions) for i in range(n)]
            fleet_file.write_text(json.dumps(rows))
            httpx.post(f"{exporter_url}/reload", timeout=120).raise_for_status()
            loaded_at = time.time()
            prom_url = stores.use(cfg.backends[0], SCRAPE_INTERVAL)
            _wait_series(prom_url, n, log)
            res = await _measure(cfg, spec, n, cluster, kube, prom_url, log, loaded_at=loaded_at)
            res.floor_s, res.floor_agent_s = await asyncio.to_thread(_floor, cfg, spec, n, prom_url)
            log(f"[bench] N={n}: floors of one poll {res.floor_s:.4f} s, {res.floor_agent_s:.4f} s CPU")
            await asyncio.to_thread(_prometheus_cost, res, cfg, spec, prom_url)
            log(f"[bench] N={n}: query seconds {res.query_s}, agent series {res.agent_series}")
            if res.idle_sessions is not None:
                res.idle_sessions.cost = await asyncio.to_thread(_history_cost, cfg, spec, n, prom_url)
                log(f"[bench] N={n}: the idle-session history query {res.idle_sessions.cost}")
            results.append(res)
            res.backends = await backends.measure_backends(
                cfg.backends,
                stores,
                res,
                spec,
                SCRAPE_INTERVAL,
                wait_series=partial(_wait_series, n=n, log=log),
                controller_run=partial(_controller_run, cfg, n, "agent", cluster, kube, log=log),
                controller_config=partial(controller_config, window=cfg.window),
            )
            log(f"[bench] N={n}: {json.dumps(asdict(results[-1]))}")
    finally:
        await kube.aclose()
        stores.stop()
        for p in reversed(metric_procs):
            procs.stop(p)
        if not cfg.keep_cluster:
            cluster.down()
    return results


def fleet_row(spec: FleetSpec, i: int, uids: dict[tuple[str, str], str], *, sessions: bool) -> list[Any]:
    """Pod i as the exporter serves it: [namespace, pod, node, utilization, uid], and with idle
    sessions in the bench a sixth field, 1 for an idle session (exporter.py)."""
    row: list[Any] = [
        spec.namespace(i),
        spec.pod(i),
        spec.node_of(i),
        0 if spec.idle(i) else 20 + (i * 37) % 80,
        uids[(spec.namespace(i), spec.pod(i))],
    ]
    return [*row, int(spec.session(i))] if sessions else row


def _session_policy(cfg: BenchConfig, *, on: bool) -> sessions.SessionPolicy | None:
    """controller.idleSessions of one run: the bench's policy, or with sessions in the fleet the
    same turned off (the runs beside it), or the example config's own (no sessions: it reads
    nothing, and earlier results stay comparable)."""
    if not cfg.idle_sessions:
        return None
    return cfg.session_policy if on else cfg.session_policy.off()


def _controller(cfg: BenchConfig, prom_url: str, *, idle_sessions: bool = False) -> Any:
    from ghostgpu.config import ControllerConfig

    doc = controller_config(prom_url, cfg.window, idle_sessions=cfg.session_policy if idle_sessions else None)
    return ControllerConfig.model_validate(doc["controller"])


def _history_cost(cfg: BenchConfig, spec: FleetSpec, n: int, prom_url: str) -> dict[str, dict[str, Any]]:
    controller = _controller(cfg, prom_url, idle_sessions=True)
    pods = [(spec.namespace(i), spec.pod(i)) for i in range(n) if spec.session(i)]
    return sessions.history_cost(prom_url, controller, pods, cfg.session_policy)


def _floor(cfg: BenchConfig, spec: FleetSpec, n: int, prom_url: str) -> tuple[float, float]:
    """The floor: the reading, oldest sample time and GPU memory of the N tracked pods (3 series
    per pod: every_signal_query), answered by the same Prometheus; parsing and mapping that answer.
    A fixed amount of work, not the controller's own query: the controller asks for about one
    series per pod, and a floor that shrank with it would make a smaller answer look like a slower
    controller; nor one that grows with the series a design adds. Beside it, labelled apart, the
    same with the node agent's series of every pod's container (every_signal_query(agent=True))."""
    controller = _controller(cfg, prom_url)
    qspec = QuerySpec.from_preset(
        controller.metrics.active,
        max_sample_age=controller.stale_after.seconds,
        zero_threshold=controller.zero_threshold,
        window=2 * controller.metrics.scrape_interval.seconds,
        agent_source=controller.metrics.agent_source,
    )
    pods = [PodKey(spec.namespace(i), spec.pod(i)) for i in range(n)]
    floors = []
    for agent in (False, True):
        query = every_signal_query(qspec, pods, agent=agent)
        body = httpx.post(f"{prom_url}/api/v1/query", data={"query": query}, timeout=300).content
        floors.append(round(floor_of_poll(body, pods), 5))
    return floors[0], floors[1]


def _prometheus_cost(res: SizeResult, cfg: BenchConfig, spec: FleetSpec, prom_url: str) -> None:
    from ghostgpu.scale import querycost

    controller = _controller(cfg, prom_url)
    pods = [PodKey(spec.namespace(i), spec.pod(i)) for i in range(res.n)]
    idle = {PodKey(spec.namespace(i), spec.pod(i)) for i in range(res.n) if spec.idle(i)}
    res.query_s = querycost.query_seconds(prom_url, controller, pods, idle)
    res.agent_series = querycost.agent_series(prom_url, controller, idle.__contains__)
    res.prometheus_series = querycost.head_series(prom_url)


@dataclass
class _ControllerRun:
    side: Side
    warmup: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    startup: dict[str, Any]
    first_verdict: dict[str, Any]
    budget: dict[str, Any]
    server_side: dict[str, float]


async def _controller_run(
    cfg: BenchConfig,
    n: int,
    source: str,
    cluster: DevCluster,
    kube: KubeHTTP,
    prom_url: str,
    log: Log,
    backend: str | None = None,
    idle_sessions: bool = False,
) -> _ControllerRun:
    """The controller, started fresh, for window + 1 + steady polls with the given process source
    (and, `idle_sessions`, with controller.idleSessions on)."""
    state = cfg.state_dir
    backend = backend or backends.backend_at(prom_url)
    tag = (
        f"{n}-{source}"
        + ("" if backend == "prometheus" else f"-{backend}")
        + ("-idle" if idle_sessions else "")
    )
    conf = state / f"ghostgpu-{tag}.yaml"
    doc = controller_config(
        prom_url,
        cfg.window,
        source,
        backend,
        long_window=cfg.window if cfg.idle_sessions else None,
        idle_sessions=_session_policy(cfg, on=idle_sessions),
    )
    conf.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = state / f"controller-{tag}.jsonl"
    out.unlink(missing_ok=True)
    prom_port = int(prom_url.rsplit(":", 1)[1])
    q0, e0 = backends.queries_served(prom_url), await _apiserver_exec_total(kube)
    polls = cfg.window + 1 + cfg.steady_polls
    with_idle = " with idle sessions" if idle_sessions else ""
    log(f"[bench] N={n}: controller in {source} mode{with_idle}, {polls} polls")
    argv = [sys.executable, "-m", "ghostgpu.scale.probe", f"--config={conf}"]
    argv += [f"--kubeconfig={cluster.kubeconfig}", f"--polls={polls}", f"--out={out}"]
    argv += [f"--prom-port={prom_port}", f"--port={procs.free_port()}"]
    decisions = state / f"decisions-{tag}.jsonl"
    decisions.unlink(missing_ok=True)  # the log appends: a re-run in the same state dir reads its own
    argv += [f"--decision-log={decisions}"]
    t0 = time.time()
    await asyncio.to_thread(_run, argv, state / "probe.log", 3600)
    t1 = time.time()
    q1, e1 = backends.queries_served(prom_url), await _apiserver_exec_total(kube)
    crows = _rows(out)
    failures = [(r["poll"], r.get("process_failures")) for r in crows if r.get("process_failures")]
    log(f"[bench] N={n}: {source} mode, process-signal failures (poll, reason: count): {failures or 'none'}")
    side, warm = summarise_controller(crows, cfg.window)
    first = crows[cfg.window - 1] if len(crows) >= cfg.window else {}
    first_verdict = {
        "poll": first.get("poll"),
        "wall_s": first.get("wall_s"),
        "apiserver_requests": first.get("apiserver_requests"),
        "budgeted_requests": first.get("budgeted_requests"),
        # the least time those requests take at the budget's rate once the burst is spent
        "seconds_at_budget": round(max(0, (first.get("budgeted_requests") or 0) - cfg.burst) / cfg.qps, 2),
    }
    by_agent = audit_requests(Path(cluster.state_dir) / "logs" / "audit.log", t0, t1)
    budget = {
        "qps": cfg.qps,
        "burst": cfg.burst,
        "window": [round(t0, 3), round(t1, 3)],
        "audited_by_user_agent": {ua: len(ts) for ua, ts in sorted(by_agent.items())},
        "controller": budget_check(by_agent.get(CONTROLLER_USER_AGENT, []), cfg.qps),
    }
    return _ControllerRun(
        side=side,
        warmup=warm,
        rows=crows,
        startup=json.loads(out.with_suffix(".startup.json").read_text()),
        first_verdict=first_verdict,
        budget=budget,
        server_side={
            "controller_prometheus_queries_total": q1 - q0,
            "controller_exec_total": e1 - e0,
            "controller_polls": len(crows),
        },
    )


async def _measure(
    cfg: BenchConfig,
    spec: FleetSpec,
    n: int,
    cluster: DevCluster,
    kube: KubeHTTP,
    prom_url: str,
    log: Log,
    backend: str | None = None,
    loaded_at: float | None = None,
) -> SizeResult:
    state = cfg.state_dir
    backend = backend or backends.backend_at(prom_url)
    agent = await _controller_run(cfg, n, "agent", cluster, kube, prom_url, log, backend)
    idle_run = None
    if cfg.idle_sessions:
        idle_run = await _idle_sessions_run(cfg, spec, n, cluster, kube, prom_url, log, backend, loaded_at)
    exec_ = await _controller_run(cfg, n, "exec", cluster, kube, prom_url, log, backend)
    nout = state / f"naive-{n}.jsonl"
    nout.unlink(missing_ok=True)
    sample = cfg.naive_sample if n > cfg.naive_sample else None
    log(
        f"[bench] N={n}: naive baseline, {cfg.naive_polls} runs"
        + (f" on a {sample}-pod sample" if sample else "")
    )
    argv = [sys.executable, "-m", "ghostgpu.scale.naive", f"--kubeconfig={cluster.kubeconfig}"]
    argv += [f"--prometheus={prom_url}", f"--polls={cfg.naive_polls}", f"--out={nout}"]
    argv += [f"--sample={sample}"] if sample else []
    await asyncio.to_thread(_run, argv, state / "naive.log", 3600)
    theirs = summarise_naive(_rows(nout), n)
    return SizeResult(
        n=n,
        idle=spec.idle_count(n),
        nodes=spec.nodes,
        ghostgpu=agent.side,
        naive=theirs,
        warmup=agent.warmup,
        states=agent.rows[-1]["states"],
        polls=poll_rows(agent.rows),
        startup=agent.startup,
        first_verdict=agent.first_verdict,
        budget=agent.budget,
        server_side=agent.server_side,
        exec_mode=exec_.side,
        exec_states=exec_.rows[-1]["states"],
        backend=backend,
        idle_sessions=idle_run,
    )


IDLE_POLL_KEYS = (
    "history_queries",
    "history_reads",
    "history_wall_s",
    "idle_tend_wall_s",
    "idle_candidates",
    "idle_steps",
)


async def _idle_sessions_run(
    cfg: BenchConfig,
    spec: FleetSpec,
    n: int,
    cluster: DevCluster,
    kube: KubeHTTP,
    prom_url: str,
    log: Log,
    backend: str,
    loaded_at: float | None,
) -> IdleSessionsRun:
    """The agent-mode controller with idle sessions on. It starts once the sessions' series have
    existed for after + warnBefore and two scrapes more, so that the ladder's windows (and a stop's
    re-read) are covered, as they are in a cluster that ran for hours: a thin series would stop
    the ladder at an unknown rung, which would measure less of it."""
    policy = cfg.session_policy
    scrape = float(SCRAPE_INTERVAL.rstrip("s"))
    if loaded_at is not None:
        wait = loaded_at + policy.full_s + 2 * scrape - time.time()
        if wait > 0:
            log(f"[bench] N={n}: waiting {wait:.0f} s for {policy.full_s} s of the sessions' series")
            await asyncio.sleep(wait)
    age = round(time.time() - loaded_at, 1) if loaded_at is not None else None
    run = await _controller_run(cfg, n, "agent", cluster, kube, prom_url, log, backend, idle_sessions=True)
    history = sessions.steady_history(run.rows, cfg.window)
    tag = f"{n}-agent" + ("" if backend == "prometheus" else f"-{backend}") + "-idle"
    decisions = sessions.decision_actions(cfg.state_dir / f"decisions-{tag}.jsonl")
    log(f"[bench] N={n}: idle sessions: {history}; decision log {decisions}")
    return IdleSessionsRun(
        side=run.side,
        sessions=spec.session_count(n),
        policy=policy.config(),
        states=run.rows[-1]["states"],
        history=history,
        decisions=decisions,
        polls=[
            {**row, **{k: r[k] for k in IDLE_POLL_KEYS if k in r}}
            for row, r in zip(poll_rows(run.rows), run.rows, strict=True)
        ],
        series_age_s=age,
    )


def run_scale(
    cfg: BenchConfig, log: Log = lambda m: print(m, file=sys.stderr, flush=True)
) -> list[SizeResult]:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return asyncio.run(_bench(cfg, log))


def to_json(results: Sequence[SizeResult], cfg: BenchConfig) -> dict[str, Any]:
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "results": [asdict(r) for r in results],
    }


def from_json(data: dict[str, Any]) -> list[SizeResult]:
    out = []
    for r in data["results"]:
        r = dict(r)
        r["ghostgpu"], r["naive"] = Side(**r["ghostgpu"]), Side(**r["naive"])
        if r.get("exec_mode") is not None:
            r["exec_mode"] = Side(**r["exec_mode"])
        if r.get("idle_sessions") is not None:
            r["idle_sessions"] = IdleSessionsRun(
                **{**r["idle_sessions"], "side": Side(**r["idle_sessions"]["side"])}
            )
        r["backends"] = {
            k: backends.BackendResult(**{**b, "ghostgpu": Side(**b["ghostgpu"])})
            for k, b in r.get("backends", {}).items()
        }
        out.append(SizeResult(**r))
    return out
