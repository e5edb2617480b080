"""Idle sessions in the scale bench (`ghostgpu bench scale --idle-sessions`, docs/idle-sessions.md).

A share of the fleet's idle pods are idle Jupyter sessions (fleet.SESSION_TABLE): 0 % on the GPU, a
notebook server and its kernel asleep. The controller's verdict calls them IDLE_HELD, and with
`controller.idleSessions` on it reads their history each poll (signals/idle_history.py) and climbs
the evidence ladder. For the ladder to get real data, the bench's metrics source serves what a
cluster would give it for such a pod:

- the node agent's idle-session facts (agent/idle_facts.py), as the agent's own collector prints
  them for the same processes: `newest_start_seconds{class="notebook"}`, `running`, `tty_wakeups`;
- cAdvisor's `container_cpu_usage_seconds_total` of every pod's container, as a scrape of its own
  (job `kubelet`, `metrics_path="/metrics/cadvisor"`: the default `idleSessions.cpuSource`, which
  is the only scrape the history reads CPU from): a busy pod's counter grows with its utilization,
  an idle pod's stands still.

Mode `shadow`: the ladder runs every poll and says what enforce would do (would warn, would stop)
without writing, so the fleet stays the same for every run at every N; enforce would annotate, send
Events and stop the sessions, and the next run would measure a different fleet.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from ghostgpu.agent.cgroups import ContainerRef
from ghostgpu.agent.idle_facts import IdleFacts, idle_facts
from ghostgpu.agent.procfs import HostProcess
from ghostgpu.config import ControllerConfig
from ghostgpu.scale.fleet import SESSION_TABLE
from ghostgpu.signals.idle_history import AGENT, CPU_METRIC, history_query
from ghostgpu.signals.processes import parse_ps

# The scrape the bench's Prometheus reads cAdvisor from: kube-prometheus-stack's kubelet job and
# path label, which the default `idleSessions.cpuSource` names.
CPU_JOB, CPU_PATH = "kubelet", "/metrics/cadvisor"
CADVISOR_PATH = "/cadvisor/metrics"  # the exporter's path serving it
# A pod's container CPU counter at the reload (seconds): any value, it only has to be the same
# at every scrape of an idle pod.
CPU_BASE_S = 3600.0


class SessionPolicy(BaseModel):
    """`controller.idleSessions` as the bench sets it. `after` is short (the afterBounds lowered to
    allow it) so that the bench's Prometheus, which holds only the minutes since the fleet was
    loaded, covers the whole window and the ladder reaches its end (would warn, would stop) rather
    than stopping at a thin series; the default policy's query (3 h, 8 h lookback) is timed apart
    (`history_cost`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: str = "shadow"
    after_s: int = 60
    warn_before_s: int = 30

    @property
    def full_s(self) -> int:
        """after + warnBefore: the longest window the ladder reads (a stop's re-read)."""
        return self.after_s + self.warn_before_s

    def off(self) -> SessionPolicy:
        """The same policy switched off: the run beside it, without idle sessions. (The example
        config the bench starts from sets `shadow`, which in a fleet with no idle session runs
        nothing; with sessions in the fleet it would read their history, so it is turned off.)"""
        return self.model_copy(update={"mode": "off"})

    def config(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "after": f"{self.after_s}s",
            "warnBefore": f"{self.warn_before_s}s",
            "afterBounds": {"min": f"{min(self.after_s, 1800)}s", "max": "168h"},
        }


# The default policy's windows (idle_policy.IdleSessionsConfig: after 3h, warnBefore 1h), for the
# history query as a production controller sends it.
DEFAULT_AFTER_S, DEFAULT_WARN_BEFORE_S = 3 * 3600, 3600


def session_processes(uid: str) -> list[HostProcess]:
    """SESSION_TABLE as the node agent's scan reads it (procfs.HostProcess): asleep, no terminal,
    no CPU since the kernel started (a kernel that computed would be busy on the CPU rung)."""
    ref = ContainerRef(uid, "session")
    return [
        HostProcess(
            pid=p.pid,
            ppid=p.ppid or 0,
            nspid=(p.pid,),
            container=ref,
            stat=p.state,
            elapsed_s=p.elapsed_s or 0,
            args=p.command,
        )
        for p in parse_ps(SESSION_TABLE)
    ]


def session_facts() -> IdleFacts:
    """The agent's own idle-session facts of SESSION_TABLE (agent/idle_facts.py)."""
    facts = idle_facts(session_processes("uid"))
    if facts is None:
        raise ValueError("SESSION_TABLE names no idle-session class")
    return facts


FACTS = ("newest_start_seconds", "running", "tty_wakeups", "monitor_cpu_seconds", "frontend_cpu_seconds")


def facts_lines(labels: str, facts: IdleFacts, scanned_at: float) -> dict[str, str]:
    """One container's idle-session series by family (FACTS), as IdleFactsCollector prints them
    for a scan at `scanned_at` (the youngest process's start: the scan's time less its age)."""
    cls = facts.session_class.value
    lines = {
        "newest_start_seconds": f'{AGENT}newest_start_seconds{{{labels},class="{cls}"}} '
        f"{scanned_at - facts.newest_start_age_s}",
        "running": f"{AGENT}running{{{labels}}} {facts.running}",
        "tty_wakeups": f"{AGENT}tty_wakeups{{{labels}}} {facts.tty_wakeups}",
    }
    if facts.monitor_cpu_s is not None:
        lines["monitor_cpu_seconds"] = f"{AGENT}monitor_cpu_seconds{{{labels}}} {facts.monitor_cpu_s}"
    if facts.frontend_cpu_s is not None:
        lines["frontend_cpu_seconds"] = f"{AGENT}frontend_cpu_seconds{{{labels}}} {facts.frontend_cpu_s}"
    return lines


def facts_exposition(per_container: Sequence[Mapping[str, str]]) -> list[str]:
    """The families' lines, each family's samples together under its TYPE line."""
    out: list[str] = []
    for family in FACTS:
        samples = [c[family] for c in per_container if family in c]
        if samples:
            out += [f"# TYPE {AGENT}{family} gauge", *samples]
    return out


def cadvisor_exposition(rows: Sequence[Sequence[Any]], loaded_at: float, now: float) -> bytes:
    """cAdvisor's CPU counter of every pod's container (cAdvisor's label names): a busy pod has
    used `utilization` % of a core since the fleet was loaded, an idle one nothing."""
    lines = [f"# TYPE {CPU_METRIC} counter"]
    span = max(0.0, now - loaded_at)
    for ns, pod, _node, util, uid, *_ in rows:
        used = CPU_BASE_S + span * float(util) / 100.0
        lines.append(
            f'{CPU_METRIC}{{container="main",cpu="total",id="/kubepods/pod{uid}/main",'
            f'image="registry.local/train:fake",name="main",namespace="{ns}",pod="{pod}"}} {used:.3f}'
        )
    return ("\n".join(lines) + "\n").encode()


def cadvisor_scrape(exporter_port: int, scrape_interval: str) -> dict[str, Any]:
    """The kubelet's cAdvisor scrape as kube-prometheus-stack labels it (job, metrics_path)."""
    return {
        "job_name": CPU_JOB,
        "metrics_path": CADVISOR_PATH,
        "honor_labels": True,  # the container's namespace and pod, not the target's
        "scrape_interval": scrape_interval,
        "scrape_timeout": scrape_interval,
        "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"metrics_path": CPU_PATH}}],
    }


# --- what the history read costs --------------------------------------------------------------------


def is_history_query(body: bytes) -> bool:
    """A controller's Prometheus request is the idle-session history (not the poll's query): only
    the history reads cAdvisor's CPU counter."""
    return CPU_METRIC.encode() in body


def controller_history_query(
    controller: ControllerConfig,
    pods: Sequence[tuple[str, str]],
    *,
    after_s: float,
    warn_before_s: float,
    window_s: float | None = None,
) -> str:
    """The history query the controller's act room sends for these pods (act/idle.py `_history`):
    over `after` (the ladder), or `window_s` (after + warnBefore: a stop's re-read)."""
    from ghostgpu.controller.act.idle import LOOKBACK_FACTOR

    preset = controller.metrics.dcgm if controller.metrics.preset == "dcgm" else controller.metrics.hami
    return history_query(
        preset,
        controller.idle_sessions.cpu_source,
        controller.metrics.agent_source,
        pods,
        window_s=after_s if window_s is None else window_s,
        lookback_s=LOOKBACK_FACTOR * (after_s + warn_before_s),
        step_s=controller.metrics.scrape_interval.seconds,
        zero_threshold=controller.zero_threshold,
    )


def time_query(prom_url: str, query: str, *, rounds: int = 3, timeout: float = 300.0) -> dict[str, Any]:
    """Best of `rounds`: the wall seconds of the answer and Prometheus's own timings and samples
    for it (`stats=all`: evaluation and execution seconds, samples read), the answer's series and
    bytes. Each round names the clock of the moment it is sent, as a poll does."""
    best: dict[str, Any] = {}
    with httpx.Client(timeout=timeout) as client:
        for _ in range(rounds):
            t0 = time.monotonic()
            r = client.post(
                f"{prom_url}/api/v1/query",
                data={"query": query, "time": f"{time.time():.3f}", "stats": "all"},
            )
            wall = time.monotonic() - t0
            r.raise_for_status()
            body = r.json()
            stats = (body.get("data") or {}).get("stats") or {}
            timings, samples = stats.get("timings") or {}, stats.get("samples") or {}
            row = {
                "wall_s": round(wall, 4),
                "eval_s": timings.get("evalTotalTime"),
                "exec_s": timings.get("execTotalTime"),
                "samples": samples.get("totalQueryableSamples"),
                "peak_samples": samples.get("peakSamples"),
                "series": len(body["data"]["result"]),
                "bytes": len(r.content),
                "query_chars": len(query),
            }
            if not best or row["wall_s"] < best["wall_s"]:
                best = row
    return best


def history_cost(
    prom_url: str,
    controller: ControllerConfig,
    sessions: Sequence[tuple[str, str]],
    policy: SessionPolicy,
) -> dict[str, dict[str, Any]]:
    """The history query for the bench's sessions against the bench's Prometheus: as the bench's
    controller sends it (the ladder over `after` for every session at once; the re-read over
    after + warnBefore, once for every session that asks for it), and as a controller with the
    default policy would (3 h, lookback 8 h; the bench's Prometheus holds only minutes, so its range
    reads are shorter than a real 3 h history, its lookback steps are not)."""
    return {
        "ladder": time_query(
            prom_url,
            controller_history_query(
                controller, sessions, after_s=policy.after_s, warn_before_s=policy.warn_before_s
            ),
        ),
        "reread": time_query(
            prom_url,
            controller_history_query(
                controller,
                sessions,
                after_s=policy.after_s,
                warn_before_s=policy.warn_before_s,
                window_s=policy.full_s,
            ),
        ),
        "default_policy": time_query(
            prom_url,
            controller_history_query(
                controller, sessions, after_s=DEFAULT_AFTER_S, warn_before_s=DEFAULT_WARN_BEFORE_S
            ),
        ),
    }


def steady_history(rows: Sequence[Mapping[str, Any]], window: int) -> dict[str, Any]:
    """The probe's history figures over the steady polls (summarise_controller's split): history
    queries per poll and their wall seconds as the controller saw them (medians), the ladder's
    steps and the verdicts of the last poll."""
    steady = rows[window + 1 :]
    if not steady:
        return {}
    steps = dict(steady[-1].get("idle_steps") or {})
    windows = sorted({k for r in steady for k in r.get("history_reads") or {}}, key=float)
    return {
        "history_queries": statistics.median(r.get("history_queries", 0) for r in steady),
        # by the window read (seconds): the ladder's over `after`, the re-reads over after + warnBefore
        "history_reads": {
            w: statistics.median((r.get("history_reads") or {}).get(w, 0) for r in steady) for w in windows
        },
        "history_wall_s": round(statistics.median(r.get("history_wall_s", 0.0) for r in steady), 4),
        "tend_wall_s": round(statistics.median(r.get("idle_tend_wall_s", 0.0) for r in steady), 4),
        "candidates": statistics.median(r.get("idle_candidates", 0) for r in steady),
        "steps_last_poll": dict(sorted(steps.items())),
        "polls_with_history": sum(1 for r in rows if r.get("history_queries")),
        "first_poll_with_history": next((r["poll"] for r in rows if r.get("history_queries")), None),
    }


def decision_actions(path: Any) -> dict[str, int]:
    """Rows of the controller's decision log by action (the idle-* steps among them): how many
    rows said each. A missing log is none."""
    import json
    from pathlib import Path

    p = Path(path)
    out: dict[str, int] = {}
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        action = str(row.get("action", ""))
        out[action] = out.get(action, 0) + 1
    return dict(sorted(out.items()))
