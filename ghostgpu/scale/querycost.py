"""What the poll's one query costs the bench's Prometheus, and what the node agent costs it in
series (`ghostgpu bench scale`, measured at each N after the controller's runs).

- **Query time**: the controller's own query (`build_query` with the spec `signal_sources` makes,
  in agent mode and in exec mode) and the utilization expression alone, sent in turn, `rounds`
  times each, the best wall time of each kept: the machine is shared, and the best of a few is
  the figure least moved by what else runs. Each query names the clock of the moment it is sent,
  as a poll does (a stale clock would make every sample read ahead). The agent-mode query is
  timed as every poll after the first sends it (the agent's series of the pods read idle the
  poll before, by name: the idle pods of the fleet) and as the first poll sends it (of every pod
  at zero).
- **Series**: the agent's per-container series in Prometheus, by container, split into the
  utilization-idle containers and the busy ones; and Prometheus's head series in all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import httpx

from ghostgpu.config import ControllerConfig
from ghostgpu.promql import label_matchers
from ghostgpu.signals.agent import TRACKED_NAMESPACE, TRACKED_POD
from ghostgpu.signals.prometheus import PrometheusClient
from ghostgpu.signals.utilization import FIELD_LABEL, PodKey, QuerySpec, build_query, poll_query

# The names of query_seconds' entries: the utilization expression alone, the poll's query without
# the agent's parts (what exec mode sends: utilization, sample age, GPU memory, XIDs), the poll's
# query in agent mode (every poll after the first), and the first poll's.
UTILIZATION, WITHOUT_AGENT, POLL, FIRST_POLL = "utilization", "without_agent", "poll", "first_poll"


def controller_spec(controller: ControllerConfig, process_source: str) -> QuerySpec:
    """The QuerySpec the controller builds for this config (controller.app.signal_sources)."""
    from ghostgpu.controller.app import signal_sources

    cfg = controller.model_copy(update={"process_source": process_source})
    client = PrometheusClient("http://127.0.0.1:1")
    try:
        return signal_sources(cfg, client, executor=None).utilization.spec  # type: ignore[arg-type]
    finally:
        asyncio.run(client.aclose())


def utilization_alone(query: str) -> str:
    """The poll query's first part, the pods' readings (`"util"`), on its own."""
    head = query.split(f', "{FIELD_LABEL}", "util", "", "")', 1)[0]
    return head + f', "{FIELD_LABEL}", "util", "", "")'


def steady_query(
    spec: QuerySpec,
    controller: ControllerConfig,
    pods: Sequence[PodKey],
    idle: Collection[PodKey],
    now: float,
) -> str:
    """The query a poll after the first sends (UtilizationSource): the agent's series of the pods
    read idle the poll before, by name, while the query fits controller.prometheus.maxQueryBytes."""
    return poll_query(
        spec, list(pods), now=now, agent_pods=frozenset(idle), max_bytes=controller.prometheus.max_query_bytes
    )[0]


def query_seconds(
    prom_url: str,
    controller: ControllerConfig,
    pods: Sequence[PodKey],
    idle: Collection[PodKey],
    *,
    rounds: int = 3,
    timeout: float = 300.0,
) -> dict[str, float]:
    """Best wall seconds of each query over `rounds` rounds (see the module); `idle`: the pods at
    zero."""
    agent, exec_ = controller_spec(controller, "agent"), controller_spec(controller, "exec")
    builders: dict[str, Callable[[float], str]] = {
        UTILIZATION: lambda now: utilization_alone(build_query(exec_, pods, now=now)),
        WITHOUT_AGENT: lambda now: build_query(exec_, pods, now=now),
        POLL: lambda now: steady_query(agent, controller, pods, idle, now),
        FIRST_POLL: lambda now: build_query(agent, pods, now=now),
    }
    best = {name: float("inf") for name in builders}
    with httpx.Client(timeout=timeout) as client:
        for _ in range(rounds):
            for name, build in builders.items():
                query = build(time.time())
                t0 = time.monotonic()
                r = client.post(f"{prom_url}/api/v1/query", data={"query": query})
                elapsed = time.monotonic() - t0
                r.raise_for_status()
                best[name] = min(best[name], elapsed)
    return {name: round(s, 3) for name, s in best.items()}


def agent_series(
    prom_url: str, controller: ControllerConfig, idle: Callable[[tuple[str, str]], bool]
) -> dict[str, Any]:
    """The agent's per-container series Prometheus holds, per container: all, the busy ones'
    (`idle` false: utilization over zero) and the idle ones'."""
    source = label_matchers(controller.metrics.agent_source)
    query = (
        f"count by ({TRACKED_NAMESPACE}, {TRACKED_POD}) "
        f'({{__name__=~"ghostgpu_agent_container_.+", {source}}})'
    )
    r = httpx.post(f"{prom_url}/api/v1/query", data={"query": query}, timeout=300)
    r.raise_for_status()
    busy: list[float] = []
    held: list[float] = []
    for item in r.json()["data"]["result"]:
        m = item["metric"]
        pod = (m.get(TRACKED_NAMESPACE, ""), m.get(TRACKED_POD, ""))
        (held if idle(pod) else busy).append(float(item["value"][1]))

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 3) if xs else None

    return {
        "containers": len(busy) + len(held),
        "series": int(sum(busy) + sum(held)),
        "per_container": mean(busy + held),
        "per_busy_container": mean(busy),
        "per_idle_container": mean(held),
    }


def head_series(prom_url: str) -> float | None:
    """Prometheus's own count of the series in its head block (`prometheus_tsdb_head_series`)."""
    text = httpx.get(f"{prom_url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("prometheus_tsdb_head_series "):
            return float(line.split()[1])
    return None
