"""`ghostgpu report` over a decision log, the planner's gate, and the health/metrics server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.books.decisions import Decision, DecisionLog, parse_lines, summarize
from ghostgpu.controller.inventory import gpu_predicate, workload_from
from ghostgpu.controller.judge.planner import plan
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.server import HealthServer
from ghostgpu.verdict import Reason, Rule, Verdict, VerdictKind


def d(
    poll: int, workload: str, verdict: str, gpus: float = 1.0, reasons: list[str] | None = None
) -> Decision:
    return Decision(ts=1000.0 + 60 * poll, poll=poll, workload=workload, verdict=verdict, gpus=gpus,
                    reasons=reasons or [], interval_s=60)  # fmt: skip


def test_report_hours_misses_and_reversals(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.jsonl")
    log.append(
        [d(1, "ns/ghost", "UNKNOWN", 2, ["insufficient-samples"])]
        + [d(p, "ns/ghost", "FINISHED_IDLE", 2) for p in range(2, 32)]  # 30 polls x 2 GPUs x 1 min = 1 h
        + [d(1, "ns/flaky", "UNKNOWN", 1, ["utilization-failed"]), d(2, "ns/flaky", "UNKNOWN", 1)]
        + [d(3, "ns/flaky", "ACTIVE", 1)]
        + [d(p, "ns/dark", "UNKNOWN", 4, ["processes-failed"]) for p in range(1, 4)]
        + [d(1, "ns/blip", "FINISHED_IDLE"), d(2, "ns/blip", "ACTIVE")]
    )
    rep = summarize(parse_lines(log.read_bytes().decode().splitlines()))
    assert rep.polls == 31 and rep.workloads == 4
    assert round(rep.gpu_hours_would_reclaim, 4) == round(1.0 + 1 / 60, 4)
    misses = {(m.workload, m.outcome, m.cleared_to) for m in rep.misses}
    assert misses == {
        ("ns/ghost", "cleared", "FINISHED_IDLE"),
        ("ns/flaky", "cleared", "ACTIVE"),
        ("ns/dark", "persisted", None),
    }
    dark = next(m for m in rep.misses if m.workload == "ns/dark")
    assert dark.polls == 3 and dark.gpu_hours == round(3 * 4 / 60, 4) and dark.reasons == ["processes-failed"]
    assert [(r.workload, r.live_verdict) for r in rep.reversals] == [("ns/blip", "ACTIVE")]

    out = CliRunner().invoke(app, ["report", str(tmp_path / "d.jsonl"), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["gpuHoursWouldReclaim"] == round(1.0 + 1 / 60, 4)
    text = CliRunner().invoke(app, ["report", str(tmp_path / "d.jsonl")])
    assert "persisted" in text.output and "cleared -> ACTIVE" in text.output


def test_report_missing_file_is_an_error(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["report", str(tmp_path / "nope.jsonl")])
    assert out.exit_code == 2


def _verdict(kind: VerdictKind) -> Verdict:
    return Verdict(kind=kind, rule=Rule.GHOSTGPU, reasons=(Reason.UTILIZATION_ZERO,))


def _wl(kind: str = "Deployment", gpus: int = 1, replicas: int = 1, pvcs: int = 0):  # type: ignore[no-untyped-def]
    container = {"name": "m", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    obj = {
        "metadata": {"name": "x", "namespace": "ns", "uid": "u"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"spec": {"containers": [container]}},
        },
    }
    vols = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": f"c{i}"}} for i in range(pvcs)]
    obj["spec"]["template"]["spec"]["volumes"] = vols  # type: ignore[index]
    if kind == "Pod":
        obj["spec"] = obj["spec"]["template"]["spec"]  # type: ignore[index]
    return workload_from(kind, obj, gpu_predicate(["nvidia.com/gpu"]))


def test_planner_modes_and_gate() -> None:
    shadow, enforce = ControllerConfig(), ControllerConfig(mode="enforce")
    assert plan(_wl(), _verdict(VerdictKind.FINISHED_IDLE), None, shadow).action == "would-reclaim"
    assert plan(_wl(), _verdict(VerdictKind.UNKNOWN), None, enforce).action == "none"
    assert plan(_wl(), _verdict(VerdictKind.IDLE_HELD), None, enforce).action == "none"
    small = plan(_wl(), _verdict(VerdictKind.ZOMBIE_CRASHED), VerdictKind.ZOMBIE_CRASHED, enforce)
    assert small.action == "scale-to-zero" and not small.record and small.decision is not None
    # a big blast radius (8 GPUs x 8 replicas with 4 volumes) is escalated by the default gate
    big = plan(_wl(gpus=8, replicas=8, pvcs=4), _verdict(VerdictKind.FINISHED_IDLE), None, enforce)
    assert big.action == "escalate" and big.record
    # a bare pod is evicted (never deleted); a tighter tau for its verdict escalates it instead
    assert plan(_wl("Pod"), _verdict(VerdictKind.FINISHED_IDLE), None, enforce).action == "evict"
    strict = ControllerConfig(mode="enforce", autonomy={"tauByType": {"FINISHED_IDLE": 0.2}})
    assert plan(_wl("Pod"), _verdict(VerdictKind.FINISHED_IDLE), None, strict).action == "escalate"


async def test_health_server_routes() -> None:
    metrics = ControllerMetrics()
    metrics.poll_duration.observe(0.25)
    state = {"ready": False}
    server = HealthServer(
        metrics.registry,
        healthy=lambda: (True, "ok"),
        ready=lambda: (state["ready"], "syncing"),
        decisions=lambda: b'{"poll":1}\n',
        host="127.0.0.1",
        port=0,
    )
    port = await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            m = await c.get("/metrics")
            assert m.status_code == 200 and "ghostgpu_poll_duration_seconds_count 1.0" in m.text
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/readyz")).status_code == 503
            state["ready"] = True
            assert (await c.get("/readyz")).status_code == 200
            assert (await c.get("/decisions")).text == '{"poll":1}\n'
            assert (await c.get("/nope")).status_code == 404
    finally:
        await server.stop()
    await asyncio.sleep(0)


def test_config_whole_file_or_controller_section(tmp_path: Path) -> None:
    from ghostgpu.controller.app import load_any_config
    from ghostgpu.resources import example_config_path

    whole = load_any_config(example_config_path())
    assert whole.flavors and {f.name for f in whole.flavors} == {"h100", "mig-1g-10gb"}
    section = tmp_path / "ghostgpu-controller.yaml"
    section.write_text("mode: enforce\npollInterval: 30s\nwindow: 4\nlongWindow: 8\n")
    only = load_any_config(section)
    assert only.flavors is None and only.controller.mode == "enforce" and only.controller.window == 4


def test_decision_log_rotates_and_reads_both_generations(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.jsonl", max_bytes=600)
    for poll in range(1, 11):
        log.append([d(poll, "ns/w", "ACTIVE")])
    assert (tmp_path / "d.jsonl.1").exists() and (tmp_path / "d.jsonl").stat().st_size <= 600
    polls = [x.poll for x in parse_lines(log.read_bytes().decode().splitlines())]
    assert polls == sorted(polls) and polls[-1] == 10 and len(polls) < 10  # oldest generation dropped
