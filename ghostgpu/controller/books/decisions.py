"""The decision log and `ghostgpu report`.

Where history lives: the acting replica (the leader) writes `--decision-log` (default
/var/lib/ghostgpu/decisions.jsonl, on the volume `controller.decisionLog` names: kept across restarts
with a PersistentVolumeClaim) and serves the same file at GET /decisions on its metrics port; every
other replica answers that URL with the leader's file (books/leader_decisions.py). `ghostgpu report`
reads a file or that URL.

The file is run-length JSONL. Once per poll the leader calls `DecisionLog.record_poll` with every
judged workload's row and writes, in one write + fsync, a poll marker first and then only what changed:

  {"kind":"poll","ts":1764410000.0,"poll":17,"judged":10000,"changed":1,"left":1,"intervalS":60.0,
   "fresh":false}
  {"ts":1764410000.0,"poll":17,"workload":"Deployment/ns/name","verdict":"FINISHED_IDLE",
   "reasons":[...],"gpus":2.0,"mode":"shadow","action":"would-reclaim","intervalS":60.0}
  {"kind":"left","ts":1764410000.0,"poll":17,"workload":"Pod/ns/gone"}

- A decision line (same fields as the older format) is written for a workload that is new or whose
  (verdict, reasons, gpus, action, mode) changed; a workload without a line kept its row. It holds from
  its ts until that workload's next decision line or `left` line, or the end of its segment.
- `left`: judged on the previous poll, not on this one (deleted, reclaimed, in grace, opted out...).
- `fresh: true`: the writer had no memory (process start, leadership regained, a skipped poll or a
  failed write, a mode change). Every judged workload follows, and every run open before the marker
  ended where the previous poll ended (its ts + intervalS). A poll number that is not the previous
  marker's + 1 means the same. The end of the history is the last marker's ts + intervalS.
- Rotation: past `max_bytes` the file moves to `<path>.1` (one generation kept) and the new file starts
  with that poll's marker followed by EVERY tracked workload's row (state after that poll) marked
  `"checkpoint": true`, so the new generation alone knows every run from that poll on. Read after the
  older generation, a checkpoint row equal to the open run continues it (it is not a change).

Decision lines that do not follow a marker of their own poll are the older one-line-per-poll format
(`DecisionLog.append`, still supported): each holds for its own intervalS. The report reads both,
including a mix (an old-format `.1` with a new current file).

The report answers, from shadow history (per workload, its runs in time order):
- GPU-hours that would have been reclaimed: gpus x time held, over runs with a reclaimable verdict
  (the time the GPUs would have been free for others).
- Misses: consecutive runs on which a workload could not be judged (UNKNOWN: a signal failed or was
  missing, so it was kept), their polls (next poll - first poll), and whether the miss CLEARED on a
  later poll (a definite verdict came back, naming it) or PERSISTED to the end of the history. A miss
  costs GPU-hours, never safety.
- Reversals: a reclaimable verdict that a later run contradicted (ACTIVE / IDLE_HELD). In enforce mode
  that would have been a false reclaim; shadow history is where to find them before enabling it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from pydantic import BaseModel

RECLAIMABLE = frozenset({"FINISHED_IDLE", "ZOMBIE_CRASHED"})
LIVE = frozenset({"ACTIVE", "IDLE_HELD"})
WRITE_CHUNK = 1000  # lines per write() of one poll

# workload, verdict, reasons, gpus, action: one judged workload on one poll (record_poll's input).
# The workload is anything whose str() names it (the controller passes its WorkloadRef: held
# between polls for 50,000 workloads, a string per workload per poll was ~3 MB kept and remade).
DecisionRow: TypeAlias = tuple[Any, str, tuple[str, ...], float, str]


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


class Checkpoint(Decision):
    """A row re-written at the top of a new generation: state, not a change."""


@dataclass(frozen=True)
class PollMark:
    ts: float
    poll: int
    judged: int
    interval_s: float
    fresh: bool = False

    @property
    def end(self) -> tuple[float, int]:
        """Where this poll's rows stop holding if nothing follows: (ts, first poll not covered)."""
        return self.ts + self.interval_s, self.poll + 1


@dataclass(frozen=True)
class Left:
    ts: float
    poll: int
    workload: str


Record: TypeAlias = Decision | PollMark | Left


def _row_line(
    ts: float, poll: int, row: DecisionRow, mode: str, interval_s: float, *, checkpoint: bool
) -> str:
    # Byte-identical to Decision(...).line() (floats where the model coerces), minus pydantic.
    workload, verdict, reasons, gpus, action = row
    d: dict[str, Any] = {
        "action": action,
        "gpus": float(gpus),
        "intervalS": interval_s,
        "mode": mode,
        "poll": poll,
        "reasons": list(reasons),
        "ts": ts,
        "verdict": verdict,
        "workload": str(workload),
    }
    if checkpoint:
        d["checkpoint"] = True
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _dumps(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


class DecisionLog:
    """Append-only JSONL writer (one write + fsync per poll: a crash loses at most that poll).

    Bounded: past `max_bytes` the file is rotated to `<path>.1` (one generation kept). With
    `record_poll` a stable fleet costs one marker line per poll, so 64 MiB holds weeks, not minutes.
    """

    def __init__(self, path: str | Path | None, *, max_bytes: int = 64 << 20) -> None:
        self.path = Path(path) if path else None
        self.max_bytes = max_bytes
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # record_poll's memory: the last row written per workload, as of poll self._poll in self._mode.
        self._held: dict[Any, DecisionRow] = {}
        self._poll: int | None = None
        self._mode: str | None = None

    @property
    def rotated(self) -> Path | None:
        return self.path.with_name(self.path.name + ".1") if self.path else None

    def append(self, decisions: Iterable[Decision]) -> None:
        """The older format: one line per decision, each holding for its own interval."""
        if not self.path:
            return
        lines = [d.line() for d in decisions]
        if not lines:
            return
        if self._full(lines):
            self._rotate()
        self._write(lines)

    def record_poll(
        self, *, ts: float, poll: int, mode: str, interval_s: float, rows: Iterable[DecisionRow]
    ) -> int:
        """Record one poll: every judged workload's row, one row per workload.

        Writes the poll marker, a decision line per new or changed row and a `left` line per workload
        judged last poll but not now (or, when the file rotates, the marker, every row as a checkpoint
        and the `left` lines). Returns the number of decision lines written (checkpoint rows included).
        Unchanged rows cost a dict lookup and a tuple compare: no model, no JSON.
        """
        if not self.path:
            return 0
        # Without a memory that matches the file's last poll, diffing would silently continue runs
        # that the file never saw (or that ended meanwhile): start a fresh segment instead.
        fresh = self._poll is None or poll != self._poll + 1 or mode != self._mode
        held = {} if fresh else self._held
        seen: dict[Any, DecisionRow] = {}
        changed: list[DecisionRow] = []
        found = 0  # rows whose workload was held: fewer than len(held) means some left
        get = held.get
        for row in rows:
            seen[row[0]] = row
            old = get(row[0])
            if old is None:
                changed.append(row)
            else:
                found += 1
                if old != row:
                    changed.append(row)
        left = sorted(map(str, held.keys() - seen.keys())) if found < len(held) else []
        ts, interval_s = float(ts), float(interval_s)  # as Decision.line() writes them
        marker = {"kind": "poll", "ts": ts, "poll": poll, "judged": len(seen), "changed": len(changed),
                  "left": len(left), "intervalS": interval_s, "fresh": fresh}  # fmt: skip
        left_lines = [_dumps({"kind": "left", "ts": ts, "poll": poll, "workload": w}) for w in left]
        lines = [_dumps(marker)]
        lines += [_row_line(ts, poll, r, mode, interval_s, checkpoint=False) for r in changed]
        lines += left_lines
        written = len(changed)
        if self._full(lines):
            self._rotate()
            lines = [_dumps(marker)]
            lines += [_row_line(ts, poll, r, mode, interval_s, checkpoint=True) for r in seen.values()]
            lines += left_lines
            written = len(seen)
        self._write(lines)
        # Only after a successful write: if it raised, the next poll is not poll + 1 and starts fresh.
        self._held, self._poll, self._mode = seen, poll, mode
        return written

    def _full(self, lines: list[str]) -> bool:
        """Would these lines, as _write writes them, take the file past max_bytes?"""
        assert self.path is not None
        incoming = sum(map(len, lines)) + len(lines)  # ASCII (json.dumps): a byte per character, + "\n"
        try:
            return self.path.stat().st_size + incoming > self.max_bytes
        except FileNotFoundError:
            return False

    def _rotate(self) -> None:
        assert self.path is not None and self.rotated is not None
        os.replace(self.path, self.rotated)

    def _write(self, lines: list[str]) -> None:
        # In chunks: a first poll changes every row (50,000 lines, ~11 MB at 50,000 workloads), and
        # one joined text plus its encoded copy were the controller's peak memory.
        assert self.path is not None
        with self.path.open("a", encoding="utf-8") as f:
            for i in range(0, len(lines), WRITE_CHUNK):
                f.write("\n".join(lines[i : i + WRITE_CHUNK]) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_bytes(self) -> bytes:
        """The rotated generation (older) followed by the current file."""
        if not self.path:
            return b""
        parts = [p.read_bytes() for p in (self.rotated, self.path) if p is not None and p.exists()]
        return b"".join(parts)


def parse_record(line: str) -> Record | None:
    """One line of either format; None for a `kind` this version does not know."""
    d = json.loads(line)
    kind = d.get("kind")
    if kind is None:
        cls = Checkpoint if d.pop("checkpoint", False) else Decision
        if "intervalS" in d:
            d["interval_s"] = d.pop("intervalS")
        return cls.model_validate(d)
    if kind == "poll":
        return PollMark(
            ts=float(d["ts"]),
            poll=int(d["poll"]),
            judged=int(d.get("judged", 0)),
            interval_s=float(d.get("intervalS", 60.0)),
            fresh=bool(d.get("fresh", False)),
        )
    if kind == "left":
        return Left(ts=float(d["ts"]), poll=int(d["poll"]), workload=str(d["workload"]))
    return None


class DecisionLogError(ValueError):
    """A line that is not a decision record: its number and what is wrong with it."""


def parse_lines(lines: Iterable[str]) -> Iterator[Record]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rec = parse_record(line)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                what = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
                raise DecisionLogError(f"line {number}: not a decision record ({what})") from None
            if rec is not None:
                yield rec


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


@dataclass(frozen=True)
class _Run:
    """One decision held for `polls` polls and `seconds` (an old-format line: 1 poll, its interval)."""

    d: Decision
    polls: int
    seconds: float

    @property
    def gpu_seconds(self) -> float:
        return self.d.gpus * self.seconds


def _same_row(a: Decision, b: Decision) -> bool:
    return (a.verdict, a.reasons, a.gpus, a.action, a.mode) == (
        b.verdict, b.reasons, b.gpus, b.action, b.mode
    )  # fmt: skip


class _RunBuilder:
    """Turns records (file order) into each workload's runs."""

    def __init__(self) -> None:
        self.runs: dict[str, list[_Run]] = defaultdict(list)
        self.open: dict[str, Decision] = {}
        self.last: PollMark | None = None  # the latest poll marker
        self.marked_poll: int | None = None  # decision lines of this poll are run-length lines
        self.markers = 0
        self.legacy_polls: set[int] = set()

    def close(self, workload: str, end_ts: float, end_poll: int) -> None:
        d = self.open.pop(workload, None)
        if d is not None:
            self.runs[workload].append(_Run(d, max(end_poll - d.poll, 0), max(end_ts - d.ts, 0.0)))

    def close_all(self) -> None:
        for w, d in list(self.open.items()):
            # Without any marker (cannot happen with record_poll's files) a row holds one interval.
            end = self.last.end if self.last is not None else (d.ts + d.interval_s, d.poll + 1)
            self.close(w, *end)

    def add(self, r: Record) -> None:
        if isinstance(r, PollMark):
            if self.last is not None and (r.fresh or r.poll != self.last.poll + 1):
                self.close_all()  # a new segment: what was open ended with the previous poll
            self.last, self.marked_poll = r, r.poll
            self.markers += 1
        elif isinstance(r, Left):
            self.close(r.workload, r.ts, r.poll)
        elif isinstance(r, Checkpoint):
            held = self.open.get(r.workload)
            if held is None or not _same_row(held, r):
                self.close(r.workload, r.ts, r.poll)
                self.open[r.workload] = r
        elif r.poll == self.marked_poll:
            self.close(r.workload, r.ts, r.poll)
            self.open[r.workload] = r
        else:  # the older one-line-per-poll format
            self.marked_poll = None
            self.legacy_polls.add(r.poll)
            self.runs[r.workload].append(_Run(r, 1, r.interval_s))


def _misses(name: str, history: list[_Run]) -> Iterator[Miss]:
    i = 0
    while i < len(history):
        if history[i].d.verdict != "UNKNOWN":
            i += 1
            continue
        j = i
        while j + 1 < len(history) and history[j + 1].d.verdict == "UNKNOWN":
            j += 1
        run = history[i : j + 1]
        after = history[j + 1] if j + 1 < len(history) else None
        yield Miss(
            workload=name,
            from_poll=run[0].d.poll,
            to_poll=run[-1].d.poll + run[-1].polls - 1,
            polls=sum(r.polls for r in run),
            reasons=sorted({reason for r in run for reason in r.d.reasons}),
            outcome="cleared" if after else "persisted",
            cleared_to=after.d.verdict if after else None,
            gpu_hours=round(sum(r.gpu_seconds for r in run) / 3600.0, 4),
        )
        i = j + 1


def _reversals(name: str, history: list[_Run]) -> Iterator[Reversal]:
    pending: Decision | None = None
    for r in history:
        d = r.d
        if d.verdict in RECLAIMABLE and pending is None:
            pending = d
        elif d.verdict in LIVE and pending is not None:
            yield Reversal(name, pending.poll, pending.verdict, d.poll, d.verdict)
            pending = None


def summarize(records: Iterable[Record]) -> Report:
    """The report over records in file order (`parse_lines`), either format or both."""
    rep = Report()
    b = _RunBuilder()
    for r in records:
        b.add(r)
        rep.first_ts = r.ts if rep.first_ts is None else min(rep.first_ts, r.ts)
        rep.last_ts = r.ts if rep.last_ts is None else max(rep.last_ts, r.ts)
    b.close_all()
    rep.polls = b.markers + len(b.legacy_polls)
    rep.workloads = len(b.runs)
    for name in sorted(b.runs):
        # Time order (stable: file order on ties). Old-format files used to be sorted by poll first,
        # which is the same order unless a restart reset the poll numbers.
        history = sorted(b.runs[name], key=lambda r: r.d.ts)
        latest = history[-1].d.verdict
        rep.by_verdict[latest] = rep.by_verdict.get(latest, 0) + 1
        if any(r.d.verdict in RECLAIMABLE for r in history):
            rep.would_reclaim_workloads.append(name)
        for r in history:
            if r.d.verdict in RECLAIMABLE:
                hours = r.gpu_seconds / 3600.0
                rep.gpu_hours_would_reclaim += hours
                rep.gpu_hours_by_verdict[r.d.verdict] = rep.gpu_hours_by_verdict.get(r.d.verdict, 0.0) + hours
        rep.misses.extend(_misses(name, history))
        rep.reversals.extend(_reversals(name, history))
    return rep
