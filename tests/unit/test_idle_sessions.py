"""The idle-session ladder, clock, snooze and steps (ghostgpu.idle_sessions), and the property that
no sequence of samples with a failed or live signal reaches a stop."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from ghostgpu.idle_policy import IdleSessionsConfig, ResolvedIdlePolicy, SessionClass
from ghostgpu.idle_sessions import (
    IDLE_DEADLINE,
    KEEP_UNTIL,
    Ladder,
    Record,
    WindowEvidence,
    class_of,
    climb,
    format_time,
    next_step,
    record_annotations,
    record_of,
    session_program,
    snooze_of,
    warning_message,
)
from ghostgpu.verdict import FailureReason, SignalFailure

MIN = 60.0
AFTER, WARN = 10 * MIN, 5 * MIN
T0 = 1_800_000_000.0
FAILED = SignalFailure(reason=FailureReason.MISSING)


def policy(mode: str = "enforce", **over: object) -> ResolvedIdlePolicy:
    cfg = IdleSessionsConfig.model_validate(
        {
            "mode": mode,
            "after": "10m",
            "warnBefore": "5m",
            "maxSnooze": "30m",
            "afterBounds": {"min": "1m"},
            **over,
        }
    )
    return cfg.for_team(None)


def idle_evidence(window_s: float = AFTER, **over: object) -> WindowEvidence:
    base: dict[str, object] = {
        "window_s": window_s,
        "expected_samples": int(window_s // 30),
        "gpu_util_max": 0.0,
        "gpu_samples": int(window_s // 30),
        "memory_min_bytes": 4 << 30,
        "memory_max_bytes": 4 << 30,
        "cpu_seconds": 0.001 * window_s,
        "cpu_samples": int(window_s // 30),
        "youngest_process_age_s": 10 * 3600.0,
        "running_processes": 0,
        "terminal_wakeups": 0.0,
        "last_busy_at": None,
        "lookback_s": 3600.0,
    }
    base.update(over)
    return WindowEvidence.model_validate(base)


# --- classes ---------------------------------------------------------------------------------------


def test_session_program_sees_through_python_dash_m() -> None:
    assert session_program("/opt/conda/bin/python3 -m ipykernel_launcher -f /x.json") == "ipykernel_launcher"
    assert session_program("python -m http.server 8000") == "http.server"
    assert session_program("/usr/bin/tmux new -s work") == "tmux"
    assert session_program("python3 /usr/local/bin/jupyter-lab --ip=0.0.0.0") == "jupyter-lab"


def test_class_of_takes_the_most_doubtful_program() -> None:
    assert class_of(["ipykernel_launcher", "jupyter-lab"]) is SessionClass.NOTEBOOK
    assert class_of(["ipykernel_launcher", "watch"]) is SessionClass.NOTEBOOK
    assert class_of(["tmux", "bash"]) is SessionClass.TERMINAL
    assert class_of(["watch"]) is SessionClass.MONITOR
    assert class_of(["vllm", "bash"]) is SessionClass.SERVER
    assert class_of(["ipykernel_launcher", "train.py"]) is SessionClass.OTHER
    assert class_of([]) is None
    assert class_of(["tmux"], complete=False) is None  # a cut list cannot tell


# --- the ladder ------------------------------------------------------------------------------------


def test_all_rungs_idle() -> None:
    ladder = climb(idle_evidence(), policy(), now=T0, zero_threshold=0.0)
    assert ladder.outcome == "idle"
    assert ladder.idle_since == T0 - AFTER  # not busy within the lookback: no more than the window proves


def test_the_clock_starts_when_the_work_ended() -> None:
    ladder = climb(idle_evidence(last_busy_at=T0 - 2000), policy(), now=T0, zero_threshold=0.0)
    assert ladder.idle_since == T0 - 2000


def test_a_silent_cpu_computation_keeps_its_session() -> None:
    ladder = climb(idle_evidence(cpu_seconds=0.5 * AFTER), policy(), now=T0, zero_threshold=0.0)
    assert ladder.outcome == "active"
    assert "cpu" in ladder.keeps()


def test_a_monitor_is_discounted_only_up_to_its_allowance() -> None:
    p = policy()
    watch = idle_evidence(cpu_seconds=0.04 * AFTER, monitor_cpu_seconds=0.04 * AFTER)
    assert climb(watch, p, now=T0, zero_threshold=0.0).outcome == "idle"
    # A computation named `top` using a core is not discounted beyond the allowance.
    disguised = idle_evidence(cpu_seconds=1.0 * AFTER, monitor_cpu_seconds=1.0 * AFTER)
    assert climb(disguised, p, now=T0, zero_threshold=0.0).outcome == "active"


def test_a_notebook_front_end_is_discounted_only_up_to_its_allowance_and_never_for_a_monitor() -> None:
    p = policy()
    assert p.frontend_cpu_allowance == 0.05
    # A server answering an open tab's polls: 0.03 cores of the container's 0.035 are its own.
    tab = idle_evidence(cpu_seconds=0.035 * AFTER, frontend_cpu_seconds=0.03 * AFTER)
    assert climb(tab, p, now=T0, zero_threshold=0.0).outcome == "idle"
    assert climb(
        tab.model_copy(update={"frontend_cpu_seconds": None}), p, now=T0, zero_threshold=0.0
    ).outcome == (
        "active"  # the series lost on its way: nothing discounted, the safe direction
    )
    # A cell computing is the kernel's CPU: the front-end's discount never covers it.
    cell = idle_evidence(cpu_seconds=0.5 * AFTER, frontend_cpu_seconds=0.001 * AFTER)
    assert climb(cell, p, now=T0, zero_threshold=0.0).outcome == "active"
    # A front-end that computes a core is discounted its allowance only.
    busy = idle_evidence(cpu_seconds=1.0 * AFTER, frontend_cpu_seconds=1.0 * AFTER)
    assert climb(busy, p, now=T0, zero_threshold=0.0).outcome == "active"
    # Each allowance covers its own process only: a monitor and a front-end, each at its cap.
    both = idle_evidence(
        cpu_seconds=0.11 * AFTER, monitor_cpu_seconds=0.06 * AFTER, frontend_cpu_seconds=0.06 * AFTER
    )
    assert climb(both, p, now=T0, zero_threshold=0.0).outcome == "idle"  # 0.11 - 0.05 - 0.05 = 0.01
    assert climb(
        both, p.model_copy(update={"frontend_cpu_allowance": 0.0}), now=T0, zero_threshold=0.0
    ).outcome == ("active")


def test_each_live_signal_is_activity() -> None:
    p = policy()
    for over in (
        {"gpu_util_max": 3.0},
        {"memory_max_bytes": (4 << 30) + (1 << 30)},
        {"youngest_process_age_s": 30.0},
        {"running_processes": 1},
        {"terminal_wakeups": 4.0},
        {"last_busy_at": T0 - 60},
    ):
        assert climb(idle_evidence(**over), p, now=T0, zero_threshold=0.0).outcome == "active", over


def test_each_failed_or_thin_signal_is_unknown() -> None:
    p = policy()
    for over in (
        {"gpu_util_max": FAILED},
        {"gpu_samples": 3},  # a gap in the GPU series may hide work
        {"memory_min_bytes": FAILED},
        {"cpu_seconds": FAILED},
        {"cpu_samples": 0},
        {"youngest_process_age_s": FAILED},
        {"running_processes": FAILED},
        {"terminal_wakeups": FAILED},
        {"last_busy_at": FAILED},
    ):
        ladder = climb(idle_evidence(**over), p, now=T0, zero_threshold=0.0)
        assert ladder.outcome == "unknown", over
        assert ladder.idle_since is None


def test_activity_outranks_a_failure() -> None:
    ladder = climb(idle_evidence(gpu_util_max=50.0, cpu_seconds=FAILED), policy(), now=T0, zero_threshold=0.0)
    assert ladder.outcome == "active"  # cancelling a warning is the safe direction


# --- snooze and record -------------------------------------------------------------------------------


def owner(keep: str, manager: str = "kubectl-annotate", at: float | None = T0) -> dict[str, object]:
    fields = {"f:metadata": {"f:annotations": {f"f:{KEEP_UNTIL}": {}}}}
    entry = {"manager": manager, "operation": "Update", "fieldsV1": fields}
    if at is not None:
        entry["time"] = format_time(at)
    return {"metadata": {"annotations": {KEEP_UNTIL: keep}, "managedFields": [entry]}}


def test_snooze_is_honoured_and_recorded_with_its_manager() -> None:
    s = snooze_of(owner(format_time(T0 + 600)), max_snooze_s=1800, base=T0)
    assert s is not None and s.until == T0 + 600 and not s.cut
    assert s.manager == "kubectl-annotate" and s.set_at == T0
    assert "set by kubectl-annotate" in s.describe()


def test_snooze_beyond_max_is_cut_from_when_it_was_set() -> None:
    s = snooze_of(owner(format_time(T0 + 86400), at=T0 + 100), max_snooze_s=1800, base=T0)
    assert s is not None and s.until == T0 + 100 + 1800 and s.cut
    assert "cut to maxSnooze" in s.describe()


def test_unreadable_snooze_is_not_honoured() -> None:
    s = snooze_of(owner("next friday"), max_snooze_s=1800, base=T0)
    assert s is not None and s.until is None and "not honoured" in s.describe()
    naive = snooze_of(owner("2027-01-01T00:00:00"), max_snooze_s=1800, base=T0)
    assert naive is not None and naive.until is None


def test_record_round_trips_through_annotations() -> None:
    r = Record(idle_since=T0 - 700, warned_at=T0, deadline=T0 + 300)
    assert record_of(record_annotations(r)) == r
    assert record_of({**record_annotations(r), IDLE_DEADLINE: "soon"}) is None


def test_warning_says_why_and_how_to_keep_it() -> None:
    r = Record(idle_since=T0 - 7200, warned_at=T0, deadline=T0 + 3600)
    text = warning_message(SessionClass.NOTEBOOK, ["ipykernel_launcher"], 2, r, now=T0)
    assert "notebook" in text and "ipykernel_launcher" in text and "2 GPU(s)" in text
    assert "4 GPU-hours" in text and KEEP_UNTIL in text and "ghostgpu restore" in text


# --- steps --------------------------------------------------------------------------------------------


def idle_ladder(window_s: float, since: float) -> Ladder:
    return Ladder(outcome="idle", findings=(), idle_since=since, window_s=window_s)


def test_warn_then_stop_after_warn_before() -> None:
    p = policy()
    since = T0 - AFTER
    step = next_step(p, SessionClass.NOTEBOOK, idle_ladder(AFTER, since), None, None, now=T0)
    assert step.action == "warn" and step.record is not None
    assert step.record.deadline == T0 + WARN
    r = step.record
    mid = next_step(p, SessionClass.NOTEBOOK, idle_ladder(AFTER, since), r, None, now=T0 + WARN - 1)
    assert mid.action == "warned"
    due = next_step(p, SessionClass.NOTEBOOK, idle_ladder(AFTER, since), r, None, now=T0 + WARN)
    assert due.action == "reread"  # the stop reads after + warnBefore of evidence first
    stop = next_step(p, SessionClass.NOTEBOOK, idle_ladder(AFTER + WARN, since), r, None, now=T0 + WARN)
    assert stop.action == "stop"


def test_a_restarted_controller_keeps_the_deadline_and_a_forged_one_shortens_nothing() -> None:
    p = policy()
    since = T0 - AFTER
    r = Record(idle_since=since, warned_at=T0, deadline=T0 + WARN)
    kept = next_step(p, SessionClass.TERMINAL, idle_ladder(AFTER, since), r, None, now=T0 + 60)
    assert kept.action == "warned" and kept.record is not None and kept.record.deadline == T0 + WARN
    forged = Record(idle_since=T0 - 86400, warned_at=T0 - 86400, deadline=T0 - 86000)
    # The history says the work ended AFTER minutes ago: the forged record is not this idle spell.
    step = next_step(p, SessionClass.TERMINAL, idle_ladder(AFTER + WARN, since), forged, None, now=T0)
    assert step.action == "warn"


def test_a_snooze_moves_the_deadline() -> None:
    p = policy()
    since = T0 - AFTER
    r = Record(idle_since=since, warned_at=T0, deadline=T0 + WARN)
    s = snooze_of(owner(format_time(T0 + 1200)), max_snooze_s=1800, base=T0)
    step = next_step(p, SessionClass.NOTEBOOK, idle_ladder(AFTER + WARN, since), r, s, now=T0 + WARN)
    assert step.action == "warned" and step.record is not None and step.record.deadline == T0 + 1200
    assert "kept until" in step.reason


def test_servers_and_shadow() -> None:
    since = T0 - AFTER - WARN
    assert (
        next_step(policy(), SessionClass.SERVER, idle_ladder(AFTER, since), None, None, now=T0).action
        == "none"
    )
    on = policy(classes={"server": True})
    assert next_step(on, SessionClass.SERVER, idle_ladder(AFTER, since), None, None, now=T0).action == "warn"
    shadow = policy("shadow")
    found = Ladder(outcome="idle", findings=(), idle_since=T0 - AFTER, window_s=AFTER, since_found=True)
    assert next_step(shadow, SessionClass.NOTEBOOK, found, None, None, now=T0).action == "would-warn"
    # Not busy within the lookback: idle for at least the window; the longer window tells the rest.
    unsure = idle_ladder(AFTER, T0 - AFTER)
    assert next_step(shadow, SessionClass.NOTEBOOK, unsure, None, None, now=T0).action == "reread"
    full = idle_ladder(AFTER + WARN, since)
    assert next_step(shadow, SessionClass.NOTEBOOK, full, None, None, now=T0).action == "would-stop"


# --- the property: nothing failed or live ever reaches a stop ------------------------------------------

# One minute of a session: what happened in it. Most minutes are quiet so that stops are reached.
QUIET, BUSY_GPU, MEM, CPU, NEWPROC, RUNNING, TTY, GAP = range(8)
# Quiet runs (0-25 minutes) each ended by one event, so that long idle spells (and stops) occur.
minutes = st.lists(st.tuples(st.integers(0, 25), st.sampled_from(range(8))), min_size=1, max_size=6).map(
    lambda runs: [e for quiet, ev in runs for e in [QUIET] * quiet + [ev]]
)
# Per poll: which query failed (None: none).
FAILS = ("gpu", "memory", "cpu", "age", "running", "tty", "clock", None)


@dataclass
class Timeline:
    events: list[int]

    def evidence(self, t: int, span_min: int, fail: str | None) -> WindowEvidence:
        """What Prometheus and the agent would answer at minute t (now = T0 + t minutes) over the
        last span_min minutes: two samples a minute, none in a GAP minute."""
        # Before the timeline: no samples at all (a new session, or Prometheus had none).
        window = [self.events[i] if i >= 0 else GAP for i in range(t - span_min + 1, t + 1)]
        present = 2 * sum(e != GAP for e in window)
        busy = [i for i in range(0, t + 1) if self.events[i] == BUSY_GPU]
        news = [i for i in range(0, t + 1) if self.events[i] == NEWPROC]
        mem_moves = sum(e == MEM for e in window)
        ev = {
            "window_s": span_min * MIN,
            "expected_samples": 2 * span_min,
            "gpu_util_max": 80.0 if BUSY_GPU in window else 0.0,
            "gpu_samples": present,
            "memory_min_bytes": 1 << 30,
            "memory_max_bytes": (1 << 30) + mem_moves * (1 << 30),
            "cpu_seconds": sum(30.0 if e == CPU else 0.05 for e in window),
            "cpu_samples": present,
            "youngest_process_age_s": (t - news[-1]) * MIN if news else (t + 600) * MIN,
            "running_processes": int(self.events[t] == RUNNING),
            "terminal_wakeups": float(sum(e == TTY for e in window)),
            "last_busy_at": T0 + (busy[-1] - t) * MIN if busy else None,
            "lookback_s": 120 * MIN,
        }
        keys = {
            "gpu": "gpu_util_max",
            "memory": "memory_max_bytes",
            "cpu": "cpu_seconds",
            "age": "youngest_process_age_s",
            "running": "running_processes",
            "tty": "terminal_wakeups",
            "clock": "last_busy_at",
        }
        if fail is not None:
            ev[keys[fail]] = FAILED
        return WindowEvidence.model_validate(ev)


@settings(max_examples=300, deadline=None)
@given(events=minutes, fails=st.dictionaries(st.integers(0, 160), st.sampled_from(FAILS)), data=st.data())
def test_no_failed_or_live_signal_reaches_a_stop(
    events: list[int], fails: dict[int, str | None], data
) -> None:
    mode = data.draw(st.sampled_from(["enforce", "shadow"]))
    p = policy(mode)
    after_min, warn_min = int(AFTER // MIN), int(WARN // MIN)
    tl = Timeline(events)
    record: Record | None = None
    warned_since_quiet: float | None = None
    for t in range(len(events)):
        now = T0 + t * MIN
        fail = fails.get(t)
        ev = tl.evidence(t, after_min, fail)
        ladder = climb(ev, p, now=now, zero_threshold=0.0)
        step = next_step(p, SessionClass.NOTEBOOK, ladder, record, None, now=now)
        if step.action == "reread":
            ladder = climb(tl.evidence(t, after_min + warn_min, fail), p, now=now, zero_threshold=0.0)
            step = next_step(p, SessionClass.NOTEBOOK, ladder, record, None, now=now)
        if step.action in ("stop", "would-stop"):
            span = events[max(0, t - after_min - warn_min + 1) : t + 1]
            assert fail is None, "a failed signal reached a stop"
            assert not set(span) & {BUSY_GPU, MEM, CPU, NEWPROC, TTY}, "a live signal in the window"
            assert events[t] != RUNNING
            event(f"reached {step.action}")
            if mode == "enforce":
                assert warned_since_quiet is not None and now - warned_since_quiet >= WARN
            return  # the owner is stopped
        if step.action == "warn":
            warned_since_quiet = now
        if step.action == "clear":
            warned_since_quiet = None
        record = step.record if step.action in ("warn", "warned", "hold") else None


def test_a_quiet_session_does_reach_its_stop() -> None:
    """The property above is not vacuous: all quiet, the stop comes at after + warnBefore."""
    p = policy()
    tl = Timeline([QUIET] * 30)
    record = None
    for t in range(30):
        now = T0 + t * MIN
        ladder = climb(tl.evidence(t, 10, None), p, now=now, zero_threshold=0.0)
        step = next_step(p, SessionClass.NOTEBOOK, ladder, record, None, now=now)
        if step.action == "reread":
            ladder = climb(tl.evidence(t, 15, None), p, now=now, zero_threshold=0.0)
            step = next_step(p, SessionClass.NOTEBOOK, ladder, record, None, now=now)
        if step.action == "stop":
            break
        record = step.record
    assert step.action == "stop"


def test_a_warning_is_withdrawn_when_the_team_goes_back_to_shadow_or_off() -> None:
    r = Record(idle_since=T0 - AFTER, warned_at=T0, deadline=T0 + WARN)
    for mode in ("shadow", "off"):
        step = next_step(policy(mode), SessionClass.NOTEBOOK, idle_ladder(AFTER, T0 - AFTER), r, None, now=T0)
        assert step.action == "clear", mode
