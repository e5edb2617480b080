"""docs/faults.md's result tables, from docs/faults.json (what tests/e2e/test_faults.py writes with
GHOSTGPU_FAULT_REPORT set): one table per process source, each fault kind's counts, then the run's
totals. `python -m ghostgpu.scale.fault_table` rewrites the part of docs/faults.md between its
`<!-- faults:begin -->` and `<!-- faults:end -->` markers; `--check` exits 1 when it differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- faults:begin -->", "<!-- faults:end -->"
REPO = Path(__file__).resolve().parents[2]

# What each kind is, in the table's words (ghostgpu.scale.faults, ghostgpu.scale.agent_faults).
NAMES = {
    "prometheus-down": "Prometheus down (refused)",
    "prometheus-reset": "Prometheus connection reset",
    "prometheus-slow": "Prometheus slow (timeout)",
    "prometheus-http500": "Prometheus HTTP 500",
    "prometheus-http503": "Prometheus HTTP 503",
    "prometheus-garbage": "Prometheus garbage body",
    "prometheus-empty": "Prometheus empty result",
    "prometheus-partial": "Prometheus partial series",
    "prometheus-stale": "Prometheus stale series",
    "exec-forbidden": "exec forbidden (RBAC 403)",
    "exec-hang": "exec hanging (FIFO)",
    "exec-garbage": "exec garbage output",
    "agent-restart": "agent pod restarting",
    "agent-rollout": "agent rollout (two agents' series)",
    "agent-scrape-gap": "agent scrape gap",
    "agent-stale-scan": "agent stale scan",
    "agent-twin-uid": "a second agent's series under another pod UID",
    "agent-container-restarted": "container restarted between scans",
    "agent-node-clock-skew": "node clock skew (agent scan time)",
    "apiserver-scale-denied": "apiserver 429/500/503 on scale",
    "clock-skew": "controller clock skew",
}


def _n(v: int) -> str:
    return f"{v:,}"


def mode_table(report: dict[str, Any]) -> list[str]:
    faults: dict[str, dict[str, int]] = report["faults"]
    order = [k for k in NAMES if k in faults] + sorted(k for k in faults if k not in NAMES)
    lines = [
        "| fault | injected | polls affected | verdicts UNKNOWN | reclaims (true ghosts) |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind in order:
        f = faults[kind]
        cells = [
            NAMES.get(kind, kind),
            *(_n(f[c]) for c in ("injected", "polls", "unknown_verdicts", "reclaims")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"| **total** | **{_n(report['total_faults'])}** | | | |")
    lines += [
        "",
        f"{_n(report['polls'])} polls in {_n(report['seconds'])} s, {_n(report['exec_calls'])} exec calls, "
        f"{_n(report['unknown_verdicts'])} UNKNOWN verdicts in all, {_n(report['reclaims'])} reclaims, "
        f"{_n(report['restores'])} restores, {_n(report['scale_requests_seen'])} scale requests seen by the "
        f"witness. **False reclaims: {report['false_reclaims']}.**",
    ]
    return lines


def render(doc: dict[str, Any]) -> str:
    out: list[str] = []
    for mode, report in doc["modes"].items():
        out += [
            f"**processSource: {mode}** (commit {report.get('commit', '?')})",
            "",
            *mode_table(report),
            "",
        ]
    out.append(
        f"Both modes: **{_n(doc['total_faults'])} injected faults, {doc['false_reclaims']} false reclaims**, "
        "every reclaimed ghost restored to its recorded count."
    )
    return "\n".join(out)


def splice(markdown: str, table: str) -> str:
    head, rest = markdown.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "faults.json")
    ap.add_argument("--markdown", type=Path, default=REPO / "docs" / "faults.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when the markdown differs")
    args = ap.parse_args(argv)
    try:
        doc = json.loads(args.json.read_text())
        md = args.markdown.read_text()
        new = splice(md, render(doc))
    except (OSError, ValueError, KeyError) as exc:
        print(f"fault_table: {args.json} / {args.markdown}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return 0 if new == md else 1
    args.markdown.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
