"""`ghostgpu calibrate` output: the rubric, the thresholds table, the frontier, JSON, the config snippet."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table

from ghostgpu.autonomy import AutonomyConfig, CalibrationResult, CalibrationSettings, Threshold, calibrate
from ghostgpu.calibration.idle_incidents import IDLE_RUBRIC, idle_session_incidents
from ghostgpu.calibration.incidents import RUBRIC, Incident, builtin_incidents, load_incidents, scored

# The publication's figures on its own 176 events (22 manifests x 8 action classes).
PUBLISHED_TAU: dict[str, tuple[float, float]] = {
    "global": (0.325, 0.417),
    "node_pressure": (0.30, 0.286),
    "pvc_failure": (0.35, 0.439),
    "scheduler_starvation": (0.45, 0.395),
    "oom": (0.475, 0.967),
}
PUBLISHED_PER_TYPE_MEAN = 0.522


class CalibrationRun(BaseModel):
    """Everything one `ghostgpu calibrate` run reports (the --json document)."""

    model_config = ConfigDict(frozen=True)

    source: str
    rubric: str | None  # the built-in set's rubric; a file brings its own labels
    events: int
    dangerous: int
    by_action: dict[str, tuple[int, int]]  # action -> (events, dangerous)
    result: CalibrationResult
    # The built-in set's idle-session stops (incident type idle_held), calibrated apart from the
    # published set; None for an incident file (its own idle_held rows are one of its types).
    idle_held: Threshold | None = None
    snippet: str


def run(
    incidents_path: Path | None,
    autonomy: AutonomyConfig,
    settings: CalibrationSettings,
) -> CalibrationRun:
    if incidents_path is None:
        incidents, origin = builtin_incidents()
        source, rubric = f"built-in set: {origin}", RUBRIC
    else:
        incidents, source, rubric = load_incidents(incidents_path, autonomy), str(incidents_path), None
    result = calibrate(scored(incidents, autonomy), settings)
    idle = None
    if incidents_path is None:
        idle = calibrate(scored(idle_session_incidents(), autonomy), settings).global_threshold
        idle = idle.model_copy(update={"scope": "idle_held"})
        rubric = f"{rubric}\n\n{IDLE_RUBRIC}"
    return CalibrationRun(
        source=source,
        rubric=rubric,
        events=len(incidents),
        dangerous=sum(i.dangerous for i in incidents),
        by_action=_by_action(incidents),
        result=result,
        idle_held=idle,
        snippet=config_snippet(result, idle),
    )


def _by_action(incidents: list[Incident]) -> dict[str, tuple[int, int]]:
    total = Counter(i.action for i in incidents)
    dangerous = Counter(i.action for i in incidents if i.dangerous)
    return {a: (total[a], dangerous[a]) for a in sorted(total)}


def config_snippet(result: CalibrationResult, idle: Threshold | None = None) -> str:
    """The controller.autonomy lines to paste into ghostgpu.yaml."""
    s = result.settings
    body: dict[str, Any] = {"tau": result.global_threshold.tau}
    by_type = {t.scope: t.tau for t in result.per_type}
    if idle is not None:
        by_type["idle_held"] = idle.tau
    if by_type:
        body["tauByType"] = by_type
    body["calibration"] = {
        "ceiling": s.ceiling,
        "perTypeCeiling": s.per_type_ceiling,
        "autonomousLatencySeconds": s.autonomous_latency_seconds,
        "escalationLatencySeconds": s.escalation_latency_seconds,
    }
    head = (
        "# ghostgpu.yaml (from `ghostgpu calibrate`). tauByType keys are looked up by the verdict kind\n"
        "# (FINISHED_IDLE, ZOMBIE_CRASHED, IDLE_HELD: an idle session's stop) or incident type;\n"
        "# anything else falls back to tau.\n"
    )
    return head + yaml.safe_dump({"controller": {"autonomy": body}}, sort_keys=False)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _row(t: Threshold, published: tuple[float, float] | None) -> list[str]:
    pub = f"{published[0]:.3f} / {_pct(published[1])}" if published else "-"
    return [
        t.scope,
        "per type" if t.tau is None else f"{t.tau:.3f}",
        _pct(t.mttr_reduction),
        f"{_pct(t.catastrophic_rate)} ({t.dangerous_autonomous}/{t.dangerous})",
        str(t.events),
        str(t.autonomous),
        pub,
    ]


def print_text(run_: CalibrationRun, console: Console) -> None:
    r, s = run_.result, run_.result.settings
    console.print(f"[bold]Incident set[/bold]: {run_.source}")
    console.print(f"{run_.events} events, {run_.dangerous} dangerous")
    if run_.rubric:
        console.print()
        console.print(run_.rubric, highlight=False, markup=False)
    console.print()
    actions = Table(title="Events per action class", title_justify="left")
    for col in ("action class", "events", "dangerous"):
        actions.add_column(col, justify="left" if col == "action class" else "right")
    for action, (n, d) in run_.by_action.items():
        actions.add_row(action, str(n), str(d))
    console.print(actions)

    title = (
        f"Thresholds: ceiling {_pct(s.ceiling)} catastrophic (dangerous alone / dangerous); "
        f"MTTR {s.autonomous_latency_seconds:g} s alone vs {s.escalation_latency_seconds:g} s escalated; "
        f"per-type ceiling {s.per_type_ceiling}"
    )
    table = Table(title=title, title_justify="left")
    for col in ("scope", "tau", "MTTR reduction", "catastrophic", "events", "alone", "published tau / MTTR"):
        table.add_column(col, justify="left" if col == "scope" else "right")
    table.add_row(*_row(r.global_threshold, PUBLISHED_TAU["global"]))
    for t in r.per_type:
        table.add_row(*_row(t, PUBLISHED_TAU.get(t.scope)))
    table.add_row(*_row(r.per_type_overall, None), end_section=True)
    if run_.idle_held is not None:
        table.add_row(*_row(run_.idle_held, None), end_section=True)
    table.add_row(
        "mean of types", "", _pct(r.per_type_mean_mttr_reduction), "", "", "", _pct(PUBLISHED_PER_TYPE_MEAN)
    )
    console.print(table)
    if run_.idle_held is not None:
        console.print(
            f"idle_held: the idle-session stops ({run_.idle_held.events} events, "
            f"{run_.idle_held.dangerous} dangerous), calibrated apart from the set above.",
            highlight=False,
        )
    console.print(
        "tau = the lowest grid value reaching the best MTTR reduction under the ceiling (ties -> most "
        "conservative). "
        + (
            "Per-type taus share the global ceiling (pooled), so they are never worse than the global tau."
            if s.per_type_ceiling == "pooled"
            else "Each type keeps the ceiling on its own (stricter; may be worse than the global tau)."
        ),
        highlight=False,
    )
    console.print()
    frontier = Table(title="Pareto frontier of the global tau sweep", title_justify="left")
    for col in ("tau", "catastrophic", "MTTR reduction", ""):
        frontier.add_column(col, justify="right")
    last = len(r.frontier) - 1
    for i, f in enumerate(r.frontier):
        note = "always-escalate" if i == 0 else "always-autonomous" if i == last else ""
        note = note or ("strict" if f.strict else "")
        frontier.add_row(f"{f.tau:.3f}", _pct(f.catastrophic_rate), _pct(f.mttr_reduction), note)
    console.print(frontier)
    console.print()
    console.print(run_.snippet.rstrip("\n"), highlight=False, markup=False)


def to_json(run_: CalibrationRun) -> str:
    return json.dumps(run_.model_dump(mode="json"), sort_keys=True, indent=2)
