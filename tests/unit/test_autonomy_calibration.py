"""Calibration (ghostgpu.autonomy.calibrate) on incident sets whose answer is derived by hand."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghostgpu.autonomy import (
    CalibrationSettings,
    ScoredIncident,
    calibrate,
    choose,
    pareto_frontier,
    sweep,
    tau_grid,
)


def ev(t: str, s: float, dangerous: bool = False) -> ScoredIncident:
    return ScoredIncident(incident_type=t, score=s, dangerous=dangerous)


# Hand-made set, 8 events, 2 dangerous (D):
#   type a: 0.10, 0.20, 0.30 D, 0.40
#   type b: 0.05, 0.40, 0.50 D, 0.70
HAND = [ev("a", 0.10), ev("a", 0.20), ev("a", 0.30, True), ev("a", 0.40),
        ev("b", 0.05), ev("b", 0.40), ev("b", 0.50, True), ev("b", 0.70)]  # fmt: skip


def mttr(autonomous: int, events: int, fast: float = 40.0, slow: float = 1200.0) -> float:
    return 1 - (autonomous * fast + (events - autonomous) * slow) / (events * slow)


def test_hand_set_ceiling_zero() -> None:
    # Ceiling 0: no dangerous event may run alone, so tau <= 0.30 (the lowest dangerous score).
    # Alone then: 0.05, 0.10, 0.20 -> 3 of 8. The lowest grid tau that frees all three is the first
    # one above 0.20: 0.225. MTTR reduction = 1 - (3*40 + 5*1200) / (8*1200) = 0.3625.
    r = calibrate(HAND, CalibrationSettings(ceiling=0.0))
    g = r.global_threshold
    assert g.tau == 0.225 and g.autonomous == 3 and g.dangerous_autonomous == 0
    assert g.mttr_reduction == pytest.approx(mttr(3, 8)) == pytest.approx(0.3625)
    # Per type, same ceiling: a -> 0.10, 0.20 alone (tau 0.225); b -> 0.05, 0.40 alone (tau 0.425,
    # first grid value above 0.40, still <= 0.50). 4 of 8: better than the global tau.
    per = {t.scope: t for t in r.per_type}
    assert per["a"].tau == 0.225 and per["a"].autonomous == 2
    assert per["b"].tau == 0.425 and per["b"].autonomous == 2
    assert r.per_type_overall.autonomous == 4 and r.per_type_overall.dangerous_autonomous == 0
    assert r.per_type_overall.mttr_reduction == pytest.approx(mttr(4, 8))
    assert per["b"].mttr_reduction == pytest.approx(mttr(2, 4))
    assert r.per_type_mean_mttr_reduction == pytest.approx(mttr(2, 4))


def test_hand_set_ceiling_half() -> None:
    # Ceiling 50 % of 2 dangerous -> at most 1 dangerous event alone. Global: tau <= 0.50 keeps
    # the 0.50 one out; alone: 0.05 0.10 0.20 0.30D 0.40 0.40 = 6, first grid tau above 0.40 is
    # 0.425; catastrophic rate 1/2.
    r = calibrate(HAND, CalibrationSettings(ceiling=0.5))
    g = r.global_threshold
    assert (g.tau, g.autonomous, g.dangerous_autonomous, g.catastrophic_rate) == (0.425, 6, 1, 0.5)
    # Per type with the same pooled budget of one dangerous event: either all of a (tau 0.425) and
    # b up to 0.40 (tau 0.425), or a up to 0.20 (0.225) and all of b (0.725): 6 alone either way,
    # one dangerous either way; the tie goes to the lower taus (0.425 + 0.425 < 0.225 + 0.725).
    per = {t.scope: t.tau for t in r.per_type}
    assert per == {"a": 0.425, "b": 0.425}
    assert r.per_type_overall.autonomous == 6


def test_each_type_keeps_the_ceiling_on_its_own() -> None:
    # Ceiling 50 %, "each": a has 1 dangerous event (0.30) -> 1/1 = 100 % > 50 %, so a stops at
    # 0.225; b likewise stops at 0.425. That is the ceiling-0 answer: 4 alone, fewer than the pooled
    # choice (6, test above) and fewer than the global tau (6): "each" is stricter and can lose.
    r = calibrate(HAND, CalibrationSettings(ceiling=0.5, per_type_ceiling="each"))
    assert {t.scope: t.tau for t in r.per_type} == {"a": 0.225, "b": 0.425}
    assert all(t.catastrophic_rate <= 0.5 for t in r.per_type)
    assert r.per_type_overall.autonomous == 4 < r.global_threshold.autonomous


def test_latencies_are_configurable() -> None:
    s = CalibrationSettings(ceiling=0.0, autonomous_latency_seconds=60, escalation_latency_seconds=600)
    g = calibrate(HAND, s).global_threshold
    assert g.mttr_reduction == pytest.approx(mttr(3, 8, 60, 600))


def test_sweep_ends_are_always_escalate_and_always_autonomous() -> None:
    s = CalibrationSettings()
    grid = tau_grid(s, max_score=0.70)
    pts = sweep(HAND, grid, s)
    assert pts[0].tau == 0 and pts[0].autonomous == 0 and pts[0].mttr_reduction == 0
    assert pts[-1].autonomous == 8 and pts[-1].catastrophic_rate == 1.0
    assert pts[-1].mttr_reduction == pytest.approx(1 - 40 / 1200)
    f = pareto_frontier(pts)
    assert (f[0].tau, f[0].catastrophic_rate, f[0].mttr_reduction) == (0.0, 0.0, 0.0)
    assert (f[-1].catastrophic_rate, f[-1].mttr_reduction) == (1.0, pytest.approx(1 - 40 / 1200))
    # every frontier point is undominated on both objectives by any sweep point
    for p in f:
        assert not any(
            q.catastrophic_rate < p.catastrophic_rate and q.mttr_reduction > p.mttr_reduction for q in pts
        )


def test_grid_extends_past_scores_above_one() -> None:
    grid = tau_grid(CalibrationSettings(), max_score=1.3)
    assert grid[0] == 0.0 and grid[-1] > 1.3 and grid[-2] <= 1.3
    assert len(tau_grid(CalibrationSettings(), 0.5)) == 41  # 0.000 .. 1.000 step 0.025


def test_no_dangerous_events_means_everything_alone() -> None:
    r = calibrate([ev("x", 0.2), ev("x", 0.9)], CalibrationSettings(ceiling=0.0))
    assert r.global_threshold.autonomous == 2 and r.global_threshold.catastrophic_rate == 0.0
    assert r.global_threshold.tau == 0.925


def test_empty_set_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        calibrate([])


scores = st.integers(min_value=0, max_value=40).map(lambda i: i / 40)
incidents = st.lists(
    st.builds(ev, st.sampled_from(["node_pressure", "pvc_failure", "oom", "x"]), scores, st.booleans()),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(incidents, st.sampled_from([0.0, 0.02, 0.1, 0.25, 0.5]))
def test_per_type_never_worse_than_global_and_both_respect_the_ceiling(events, ceiling) -> None:
    s = CalibrationSettings(ceiling=ceiling)
    r = calibrate(events, s)
    g, p = r.global_threshold, r.per_type_overall
    assert p.mttr_reduction >= g.mttr_reduction - 1e-12
    for t in (g, p):
        assert t.dangerous == 0 or t.dangerous_autonomous <= ceiling * t.dangerous + 1e-9
    # the global choice is the best feasible point of the sweep, and the lowest tau among equals
    best = choose(r.global_sweep, ceiling)
    feasible = [
        q for q in r.global_sweep if q.dangerous == 0 or q.dangerous_autonomous <= ceiling * q.dangerous
    ]
    assert g.autonomous == max(q.autonomous for q in feasible) == best.autonomous
    assert g.tau == min(q.tau for q in feasible if q.autonomous == g.autonomous)
    # per-type taus reproduce the per-type counts
    for t in r.per_type:
        mine = [e for e in events if e.incident_type == t.scope]
        assert t.autonomous == sum(e.score < t.tau for e in mine)
    f = r.frontier
    assert (f[0].catastrophic_rate, f[0].mttr_reduction) == (0.0, 0.0)
    assert f[-1].mttr_reduction == pytest.approx(1 - 40 / 1200)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.builds(ev, st.sampled_from(["a", "b", "c"]), scores, st.booleans()), min_size=1, max_size=14),
    st.sampled_from([0.0, 0.1, 0.2, 0.5]),
)
def test_per_type_choice_is_optimal_by_brute_force(events, ceiling) -> None:
    # Every combination of effective per-type taus (one above each distinct score, plus 0).
    r = calibrate(events, CalibrationSettings(ceiling=ceiling))
    types = sorted({e.incident_type for e in events})
    dangerous = sum(e.dangerous for e in events)

    def options(t: str) -> list[tuple[int, int]]:
        mine = [e for e in events if e.incident_type == t]
        cuts = [0.0, *sorted({e.score + 1e-9 for e in mine})]
        return [
            (sum(e.score < c for e in mine), sum(e.dangerous and e.score < c for e in mine)) for c in cuts
        ]

    best = 0
    for combo in itertools.product(*(options(t) for t in types)):
        alone, d_alone = sum(c[0] for c in combo), sum(c[1] for c in combo)
        if dangerous == 0 or d_alone <= ceiling * dangerous + 1e-9:
            best = max(best, alone)
    assert r.per_type_overall.autonomous == best
