"""The scale bench's idle sessions (`bench scale --idle-sessions`): the fleet's sessions, what the
metrics source serves for them (equal to the node agent's own collector), the controller config,
the history query counted apart, and the report's targets (pure; the bench itself is e2e)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ghostgpu.agent.exporter import AgentExporter
from ghostgpu.agent.idle_facts import idle_facts
from ghostgpu.agent.scan import ContainerKey, ScanResult, Seen
from ghostgpu.config import ControllerConfig
from ghostgpu.idle_policy import SessionClass
from ghostgpu.idle_sessions import class_of, session_program
from ghostgpu.scale import sessions
from ghostgpu.scale.bench import (
    BenchConfig,
    IdleSessionsRun,
    Side,
    SizeResult,
    controller_config,
    fleet_row,
    from_json,
    to_json,
)
from ghostgpu.scale.exporter import agent_exposition, prometheus_config
from ghostgpu.scale.fleet import SESSION_TABLE, FleetSpec, session_exec_body
from ghostgpu.scale.meter import HISTORY, RequestCounter, is_history
from ghostgpu.scale.report import idle_sessions_markdown, targets
from ghostgpu.signals.processes import parse_ps
from ghostgpu.signals.utilization import PodKey, build_query
from ghostgpu.verdict import ProcessPolicy, count_roles

T = 1_700_000_000.0
ROWS = [
    ["scale-00", "g00000", "gpu-s-0000", 0, "uid-a", 1],
    ["scale-01", "g00001", "gpu-s-0000", 57, "uid-b", 0],
    ["scale-02", "g00002", "gpu-s-0000", 0, "uid-c", 0],
]
FACT_SERIES = {f"{sessions.AGENT}{f}" for f in sessions.FACTS}


def _samples(text: bytes, names: set[str]) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
        if s.name in names
    }


def test_a_session_serves_what_the_agents_own_collector_prints_for_its_processes() -> None:
    session = ContainerKey("scale-00", "g00000", "uid-a", "main")
    idle = ContainerKey("scale-02", "g00002", "uid-c", "main")
    rows = parse_ps(SESSION_TABLE)
    scan = ScanResult(
        timestamp=T,
        containers={
            session: Seen(
                counts=count_roles(rows, ProcessPolicy()),
                rows=rows,
                idle=idle_facts(sessions.session_processes("uid-a")),
            ),
            idle: Seen(
                counts=count_roles(parse_ps("    PID    PPID STAT ELAPSED COMMAND\n"), ProcessPolicy()),
                rows=(),
            ),
        },
        scanned_pids=3,
    )
    agent = AgentExporter("gpu-s-0000")
    agent.publish(scan)
    bench = agent_exposition(ROWS, loaded_at=T)
    assert _samples(bench, FACT_SERIES) == _samples(generate_latest(agent.registry), FACT_SERIES)
    facts = _samples(bench, FACT_SERIES)
    assert {dict(lab)["tracked_pod"] for _n, lab, _v in facts} == {"g00000"}, "only the session has facts"
    newest = next(v for n, lab, v in facts if n.endswith("newest_start_seconds"))
    assert newest == T - 86_400, "the kernel started a day ago: older than any window"
    assert ("class", "notebook") in next(lab for n, lab, _v in facts if n.endswith("newest_start_seconds"))
    # families are contiguous in the exposition (each under its TYPE line)
    names = [line.split("{")[0] for line in bench.decode().splitlines() if line and not line.startswith("#")]
    assert [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n] == list(dict.fromkeys(names))


def test_the_session_is_live_work_of_class_notebook() -> None:
    counts = count_roles(parse_ps(SESSION_TABLE), ProcessPolicy())
    assert counts.work == 2 and not counts.holder, "live work: IDLE_HELD at 0 %, not FINISHED_IDLE"
    programs = [session_program(p.command) for p in parse_ps(SESSION_TABLE)[1:]]
    assert class_of(programs) is SessionClass.NOTEBOOK
    facts = sessions.session_facts()
    assert (facts.session_class, facts.running, facts.tty_wakeups, facts.monitor_cpu_s) == (
        SessionClass.NOTEBOOK,
        0,
        0,
        None,
    )


def test_sessions_are_a_deterministic_share_of_the_idle_pods() -> None:
    spec = FleetSpec(nodes=10, idle_fraction=0.01, session_fraction=0.5)
    held = [i for i in range(10_000) if spec.session(i)]
    assert held[:3] == [0, 200, 400] and all(spec.idle(i) for i in held)
    assert spec.session_count(10_000) == 50 == spec.idle_count(10_000) // 2
    assert [i for i in range(2_000) if spec.session(i)] == held[:10], "a grown fleet keeps its truth"
    assert FleetSpec(idle_fraction=0.01).session_count(10_000) == 0, "off by default"


def test_a_fleet_row_marks_a_session_only_when_the_bench_has_sessions() -> None:
    spec = FleetSpec(nodes=10, idle_fraction=0.01, session_fraction=0.5)
    uids = {(spec.namespace(i), spec.pod(i)): f"u{i}" for i in range(300)}
    assert fleet_row(spec, 0, uids, sessions=False) == ["scale-00", "g00000", "gpu-s-0000", 0, "u0"]
    assert fleet_row(spec, 0, uids, sessions=True)[5] == 1
    assert fleet_row(spec, 100, uids, sessions=True)[3:] == [0, "u100", 0], "an idle holder"
    assert fleet_row(spec, 1, uids, sessions=True)[3] > 0


def test_exec_mode_lists_a_sessions_processes_from_its_own_exec(tmp_path: Path) -> None:
    spec = FleetSpec(nodes=10, idle_fraction=0.01, session_fraction=0.5)
    body = session_exec_body(spec, 200, tmp_path / "t.txt")
    assert (body["kind"], body["metadata"]) == ("Exec", {"name": "g00200", "namespace": "scale-00"})
    env = {e["name"]: e["value"] for e in body["spec"]["execs"][0]["local"]["envs"]}
    assert env["GHOSTGPU_PROC_TABLE"] == str(tmp_path / "t.txt")


def test_the_controller_config_turns_idle_sessions_on_in_shadow_only_when_asked() -> None:
    policy = sessions.SessionPolicy()
    plain = controller_config("http://127.0.0.1:9", 5)["controller"]  # the example's own policy
    assert (plain["idleSessions"]["after"], plain["longWindow"]) == ("3h", 30)
    from ghostgpu.scale.bench import _session_policy

    assert _session_policy(BenchConfig(), on=True) is None, "without --idle-sessions: untouched"
    beside = _session_policy(BenchConfig(idle_sessions=True), on=False)
    assert beside is not None and beside.config()["mode"] == "off", "the run beside it reads nothing"
    doc = controller_config("http://127.0.0.1:9", 5, long_window=5, idle_sessions=policy)
    cfg = ControllerConfig.model_validate(doc["controller"])
    assert cfg.long_window == 5 and cfg.idle_sessions.mode == "shadow"
    assert (cfg.idle_sessions.after.seconds, cfg.idle_sessions.warn_before.seconds) == (60, 30)
    assert policy.full_s == 90


def test_prometheus_scrapes_cadvisor_as_the_default_cpu_source_names_it() -> None:
    assert [j["job_name"] for j in prometheus_config(9, "5s")["scrape_configs"]] == [
        "dcgm-exporter",
        "ghostgpu-agent",
    ]
    job = prometheus_config(9, "5s", cadvisor=True)["scrape_configs"][-1]
    target_labels = {"job": job["job_name"], **job["static_configs"][0]["labels"]}
    cpu_source = ControllerConfig().idle_sessions.cpu_source
    assert target_labels == cpu_source == {"job": "kubelet", "metrics_path": "/metrics/cadvisor"}
    assert job["honor_labels"] is True, "the container's namespace and pod"


def test_cadvisor_counters_grow_with_utilization_and_stand_still_when_idle() -> None:
    def values(now: float) -> dict[str, float]:
        text = sessions.cadvisor_exposition(ROWS, T, now).decode()
        return {s.labels["pod"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}

    before, after = values(T), values(T + 100)
    assert after["g00000"] == before["g00000"] and after["g00002"] == before["g00002"]
    assert round(after["g00001"] - before["g00001"], 3) == 57.0


def _form(query: str) -> httpx.Request:
    return httpx.Request("POST", "http://127.0.0.1:9/api/v1/query", data={"query": query})


def test_the_history_query_is_counted_apart_from_the_polls_query() -> None:
    from ghostgpu.scale.querycost import controller_spec

    controller = ControllerConfig.model_validate(
        controller_config("http://127.0.0.1:9", 5, idle_sessions=sessions.SessionPolicy())["controller"]
    )
    pods = [("scale-00", "g00000")]
    history = sessions.controller_history_query(controller, pods, after_s=60, warn_before_s=30)
    poll = build_query(controller_spec(controller, "agent"), [PodKey(*pods[0])], now=T)
    assert is_history(_form(history)) and not is_history(_form(poll))
    assert "[60s]" in history and "[180s:5s]" in history, "after, and the lookback 2 x (after + warnBefore)"
    reread = sessions.controller_history_query(controller, pods, after_s=60, warn_before_s=30, window_s=90)
    assert "[90s]" in reread and "[60s]" not in reread


async def test_the_probes_counter_counts_and_times_history_queries() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    from ghostgpu.signals import podexec

    counter = RequestCounter(prometheus_port=9)
    original, direct = httpx.AsyncClient.send, podexec._run_direct
    try:
        counter.install()
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            await client.post("http://127.0.0.1:9/api/v1/query", data={"query": "up"})
            await client.post(
                "http://127.0.0.1:9/api/v1/query", data={"query": f"increase({sessions.CPU_METRIC}[60s])"}
            )
    finally:
        httpx.AsyncClient.send = original  # type: ignore[method-assign]
        podexec._run_direct = direct  # type: ignore[assignment]
    assert counter.counts["prometheus_query"] == 2 and counter.counts[HISTORY] == 1
    assert counter.history_wall_s > 0


def test_steady_history_and_the_decision_log_say_what_the_ladder_did(tmp_path: Path) -> None:
    rows = [
        {"poll": p, "history_queries": 0 if p < 5 else 2, "history_wall_s": 0.01 * p,
         "idle_tend_wall_s": 0.02, "idle_candidates": 0 if p < 5 else 10,
         "idle_steps": {} if p < 5 else {"would-stop": 10}}
        for p in range(1, 10)
    ]  # fmt: skip
    h = sessions.steady_history(rows, window=5)
    assert h["history_queries"] == 2 and h["candidates"] == 10 and h["steps_last_poll"] == {"would-stop": 10}
    assert (h["first_poll_with_history"], h["polls_with_history"]) == (5, 5)
    log = tmp_path / "d.jsonl"
    log.write_text(
        "\n".join(json.dumps({"action": a}) for a in ["idle-would-stop", "none", "idle-would-stop"])
    )
    assert sessions.decision_actions(log) == {"idle-would-stop": 2, "none": 1}
    assert sessions.decision_actions(tmp_path / "missing") == {}


def _result(with_cycle: float, *, held: int = 50, history: float = 2, queries: float = 3) -> SizeResult:
    mine = Side(1.0, 0.4, 150.0, 1, 2, 0, 3, cycle_cpu_s=0.5, writes=0)
    naive = Side(10.0, 9.0, 100.0, 100, 100, 100, 2)
    run = IdleSessionsRun(
        side=Side(1.2, 0.45, 160.0, queries, 2, 0, 3, cycle_cpu_s=with_cycle, writes=0),
        sessions=50,
        policy=sessions.SessionPolicy().config(),
        states={"ACTIVE": 9_900, "FINISHED_IDLE": 50, "IDLE_HELD": held},
        history={"history_queries": history, "history_wall_s": 0.05, "steps_last_poll": {"would-stop": held}},
        cost={"ladder": {"wall_s": 0.04, "exec_s": 0.03, "samples": 9_000, "series": 600, "bytes": 9_000}},
    )
    return SizeResult(n=10_000, idle=100, nodes=1, ghostgpu=mine, naive=naive, floor_s=0.1, idle_sessions=run)


def _met(res: SizeResult) -> dict[str, bool]:
    return {name.split(" at N")[0]: ok for name, ok, _ in targets([res]) if name.startswith("idle sessions")}


def test_the_idle_session_run_is_judged_by_the_agent_modes_targets_and_the_ladders_run() -> None:
    ok = _met(_result(0.55))
    assert all(ok.values()) and len(ok) == 7
    res = _result(0.55)
    assert res.idle_sessions_extra_cpu_s == 0.05 and round(res.idle_sessions_floor_ratio or 0, 2) == 5.5
    assert not _met(_result(1.2))["idle sessions: CPU per poll-to-poll cycle"], "12x the floor"
    reached = "idle sessions: every session reaches IDLE_HELD and the ladder runs on every steady poll"
    assert not _met(_result(0.55, held=10))[reached + " (shadow: no writes)"]
    assert not _met(_result(0.55, queries=4))["idle sessions: one poll query per poll, plus the history"]
    table = idle_sessions_markdown([res])
    assert "| 10,000 (100, 50) | 50 | would-stop 50 | 2 | 0.050 | 0.500 | 0.550 | 0.050 | 5.5x |" in table
    assert res.idle_sessions is not None
    res.idle_sessions.history["history_reads"] = {"60": 1, "90": 1}
    assert "| would-stop 50 | 2 (60 s: 1, 90 s: 1) |" in idle_sessions_markdown([res])


def test_the_saved_json_keeps_the_idle_session_run_and_old_files_still_read() -> None:
    res = _result(0.55)
    back = from_json(json.loads(json.dumps(to_json([res], BenchConfig(idle_sessions=True)))))
    assert back[0].idle_sessions == res.idle_sessions
    old: dict[str, Any] = to_json([res], BenchConfig())
    del old["results"][0]["idle_sessions"]
    assert from_json(old)[0].idle_sessions is None
    assert not [name for name, _ok, _e in targets(from_json(old)) if name.startswith("idle sessions")]


def test_docs_scale_idle_session_tables_are_the_saved_runs() -> None:
    """docs/scale.md's idle-session tables are `idle_sessions_markdown` of the two saved runs."""
    repo = Path(__file__).resolve().parents[2]
    results = [
        r
        for name in ("scale-idle-2k.json", "scale-idle-10k.json", "scale-idle-50k.json")
        for r in from_json(json.loads((repo / "benchmarks" / "results" / name).read_text()))
    ]
    assert all(r.idle_sessions is not None for r in results)
    assert idle_sessions_markdown(results) in (repo / "docs" / "scale.md").read_text(encoding="utf-8")
