"""The decision log and `ghostgpu report`.

Where history lives: the acting replica (the leader) appends one JSON line per judged workload per
poll to `--decision-log` (default /var/lib/ghostgpu/decisions.jsonl; mount a volume to keep it
across restarts) and serves the same file at GET /decisions on its metrics port. `ghostgpu report`
reads a file or that URL. Each line:

  {"ts": 1764410000.0, "poll": 17, "workload": "Deployment/ns/name", "verdict": "FINISHED_IDLE",
   "reasons": [...], "gpus": 2, "mode": "shadow", "action": "would-reclaim", "intervalS": 60}

The report answers, from shadow history:
- GPU-hours that would have been reclaimed: for every poll on which a workload was judged
  reclaimable, its GPUs x the poll interval (the time they would have been free for others).
- Misses: runs of polls on which a workload could not be judged (UNKNOWN: a signal failed or was
  missing, so it was kept) and whether each run CLEARED on a later poll (a definite verdict came
  back, naming it) or PERSISTED to the end of the history. A miss costs GPU-hours, never safety.
- Reversals: a reclaimable verdict that a later poll contradicted (ACTIVE / IDLE_HELD). In enforce
  mode that would have been a false reclaim; shadow history is where to find them before enabling it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

RECLAIMABLE = frozenset({"FINISHED_IDLE", "ZOMBIE_CRASHED"})
LIVE = frozenset({"ACTIVE", "IDLE_HELD"})


class Decision(BaseModel):
    ts: float
    poll: int
    workload: str
    verdict: str
    reasons: list[str] = []
    gpus: float = 0.0
    mode: str = "shadow"
    action: str = "none"
    interval_s: float = 60.0

    def line(self) -> str:
        # What model_dump() gives for these plain fields, without its per-line cost (N lines/poll).
        d = {
            "ts": self.ts,
            "poll": self.poll,
            "workload": self.workload,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "gpus": self.gpus,
            "mode": self.mode,
            "action": self.action,
            "intervalS": self.interval_s,
        }
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, line: str) -> Decision:
        d = json.loads(line)
        if "intervalS" in d:
            d["interval_s"] = d.pop("intervalS")
        return cls.model_validate(d)


class DecisionLog:
    """Append-only JSONL writer (one write + fsync per poll: a crash loses at most that poll).

    Bounded: past `max_bytes` the file is rotated to `<path>.1` (one generation kept), so a
    1,000-workload fleet polled every minute (~200 MB/day) never fills the volume.
    """

    def __init__(self, path: str | Path | None, *, max_bytes: int = 64 << 20) -> None:
        self.path = Path(path) if path else None
        self.max_bytes = max_bytes
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def rotated(self) -> Path | None:
        return self.path.with_name(self.path.name + ".1") if self.path else None

    def append(self, decisions: Iterable[Decision]) -> None:
        if not self.path:
            return
        text = "".join(d.line() + "\n" for d in decisions)
        if not text:
            return
        if self.path.exists() and self.path.stat().st_size + len(text) > self.max_bytes:
            assert self.rotated is not None
            os.replace(self.path, self.rotated)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def read_bytes(self) -> bytes:
        """The rotated generation (older) followed by the current file."""
        if not self.path:
            return b""
        parts = [p.read_bytes() for p in (self.rotated, self.path) if p is not None and p.exists()]
        return b"".join(parts)


def parse_lines(lines: Iterable[str]) -> Iterator[Decision]:
    for line in lines:
        if line.strip():
            yield Decision.parse(line)


@dataclass
class Miss:
    """A run of UNKNOWN verdicts for one workload."""

    workload: str
    from_poll: int
    to_poll: int
    polls: int
    reasons: list[str]
    outcome: str  # "cleared" or "persisted"
    cleared_to: str | None  # the verdict that ended the run
    gpu_hours: float


@dataclass
class Reversal:
    workload: str
    reclaimable_at_poll: int
    verdict: str
    live_at_poll: int
    live_verdict: str


@dataclass
class Report:
    polls: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    workloads: int = 0
    by_verdict: dict[str, int] = field(default_factory=dict)  # latest verdict per workload
    gpu_hours_would_reclaim: float = 0.0
    gpu_hours_by_verdict: dict[str, float] = field(default_factory=dict)
    would_reclaim_workloads: list[str] = field(default_factory=list)
    misses: list[Miss] = field(default_factory=list)
    reversals: list[Reversal] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "polls": self.polls,
            "firstTs": self.first_ts,
            "lastTs": self.last_ts,
            "workloads": self.workloads,
            "latestVerdicts": dict(sorted(self.by_verdict.items())),
            "gpuHoursWouldReclaim": round(self.gpu_hours_would_reclaim, 4),
            "gpuHoursByVerdict": {k: round(v, 4) for k, v in sorted(self.gpu_hours_by_verdict.items())},
            "wouldReclaim": self.would_reclaim_workloads,
            "misses": [m.__dict__ for m in self.misses],
            "reversals": [r.__dict__ for r in self.reversals],
        }


def _misses(name: str, history: list[Decision]) -> Iterator[Miss]:
    i = 0
    while i < len(history):
        if history[i].verdict != "UNKNOWN":
            i += 1
            continue
        j = i
        while j + 1 < len(history) and history[j + 1].verdict == "UNKNOWN":
            j += 1
        run = history[i : j + 1]
        reasons = sorted({r for d in run for r in d.reasons})
        after = history[j + 1] if j + 1 < len(history) else None
        yield Miss(
            workload=name,
            from_poll=run[0].poll,
            to_poll=run[-1].poll,
            polls=len(run),
            reasons=reasons,
            outcome="cleared" if after else "persisted",
            cleared_to=after.verdict if after else None,
            gpu_hours=round(sum(d.gpus * d.interval_s for d in run) / 3600.0, 4),
        )
        i = j + 1


def _reversals(name: str, history: list[Decision]) -> Iterator[Reversal]:
    pending: Decision | None = None
    for d in history:
        if d.verdict in RECLAIMABLE and pending is None:
            pending = d
        elif d.verdict in LIVE and pending is not None:
            yield Reversal(name, pending.poll, pending.verdict, d.poll, d.verdict)
            pending = None


def summarize(decisions: Iterable[Decision]) -> Report:
    per_workload: dict[str, list[Decision]] = defaultdict(list)
    polls: set[int] = set()
    rep = Report()
    for d in decisions:
        per_workload[d.workload].append(d)
        polls.add(d.poll)
        rep.first_ts = d.ts if rep.first_ts is None else min(rep.first_ts, d.ts)
        rep.last_ts = d.ts if rep.last_ts is None else max(rep.last_ts, d.ts)
    rep.polls = len(polls)
    rep.workloads = len(per_workload)
    for name in sorted(per_workload):
        history = sorted(per_workload[name], key=lambda d: (d.poll, d.ts))
        latest = history[-1].verdict
        rep.by_verdict[latest] = rep.by_verdict.get(latest, 0) + 1
        if any(d.verdict in RECLAIMABLE for d in history):
            rep.would_reclaim_workloads.append(name)
        for d in history:
            if d.verdict in RECLAIMABLE:
                hours = d.gpus * d.interval_s / 3600.0
                rep.gpu_hours_would_reclaim += hours
                rep.gpu_hours_by_verdict[d.verdict] = rep.gpu_hours_by_verdict.get(d.verdict, 0.0) + hours
        rep.misses.extend(_misses(name, history))
        rep.reversals.extend(_reversals(name, history))
    return rep
