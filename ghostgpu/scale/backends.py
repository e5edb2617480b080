"""The metrics stores `ghostgpu bench scale --backend` measures the controller against: Prometheus
(exporter.start_metrics starts it) and VictoriaMetrics' single-node server
(ghostgpu.devcluster.victoriametrics), each scraping the same exporter with the same scrape
configuration.

One store runs at a time: at each N the first backend gets the whole measurement (agent and exec
mode, the naive baseline, the floor), every other one the agent-mode controller again, its poll's
query timed, and its verdict states beside the first one's. A store that is not measured is
stopped, so the one measured has the machine to itself (at 50,000 pods each ingests about 600,000
series every scrape interval)."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from ghostgpu.devcluster import procs
from ghostgpu.devcluster.paths import Toolchain
from ghostgpu.devcluster.victoriametrics import METRICS_STORES, PROMETHEUS, VICTORIAMETRICS
from ghostgpu.devcluster.victoriametrics import argv as vm_argv
from ghostgpu.devcluster.victoriametrics import scrape_config as vm_scrape_config
from ghostgpu.signals.prometheus import QUERY_PARAMS

BACKENDS = METRICS_STORES
MAX_SCRAPE_SIZE = "-promscrape.maxScrapeSize=2GiB"
Log = Callable[[str], None]

# What each store needs beyond the controller's defaults (controller.prometheus): VictoriaMetrics
# shows a sample to queries up to about 4 s after the scrape (docs/victoriametrics.md).
PROMETHEUS_SETTINGS: dict[str, dict[str, str]] = {PROMETHEUS: {}, VICTORIAMETRICS: {"ingestDelay": "5s"}}

# Queries served, from each store's own /metrics: Prometheus labels the handler, VictoriaMetrics
# the path.
_QUERIES = re.compile(
    r'^(?:prometheus_http_requests_total\{[^}]*handler="/api/v1/query"[^}]*\}'
    r'|vm_http_requests_total\{[^}]*path="/api/v1/query"[^}]*\}) (\S+)$'
)
_RSS = re.compile(r"^process_resident_memory_bytes (\S+)$")

# Which store serves each URL the bench started (Stores.use): the controller's config for a URL
# carries what that store needs (bench.controller_config).
_SERVING: dict[str, str] = {}


def backend_at(url: str) -> str:
    """The store the bench runs at `url`; Prometheus for any other URL."""
    return _SERVING.get(url, PROMETHEUS)


def parse_backends(text: str) -> tuple[str, ...]:
    """`prometheus,victoriametrics` -> the backends in the order given (the first is measured in
    full). Raises ValueError naming an unknown or repeated one."""
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if not names or unknown:
        raise ValueError(f"{', '.join(unknown) or 'none given'}: expected some of {', '.join(BACKENDS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{text!r}: a backend is named twice")
    return names


def queries_served(url: str) -> float:
    """The store's count of instant queries answered so far."""
    return queries_in(httpx.get(f"{url}/metrics", timeout=10).text)


def queries_in(exposition: str) -> float:
    """Instant queries answered, from a store's own /metrics (either store's spelling)."""
    return sum(float(m.group(1)) for line in exposition.splitlines() if (m := _QUERIES.match(line)))


def store_rss_mib(url: str) -> float | None:
    """The store's resident memory now, from its own /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = [float(m.group(1)) for line in text.splitlines() if (m := _RSS.match(line))]
    return round(found[0] / 2**20, 1) if found else None


def with_backend(controller_config: dict[str, Any], backend: str) -> dict[str, Any]:
    """The bench's controller config (bench.controller_config) with what `backend` needs."""
    doc = dict(controller_config)
    ctrl = dict(doc["controller"])
    ctrl["prometheus"] = {**ctrl["prometheus"], **PROMETHEUS_SETTINGS[backend]}
    doc["controller"] = ctrl
    return doc


def time_query(url: str, query: str, repeat: int = 3) -> float:
    """Median seconds for the store to answer `query` (sent as the controller sends it)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/api/v1/query", data={"query": query, **QUERY_PARAMS}, timeout=300)
        r.raise_for_status()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


@dataclass
class BackendResult:
    """The agent-mode controller against one store at one N."""

    backend: str
    ghostgpu: Any  # bench.Side (typed there: bench imports this module)
    states: dict[str, int] = field(default_factory=dict)  # the last poll's verdict states
    query_s: float | None = None  # the poll's query (build_query, agent mode), answered by the store
    store_rss_mib: float | None = None  # the store's resident memory after the run


class Stores:
    """The stores of the bench, one running at a time. Prometheus comes started (with the argv
    exporter.start_metrics gave it, read back from /proc to restart it the same way); VictoriaMetrics
    starts on first use, on a port of its own, with its data kept across restarts."""

    def __init__(
        self, state: Path, exporter_url: str, prometheus: procs.ProcessRecord, prometheus_url: str, log: Log
    ) -> None:
        self.state, self.log = state, log
        self.logs = state / "logs"
        self.exporter_port = int(exporter_url.rsplit(":", 1)[1])
        self.argv = {PROMETHEUS: _cmdline(prometheus.pid)}
        self.names = {PROMETHEUS: prometheus.name, VICTORIAMETRICS: "scale-victoriametrics"}
        self.running: dict[str, procs.ProcessRecord] = {PROMETHEUS: prometheus}
        self.urls = {PROMETHEUS: prometheus_url}

    def use(self, backend: str, scrape_interval: str) -> str:
        """Stop every other store, start `backend`'s if it is not running; its URL once ready."""
        for other in [b for b in self.running if b != backend]:
            self.log(f"[bench] stopping {other}")
            procs.stop(self.running.pop(other))
        if backend not in self.running:
            self.log(f"[bench] starting {backend}")
            self.running[backend] = procs.start(
                self.names[backend], self._argv(backend, scrape_interval), self.logs
            )
        url = self.urls[backend]
        _SERVING[url] = backend
        procs.wait_for(
            backend,
            lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200,
            300,
            self.running[backend],
        )
        return url

    def stop(self) -> None:
        for rec in self.running.values():
            procs.stop(rec)
        self.running.clear()

    def _argv(self, backend: str, scrape_interval: str) -> list[str]:
        if backend in self.argv:
            return self.argv[backend]
        from ghostgpu.scale.exporter import prometheus_config

        port = procs.free_port()
        cfg = self.state / "victoriametrics-scrape.yml"
        cfg.write_text(
            yaml.safe_dump(
                vm_scrape_config(prometheus_config(self.exporter_port, scrape_interval)), sort_keys=True
            )
        )
        binary = Toolchain.locate().victoriametrics
        # The bench's one exporter serves the whole fleet (a real one serves a node): at 10,000
        # pods its agent page is over the 16 MB a scrape may bring by default.
        self.argv[backend] = vm_argv(binary, cfg, self.state / "victoriametrics", port, MAX_SCRAPE_SIZE)
        self.urls[backend] = f"http://127.0.0.1:{port}"
        return self.argv[backend]


def _cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def backends_markdown(results: Sequence[Any]) -> str:
    """Per N and backend: the agent-mode controller's steady poll, the poll's query as the store
    answers it, the store's memory, and whether its verdict states are the first backend's."""
    head = (
        "| N | backend | poll wall (s) | CPU/cycle (s) | peak RSS (MiB) | queries/poll | query (s) "
        "| store RSS (MiB) | verdict states |\n|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for r in results:
        first = None
        # The store measured in full first (a saved run's JSON keeps its keys sorted).
        for name in sorted(r.backends, key=lambda k: (k != r.backend, k)):
            b = r.backends[name]
            first = b.states if first is None else first
            same = "same as first" if b.states == first else f"DIFFER: {b.states}"
            side = b.ghostgpu
            rows.append(
                f"| {r.n:,} | {name} | {side.wall_s:.3f} | {side.cycle_cpu_s or 0:.3f} | "
                f"{side.peak_rss_mib:.0f} | {side.prometheus_queries:g} | {_num(b.query_s)} | "
                f"{_num(b.store_rss_mib, '.0f')} | {same if b.states is not first else _states(b.states)} |"
            )
    return "\n".join(rows) + "\n"


def _num(v: float | None, fmt: str = ".3f") -> str:
    return "—" if v is None else format(v, fmt)


def _states(states: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(states.items()))


def store_figures(
    url: str, controller_config: dict[str, Any], spec: Any, n: int
) -> tuple[float, float | None]:
    """(the controller's poll query timed against the store, the store's RSS): the query the
    controller built from `controller_config` (agent mode) for the fleet's N pods (FleetSpec), as
    every poll after the first sends it (the idle pods' agent series, by name)."""
    from ghostgpu.config import ControllerConfig
    from ghostgpu.controller.app import signal_sources
    from ghostgpu.scale.querycost import steady_query
    from ghostgpu.signals.prometheus import PrometheusClient
    from ghostgpu.signals.utilization import PodKey

    ctrl = ControllerConfig.model_validate(controller_config["controller"])
    qspec = signal_sources(ctrl, PrometheusClient(url), executor=None).utilization.spec  # type: ignore[arg-type]
    pods = [PodKey(spec.namespace(i), spec.pod(i)) for i in range(n)]
    idle = [p for i, p in enumerate(pods) if spec.idle(i)]
    return time_query(url, steady_query(qspec, ctrl, pods, idle, time.time())), store_rss_mib(url)


async def measure_backends(
    names: Sequence[str],
    stores: Stores,
    first: Any,
    spec: Any,
    scrape_interval: str,
    *,
    wait_series: Callable[[str], None],
    controller_run: Callable[[str], Awaitable[Any]],
    controller_config: Callable[[str], dict[str, Any]],
) -> dict[str, BackendResult]:
    """Per backend: the first one's figures from `first` (bench.SizeResult, measured in full against
    it), each other one's from the agent-mode controller run again against it; each store's poll
    query timed and its memory read right after its run."""
    head, *others = names
    url = stores.use(head, scrape_interval)
    out = {
        head: BackendResult(
            head, first.ghostgpu, first.states, *store_figures(url, controller_config(url), spec, first.n)
        )
    }
    for name in others:
        url = stores.use(name, scrape_interval)
        wait_series(url)
        run = await controller_run(url)
        figures = store_figures(url, controller_config(url), spec, first.n)
        out[name] = BackendResult(name, run.side, run.rows[-1]["states"], *figures)
    return out
