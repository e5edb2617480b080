"""Properties of `decide` over arbitrary evidence and policies (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ghostgpu.verdict import (
    ArtifactSizes,
    ArtifactsNotDeclared,
    ContainerRestart,
    Evidence,
    FailureReason,
    FaultEvidence,
    GpuMemory,
    ProcessCounts,
    ProcessInfo,
    ProcessPolicy,
    ProcessRole,
    Rule,
    Signal,
    SignalFailure,
    VerdictKind,
    VerdictPolicy,
    XidEvent,
    classify_listing,
    count_roles,
    decide,
)

failures = st.builds(SignalFailure, reason=st.sampled_from(FailureReason), detail=st.text(max_size=8))
readings = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
mixed = st.lists(st.one_of(readings, st.just(0.0), failures), max_size=40).map(tuple)
# Half the draws are all-zero windows so the process, artifact and fault branches are reached.
samples = st.one_of(mixed, st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.2]), max_size=40).map(tuple))

live_states = st.sampled_from(["R", "S", "Sl", "D", "Ss", "R+", "I", "T", "t"])
dead_states = st.sampled_from(["Z", "Z+", "Zs", "X", "z", "x"])
# Real command lines of every role (holders, wrappers, timers, work) and arbitrary text.
commands = st.one_of(
    st.sampled_from(
        [
            "sleep infinity",
            "sleep 3600",
            "sleep 2147483647",
            "sleep",
            "/bin/sh -c python job.py; sleep 3600",
            "bash",
            "tini -- python serve.py",
            "/pause",
            "tail -f /dev/null",
            "crond -f",
            "timeout 600 python eval.py",
            "python train.py",
            "[python] <defunct>",
        ]
    ),
    st.text(max_size=24),
)
ppids = st.one_of(st.none(), st.integers(0, 64))
live_procs = st.builds(
    ProcessInfo, pid=st.integers(1, 1 << 22), state=live_states, command=commands, ppid=ppids
)
dead_procs = st.builds(ProcessInfo, pid=st.integers(1, 1 << 22), state=dead_states, command=commands)
any_procs = st.one_of(live_procs, dead_procs)
memories = st.one_of(
    st.none(),
    st.builds(GpuMemory, used_bytes=st.sampled_from([0, 1 << 20, 64 << 20, (64 << 20) + 1, 80 << 30])),
    st.builds(SignalFailure, reason=st.sampled_from(FailureReason)),
)
LIVE_WORK = {ProcessRole.WORK, ProcessRole.TIMER, ProcessRole.SESSION}

sizes = st.integers(min_value=0, max_value=1 << 40)
artifacts = st.one_of(
    st.just(ArtifactsNotDeclared()),
    st.builds(ArtifactSizes, start_bytes=sizes, end_bytes=sizes, completion_marker=st.booleans()),
    failures,
)
faults = st.one_of(
    st.builds(
        FaultEvidence,
        xid_events=st.lists(st.builds(XidEvent, code=st.integers(0, 160)), max_size=3).map(tuple),
        restarts=st.lists(
            st.builds(
                ContainerRestart,
                container=st.just("main"),
                reason=st.sampled_from(["OOMKilled", "Error", "Completed", "ContainerCannotRun"]),
                exit_code=st.one_of(st.none(), st.integers(0, 255)),
            ),
            max_size=3,
        ).map(tuple),
    ),
    failures,
)


@st.composite
def policies(draw: st.DrawFn, rules: list[Rule]) -> VerdictPolicy:
    window = draw(st.integers(1, 12))
    optional = draw(
        st.sets(st.sampled_from([Signal.PROCESSES, Signal.ARTIFACTS, Signal.FAULTS, Signal.MEMORY]))
    )
    return VerdictPolicy(
        rule=draw(st.sampled_from(rules)),
        window=window,
        zero_threshold=draw(st.sampled_from([0.0, 0.5, 1.0, 5.0])),
        hold_after=draw(st.one_of(st.none(), st.integers(window, 30))),
        required=frozenset({Signal.UTILIZATION, *optional}),
    )


@st.composite
def evidence_with_live_process(draw: st.DrawFn) -> Evidence:
    """Any evidence at all, as long as the process table holds at least one live process."""
    table = draw(st.lists(any_procs, max_size=5))
    table.insert(draw(st.integers(0, len(table))), draw(live_procs))
    return Evidence(
        utilization=draw(samples),
        processes=tuple(table),
        artifacts=draw(artifacts),
        faults=draw(faults),
        memory=draw(memories),
    )


PROCESS_AWARE = [Rule.GHOSTGPU, Rule.PAPER_MULTI_SIGNAL]


@settings(max_examples=400, deadline=None)
@given(evidence=evidence_with_live_process(), policy=policies(PROCESS_AWARE))
def test_live_work_is_never_finished_or_zombie(evidence: Evidence, policy: VerdictPolicy) -> None:
    """Work, a timer between periodic runs or an attached session: never reclaimable. Only a
    listing of wrappers and holders alone (`sh` + `sleep infinity`) may be read as no work."""
    v = decide(evidence, policy)
    assert isinstance(evidence.processes, tuple)
    roles = classify_listing(evidence.processes, ProcessPolicy())
    if policy.rule is Rule.PAPER_MULTI_SIGNAL or LIVE_WORK & set(roles):
        assert v.kind not in (VerdictKind.FINISHED_IDLE, VerdictKind.ZOMBIE_CRASHED)
        assert not v.reclaimable


@settings(max_examples=300, deadline=None)
@given(evidence=evidence_with_live_process(), policy=policies([Rule.GHOSTGPU]))
def test_memory_held_without_a_live_process_is_never_reclaimed(
    evidence: Evidence, policy: VerdictPolicy
) -> None:
    v = decide(evidence, policy)
    if isinstance(evidence.memory, GpuMemory) and evidence.memory.used_bytes > policy.memory_free_bytes:
        assert not v.reclaimable
    if v.reclaimable and Signal.MEMORY in policy.required:
        assert isinstance(evidence.memory, GpuMemory)


@settings(max_examples=300, deadline=None)
@given(
    evidence=st.builds(
        Evidence,
        utilization=samples,
        processes=st.one_of(st.none(), failures, st.lists(any_procs, max_size=4).map(tuple)),
        artifacts=artifacts,
        faults=faults,
        memory=memories,
    ),
    policy=policies(list(Rule)),
)
def test_verdict_is_deterministic_and_failures_in_the_window_are_never_reclaimed(
    evidence: Evidence, policy: VerdictPolicy
) -> None:
    v = decide(evidence, policy)
    assert decide(evidence, policy) == v
    assert decide(Evidence.model_validate_json(evidence.model_dump_json()), policy) == v
    window = evidence.utilization[-policy.effective_window :]
    if len(evidence.utilization) < policy.effective_window or any(
        isinstance(s, SignalFailure) for s in window
    ):
        assert v.kind is VerdictKind.UNKNOWN
    if v.reclaimable and policy.rule is Rule.GHOSTGPU:
        # Reclaimable under the default rule means: window zero, no live process, output not moving.
        assert isinstance(evidence.processes, tuple) or Signal.PROCESSES not in policy.required
        listed = evidence.processes if isinstance(evidence.processes, tuple) else ()
        roles = classify_listing(listed, policy.processes)
        assert not LIVE_WORK & set(roles), "only wrappers, holders and defunct processes may remain"
        assert not (isinstance(evidence.artifacts, ArtifactSizes) and evidence.artifacts.changed)
    assert v.reasons, "every verdict carries reasons"


@settings(max_examples=400, deadline=None)
@given(
    evidence=st.builds(
        Evidence,
        utilization=samples,
        processes=st.one_of(st.none(), failures, st.lists(any_procs, max_size=4).map(tuple)),
        artifacts=artifacts,
        faults=faults,
    ),
    policy=policies(list(Rule)),
)
def test_window_verdict_is_decides_answer_whenever_it_gives_one(
    evidence: Evidence, policy: VerdictPolicy
) -> None:
    """The controller skips assembling the evidence of workloads whose window settles the
    verdict (window_verdict): it must be exactly decide()'s verdict, whatever the other signals."""
    from ghostgpu.verdict import window_verdict

    settled = window_verdict(evidence.utilization, policy)
    full = decide(evidence, policy)
    window = evidence.utilization[-policy.effective_window :]
    all_zero = len(evidence.utilization) >= policy.effective_window and all(
        not isinstance(s, SignalFailure) and s <= policy.zero_threshold for s in window
    )
    if all_zero:
        assert settled is None  # only the whole evidence can tell
    else:
        assert settled == full and settled.model_dump() == full.model_dump()


scoped_procs = st.builds(
    ProcessInfo,
    pid=st.integers(1, 64),
    state=st.one_of(live_states, dead_states),
    command=commands,
    ppid=ppids,
    scope=st.sampled_from(["p/a", "p/b", "q/a"]),
)


@settings(max_examples=400, deadline=None)
@given(
    table=st.lists(scoped_procs, max_size=8).map(tuple),
    utilization=samples,
    policy=policies(PROCESS_AWARE),
    memory=memories,
    faults=faults,
)
def test_the_agents_counts_give_the_verdict_the_rows_give(
    table: tuple[ProcessInfo, ...], utilization, policy: VerdictPolicy, memory, faults
) -> None:
    """The node agent counts each container's roles on the node; the controller adds the counts of
    a workload's containers. That sum must decide exactly as the rows of every container would."""
    per_scope = [tuple(p for p in table if p.scope == s) for s in sorted({p.scope for p in table})]
    summed = sum((count_roles(rows, policy.processes) for rows in per_scope), ProcessCounts())
    rows = decide(Evidence(utilization=utilization, processes=table, memory=memory, faults=faults), policy)
    counts = decide(Evidence(utilization=utilization, processes=summed, memory=memory, faults=faults), policy)
    assert (counts.kind, counts.reasons) == (rows.kind, rows.reasons)
    assert summed.total == len(table)
