"""The run-length decision log (`DecisionLog.record_poll`) against the one-line-per-poll format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.controller.books.decisions import (
    Checkpoint,
    Decision,
    DecisionLog,
    DecisionRow,
    Left,
    PollMark,
    Record,
    Report,
    parse_lines,
    summarize,
)

T0 = 1_764_410_000.0
INTERVAL = 60.0
Rows = dict[str, tuple[str, tuple[str, ...], float, str]]  # workload -> verdict, reasons, gpus, action


def records(log: DecisionLog) -> list[Record]:
    return list(parse_lines(log.read_bytes().decode().splitlines()))


def report(log: DecisionLog) -> Report:
    return summarize(records(log))


def row_list(rows: Rows) -> list[DecisionRow]:
    return [(w, v, r, g, a) for w, (v, r, g, a) in rows.items()]


def legacy(ts: float, poll: int, rows: Rows) -> list[Decision]:
    return [
        Decision(
            ts=ts, poll=poll, workload=w, verdict=v, reasons=list(r), gpus=g, action=a, interval_s=INTERVAL
        )
        for w, (v, r, g, a) in rows.items()
    ]


def assert_same_report(new: Report, old: Report) -> None:
    """Everything but the poll count and time span (a poll nobody was judged on has no old line)."""
    assert new.workloads == old.workloads
    assert new.by_verdict == old.by_verdict
    assert new.would_reclaim_workloads == old.would_reclaim_workloads
    assert new.gpu_hours_would_reclaim == pytest.approx(old.gpu_hours_would_reclaim, abs=1e-9)
    assert new.gpu_hours_by_verdict.keys() == old.gpu_hours_by_verdict.keys()
    for k, v in old.gpu_hours_by_verdict.items():
        assert new.gpu_hours_by_verdict[k] == pytest.approx(v, abs=1e-9)
    assert [m.__dict__ for m in new.misses] == [m.__dict__ for m in old.misses]
    assert [r.__dict__ for r in new.reversals] == [r.__dict__ for r in old.reversals]


# --- a random history: polls of a few workloads, plus restarts and skipped polls -----------------

VERDICTS = ["ACTIVE", "IDLE_HELD", "FINISHED_IDLE", "ZOMBIE_CRASHED", "UNKNOWN"]
row_st = st.tuples(
    st.sampled_from(VERDICTS),
    st.sampled_from([(), ("utilization-zero",), ("processes-failed", "utilization-failed")]),
    st.sampled_from([1.0, 2.0, 0.5]),
    st.sampled_from(["none", "would-reclaim"]),
)
# Stable runs are the common case: a poll usually repeats the previous one with one edit.
step_st = st.one_of(
    st.tuples(st.just("poll"), st.dictionaries(st.sampled_from("abcde"), row_st, max_size=5)),
    st.tuples(st.just("edit"), st.sampled_from("abcde"), st.one_of(st.none(), row_st)),
    st.tuples(st.just("same")),
    st.tuples(st.just("restart"), st.booleans()),  # True: the poll numbers start again at 1
    st.tuples(st.just("gap"), st.integers(1, 3)),  # polls on which this replica was not the leader
)


def play(steps: list[tuple[Any, ...]], new_path: Path, old_path: Path, max_bytes: int = 64 << 20) -> list:
    """Write the history both ways; returns [(ts, poll, rows)] of every recorded poll."""
    new, old = DecisionLog(new_path, max_bytes=max_bytes), DecisionLog(old_path)
    rows: Rows = {}
    ts, poll, done = T0, 0, []
    for step in steps:
        if step[0] == "restart":
            new = DecisionLog(new_path, max_bytes=max_bytes)
            poll = 0 if step[1] else poll
            continue
        if step[0] == "gap":
            poll += step[1]
            ts += INTERVAL * step[1]
            continue
        if step[0] == "poll":
            rows = dict(step[1])
        elif step[0] == "edit":
            rows = dict(rows)
            if step[2] is None:
                rows.pop(step[1], None)
            else:
                rows[step[1]] = step[2]
        poll += 1
        ts += INTERVAL
        new.record_poll(ts=ts, poll=poll, mode="shadow", interval_s=INTERVAL, rows=row_list(rows))
        old.append(legacy(ts, poll, rows))
        done.append((ts, poll, rows))
    return done


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step_st, max_size=40))
def test_run_length_report_equals_one_line_per_poll(tmp_path_factory: pytest.TempPathFactory, steps) -> None:
    tmp = tmp_path_factory.mktemp("eq")
    done = play(steps, tmp / "new.jsonl", tmp / "old.jsonl")
    new, old = report(DecisionLog(tmp / "new.jsonl")), report(DecisionLog(tmp / "old.jsonl"))
    assert_same_report(new, old)
    assert new.polls == len(done)  # one marker per poll, judged or not
    assert old.polls == len({poll for _, poll, rows in done if rows})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step_st, max_size=40), max_bytes=st.integers(200, 3000))
def test_rotation_checkpoint_keeps_the_report(
    tmp_path_factory: pytest.TempPathFactory, steps, max_bytes: int
) -> None:
    tmp = tmp_path_factory.mktemp("rot")
    done = play(steps, tmp / "new.jsonl", tmp / "old.jsonl", max_bytes=max_bytes)
    log = DecisionLog(tmp / "new.jsonl", max_bytes=max_bytes)
    if log.rotated is None or not log.rotated.exists():
        return
    old_lines = records(DecisionLog(tmp / "old.jsonl"))

    def since(ts0: float) -> Report:
        return summarize(d for d in old_lines if d.ts >= ts0)

    # both generations: the old format's history from the first poll they hold
    both = records(log)
    assert isinstance(both[0], PollMark)
    assert_same_report(summarize(both), since(both[0].ts))

    # the newest generation alone: its first poll's marker, then every tracked workload's row
    newest = list(parse_lines((tmp / "new.jsonl").read_text().splitlines()))
    first = newest[0]
    assert isinstance(first, PollMark)
    rows = next(rows for ts, poll, rows in done if ts == first.ts)
    checkpoint = [r for r in newest[1:] if isinstance(r, Checkpoint)]
    assert {c.workload for c in checkpoint} == set(rows)
    assert all(not isinstance(r, Checkpoint) for r in newest[1 + len(checkpoint) :])
    for c in checkpoint:
        assert (c.verdict, tuple(c.reasons), c.gpus, c.action) == rows[c.workload]
    assert_same_report(summarize(newest), since(first.ts))


# --- stable fleets, unchanged rows, leaving, restarts --------------------------------------------


def test_stable_fleet_writes_one_line_per_workload_and_a_marker_per_poll(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.jsonl")
    rows = [
        (f"Deployment/ns/w{i}", "FINISHED_IDLE", ("utilization-zero",), 2.0, "would-reclaim")
        for i in range(50)
    ]
    written = [
        log.record_poll(ts=T0 + 60 * p, poll=p, mode="shadow", interval_s=60, rows=rows)
        for p in range(1, 101)
    ]
    assert written == [50] + [0] * 99
    lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert len(lines) == 150
    assert sum(1 for x in lines if x.get("kind") == "poll") == 100
    assert sum(1 for x in lines if "kind" not in x) == 50
    rep = report(log)
    assert rep.polls == 100 and rep.workloads == 50 and rep.misses == [] and rep.reversals == []
    assert rep.gpu_hours_would_reclaim == pytest.approx(50 * 2 * 100 / 60)  # 100 one-minute polls


def test_unchanged_rows_are_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.jsonl"
    log = DecisionLog(path)
    rows: list[DecisionRow] = [
        ("Pod/ns/a", "ACTIVE", (), 1, "none"),
        ("Pod/ns/b", "UNKNOWN", ("x",), 1, "none"),
    ]
    assert log.record_poll(ts=T0, poll=1, mode="shadow", interval_s=60, rows=rows) == 2
    # the decision lines are the older format's lines, byte for byte
    text = path.read_text().splitlines()
    assert (
        text[1]
        == Decision(ts=T0, poll=1, workload="Pod/ns/a", verdict="ACTIVE", gpus=1, interval_s=60).line()
    )

    # unchanged rows: no model is built and nothing but the marker is written
    def no_model(*a: Any, **k: Any) -> None:
        raise AssertionError("a Decision was built for an unchanged row")

    monkeypatch.setattr(Decision, "__init__", no_model)
    size = path.stat().st_size
    assert log.record_poll(ts=T0 + 60, poll=2, mode="shadow", interval_s=60, rows=list(rows)) == 0
    added = path.read_text()[size:].splitlines()
    assert len(added) == 1 and json.loads(added[0])["kind"] == "poll"
    monkeypatch.undo()

    # one change: exactly that workload's line
    rows[1] = ("Pod/ns/b", "UNKNOWN", ("y",), 1, "none")
    size = path.stat().st_size
    assert log.record_poll(ts=T0 + 120, poll=3, mode="shadow", interval_s=60, rows=rows) == 1
    added = [json.loads(x) for x in path.read_text()[size:].splitlines()]
    assert [x.get("workload") for x in added] == [None, "Pod/ns/b"] and added[1]["reasons"] == ["y"]


def test_a_workload_that_leaves_and_comes_back(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.jsonl")
    a, b = ("Pod/ns/a", "FINISHED_IDLE", (), 4.0, "would-reclaim"), ("Pod/ns/b", "ACTIVE", (), 1.0, "none")
    plan = {1: [a, b], 2: [a, b], 3: [b], 4: [b], 5: [a, b]}  # a left on poll 3, back on 5
    for p, rows in plan.items():
        log.record_poll(ts=T0 + 60 * p, poll=p, mode="shadow", interval_s=60, rows=rows)
    recs = records(log)
    assert [(r.poll, r.workload) for r in recs if isinstance(r, Left)] == [(3, "Pod/ns/a")]
    assert [r.poll for r in recs if isinstance(r, Decision) and r.workload == "Pod/ns/a"] == [1, 5]
    rep = summarize(recs)
    assert rep.gpu_hours_would_reclaim == pytest.approx(4 * 3 / 60)  # polls 1, 2 and 5


def test_restart_starts_a_fresh_segment(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    unknown = ("Pod/ns/gone", "UNKNOWN", ("utilization-failed",), 1.0, "none")
    kept = ("Pod/ns/kept", "ZOMBIE_CRASHED", (), 1.0, "would-reclaim")
    first = DecisionLog(path)
    for p in (1, 2):
        first.record_poll(ts=T0 + 60 * p, poll=p, mode="shadow", interval_s=60, rows=[unknown, kept])
    # A restarted process whose first written poll happens to be the next number (it followed for a
    # while): its marker says "fresh", so "gone" (not seen again) ended with poll 2, not at the end.
    second = DecisionLog(path)
    assert second.record_poll(ts=T0 + 180, poll=3, mode="shadow", interval_s=60, rows=[kept]) == 1
    second.record_poll(ts=T0 + 240, poll=4, mode="shadow", interval_s=60, rows=[kept])
    marks = [r for r in records(second) if isinstance(r, PollMark)]
    assert [m.fresh for m in marks] == [True, False, True, False]
    rep = report(second)
    [miss] = rep.misses
    assert (miss.from_poll, miss.to_poll, miss.polls, miss.outcome) == (1, 2, 2, "persisted")
    assert rep.gpu_hours_would_reclaim == pytest.approx(4 / 60)


def test_a_failed_write_makes_the_next_poll_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = DecisionLog(tmp_path / "d.jsonl")
    a = ("Pod/ns/a", "ACTIVE", (), 1.0, "none")
    log.record_poll(ts=T0, poll=1, mode="shadow", interval_s=60, rows=[a])

    def full(text: str) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(log, "_write", full)
        with pytest.raises(OSError):
            log.record_poll(ts=T0 + 60, poll=2, mode="shadow", interval_s=60, rows=[])
    # poll 2 (a left) was never written: poll 3 must not diff against it
    assert log.record_poll(ts=T0 + 120, poll=3, mode="shadow", interval_s=60, rows=[a]) == 1
    marks = [r for r in records(log) if isinstance(r, PollMark)]
    assert [(m.poll, m.fresh) for m in marks] == [(1, True), (3, True)]


def test_rotation_does_not_split_runs(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.jsonl", max_bytes=700)
    u = ("Pod/ns/u", "UNKNOWN", ("processes-failed",), 2.0, "none")
    z = ("Pod/ns/z", "ZOMBIE_CRASHED", (), 1.0, "would-reclaim")
    for p in range(1, 21):
        log.record_poll(ts=T0 + 60 * p, poll=p, mode="shadow", interval_s=60, rows=[u, z])
    assert log.rotated is not None and log.rotated.exists()
    recs = records(log)
    assert sum(isinstance(r, Checkpoint) for r in recs) >= 2  # the newer generation re-states both
    rep = summarize(recs)
    first = next(r for r in recs if isinstance(r, PollMark)).poll
    [miss] = rep.misses  # one UNKNOWN run across the rotation, not one per generation
    assert (miss.from_poll, miss.to_poll, miss.polls) == (first, 20, 21 - first)
    assert rep.reversals == [] and rep.polls == 21 - first
    assert rep.gpu_hours_would_reclaim == pytest.approx((21 - first) / 60)


def test_a_first_poll_of_a_large_fleet_is_written_in_pieces_and_sized_exactly(tmp_path: Path) -> None:
    """Every row changes on a first poll: the lines go out in chunks (not one joined text), and the
    rotation is decided on exactly the bytes they take."""
    rows = [(f"Deployment/ns/w{i}", "ACTIVE", ("utilization-nonzero",), 1.0, "none") for i in range(2500)]
    log = DecisionLog(tmp_path / "a.jsonl")
    assert log.record_poll(ts=T0, poll=1, mode="shadow", interval_s=60, rows=rows) == 2500
    text = (tmp_path / "a.jsonl").read_text()
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) == 2501 and all(lines)
    assert [json.loads(x)["workload"] for x in lines[1:]] == [r[0] for r in rows]
    for slack, rotates in ((0, False), (-1, True)):
        path = tmp_path / f"slack{slack}.jsonl"
        path.write_text("\n\n")  # 2 bytes already there
        log = DecisionLog(path, max_bytes=2 + len(text.encode()) + slack)
        log.record_poll(ts=T0, poll=1, mode="shadow", interval_s=60, rows=rows)
        assert log.rotated is not None and log.rotated.exists() is rotates


def test_old_generation_then_run_length(tmp_path: Path) -> None:
    """An upgrade mid-history: `.1` in the old format, the current file run-length."""
    path = tmp_path / "d.jsonl"
    old = DecisionLog(path)
    for p in (1, 2, 3):
        old.append(
            [
                Decision(
                    ts=T0 + 60 * p,
                    poll=p,
                    workload="Pod/ns/a",
                    verdict="FINISHED_IDLE",
                    gpus=1,
                    interval_s=60,
                )
            ]
        )
    path.rename(tmp_path / "d.jsonl.1")
    new = DecisionLog(path)
    for p in (1, 2):  # the restarted controller counts polls from 1 again
        rows: list[DecisionRow] = [("Pod/ns/a", "ACTIVE", (), 1.0, "none")]
        new.record_poll(ts=T0 + 60 * (3 + p), poll=p, mode="shadow", interval_s=60, rows=rows)
    rep = report(new)
    assert rep.polls == 5 and rep.by_verdict == {"ACTIVE": 1}
    assert rep.gpu_hours_would_reclaim == pytest.approx(3 / 60)
    assert [(r.reclaimable_at_poll, r.live_at_poll) for r in rep.reversals] == [(1, 1)]


def test_cli_report_reads_the_run_length_file(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.jsonl")
    rows: list[DecisionRow] = [
        ("Pod/ns/a", "FINISHED_IDLE", (), 2.0, "would-reclaim"),
        ("Pod/ns/b", "UNKNOWN", ("utilization-failed",), 1.0, "none"),
    ]
    for p in range(1, 31):
        log.record_poll(ts=T0 + 60 * p, poll=p, mode="shadow", interval_s=60, rows=rows)
    out = CliRunner().invoke(app, ["report", str(tmp_path / "d.jsonl"), "--json"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)
    assert rep["polls"] == 30 and rep["gpuHoursWouldReclaim"] == 1.0
    assert [(m["polls"], m["outcome"]) for m in rep["misses"]] == [(30, "persisted")]
    text = CliRunner().invoke(app, ["report", str(tmp_path / "d.jsonl")])
    assert "polls 1-30 (30) persisted" in text.output
