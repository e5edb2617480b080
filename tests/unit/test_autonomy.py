"""The risk score and the gate (ghostgpu.autonomy: score, decide, decide_action)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ghostgpu.autonomy import (
    ActionClass,
    ActionClassSpec,
    AutonomyConfig,
    RiskWeights,
    WorkloadFacts,
    decide,
    decide_action,
    manifest_lines,
    normalise_type,
    score,
)

CFG = AutonomyConfig()
W = CFG.weights
BASE = WorkloadFacts(kind="Deployment", name="nb", namespace="team-a", gpus=0, replicas=0, manifest_lines=0)


def _terms(action: str, facts: WorkloadFacts, cfg: AutonomyConfig = CFG) -> dict[str, float]:
    return {t.name: t.contribution for t in score(action, facts, cfg).terms}


def test_bare_action_scores_its_weighted_base_risk() -> None:
    for action, spec in CFG.action_classes.items():
        expected = spec.base_risk * W.base_risk
        expected += W.admission_policy * spec.touches_admission_policy + W.cross_tenant * spec.crosses_tenant
        assert score(action, BASE).score == pytest.approx(expected, abs=1e-6), action


def test_reversibility_orders_the_default_table() -> None:
    s = {a: score(a, BASE).score for a in ActionClass}
    assert s["annotate"] == s["event"] == s["notify"] == 0.0
    assert s["scale_to_zero"] < s["restart_pod"] < s["evict_pod"] < s["delete_pvc_pod"]
    assert s["evict_pod"] < s["preempt_other_tenant"]


def test_blast_radius_terms_are_normalised_and_saturate() -> None:
    half = BASE.model_copy(update={"gpus": 4, "replicas": 4, "volumes": 2, "manifest_lines": 100})
    t = _terms("scale_to_zero", half)
    assert t["gpus"] == pytest.approx(0.5 * W.gpus)
    assert t["replicas"] == pytest.approx(0.5 * W.replicas)
    assert t["volumes"] == pytest.approx(0.5 * W.volumes)
    assert t["manifest_lines"] == pytest.approx(0.5 * W.manifest_lines)
    full = BASE.model_copy(update={"gpus": 8, "replicas": 8, "volumes": 4, "manifest_lines": 200})
    huge = BASE.model_copy(update={"gpus": 512, "replicas": 99, "volumes": 40, "manifest_lines": 5000})
    assert score("scale_to_zero", full).score == score("scale_to_zero", huge).score
    assert score("scale_to_zero", half).score < score("scale_to_zero", full).score


def test_more_gpus_never_lowers_the_score() -> None:
    scores = [score("evict_pod", BASE.model_copy(update={"gpus": g})).score for g in range(0, 12)]
    assert scores == sorted(scores) and scores[0] < scores[-1]


def test_observational_actions_ignore_blast_radius_and_tenants() -> None:
    big = BASE.model_copy(
        update={"gpus": 64, "replicas": 8, "volumes": 4, "manifest_lines": 900, "action_tenant": "team-b"}
    )
    for action in ("annotate", "event", "notify"):
        assert score(action, big).score == 0.0


def test_tenant_boundary_and_admission_policy_facts_add_their_weight() -> None:
    same = BASE.model_copy(update={"workload_tenant": "a", "action_tenant": "a"})
    other = BASE.model_copy(update={"workload_tenant": "a", "action_tenant": "b"})
    assert score("restart_pod", other).score - score("restart_pod", same).score == pytest.approx(
        W.cross_tenant
    )
    # preempt always crosses: the facts cannot add it twice
    assert score("preempt_other_tenant", other).score == score("preempt_other_tenant", same).score
    policy = BASE.model_copy(update={"kind": "ClusterPolicy", "namespace": None, "admission_policy": True})
    assert score("scale_to_zero", policy).score - score("scale_to_zero", BASE).score == pytest.approx(
        W.admission_policy
    )
    assert score("disable_admission_policy", policy).score == score("disable_admission_policy", BASE).score


def test_default_weights_keep_scores_in_unit_interval() -> None:
    worst = WorkloadFacts(
        gpus=1e6, replicas=10**6, volumes=10**6, manifest_lines=10**6, workload_tenant="a", action_tenant="b",
        admission_policy=True,
    )  # fmt: skip
    assert sum(W.model_dump().values()) == pytest.approx(1.0)
    assert 0.0 <= max(score(a, worst).score for a in ActionClass) <= 1.0


def test_decide_is_strictly_below_tau() -> None:
    risk = score("scale_to_zero", BASE)
    at = AutonomyConfig(tau=risk.score)
    above = AutonomyConfig(tau=risk.score + 0.001)
    assert decide(risk, None, at).escalate  # score == tau escalates
    d = decide(risk, None, above)
    assert d.autonomous and d.tau_source == "tau (global)" and "act alone" in d.reason
    assert decide(risk, None, AutonomyConfig(tau=0.0)).escalate  # tau = 0 is always-escalate


def test_per_type_tau_overrides_global_with_normalised_keys() -> None:
    cfg = AutonomyConfig(tau=0.9, tau_by_type={"FINISHED_IDLE": 0.01, "Node pressure": 0.5})
    assert set(cfg.tau_by_type) == {"finished_idle", "node_pressure"}
    d = decide_action("FINISHED_IDLE", "scale_to_zero", BASE, cfg)
    assert d.escalate and d.tau == 0.01 and d.tau_source == "tau_by_type[finished_idle]"
    z = decide_action("ZOMBIE_CRASHED", "scale_to_zero", BASE, cfg)
    assert z.autonomous and z.tau == 0.9  # falls back to the global tau
    assert cfg.threshold("node-pressure") == (0.5, "tau_by_type[node_pressure]")
    with pytest.raises(ValidationError, match="duplicates"):
        AutonomyConfig(tau_by_type={"OOM": 0.1, "oom": 0.2})


def test_non_reclaimable_verdicts_never_act_alone_except_observing() -> None:
    cfg = AutonomyConfig(tau=1.0)
    for verdict in ("UNKNOWN", "ACTIVE", "IDLE_HELD"):
        d = decide_action(verdict, "scale_to_zero", BASE, cfg)
        assert d.escalate and "not in autonomous_verdicts" in d.reason
        assert decide_action(verdict, "annotate", BASE, cfg).autonomous
    assert decide_action("FINISHED_IDLE", "scale_to_zero", BASE, cfg).autonomous


def test_decision_carries_the_breakdown() -> None:
    facts = BASE.model_copy(update={"gpus": 2, "replicas": 1, "manifest_lines": 60})
    d = decide_action("FINISHED_IDLE", "scale_to_zero", facts)
    assert d.score == pytest.approx(sum(t.contribution for t in d.breakdown.terms), abs=1e-5)
    assert {t.name for t in d.breakdown.terms} == {
        "base_risk", "manifest_lines", "gpus", "replicas", "volumes", "admission_policy", "cross_tenant"
    }  # fmt: skip
    assert d.breakdown.explain().startswith(f"{d.score:.3f} = ")
    assert d.model_dump()["autonomous"] is d.autonomous  # serialised for evidence/annotations
    assert d.summary().startswith("act alone: scale_to_zero (score ")
    e = decide_action("FINISHED_IDLE", "delete_pvc_pod", facts)
    assert e.escalate and e.summary().startswith("escalate: delete_pvc_pod") and ">= tau" in e.summary()


def test_config_errors_are_clear() -> None:
    with pytest.raises(ValueError, match=r"unknown action class 'nuke'.*scale_to_zero"):
        score("nuke", BASE)
    with pytest.raises(ValidationError):
        AutonomyConfig(weights=RiskWeights(base_risk=-1))
    with pytest.raises(ValidationError, match="at least one weight"):
        RiskWeights(**dict.fromkeys(RiskWeights.model_fields, 0.0))
    with pytest.raises(ValidationError):
        AutonomyConfig(action_classes={"scale_to_zero": {"base_risk": 1.5}})
    with pytest.raises(ValueError, match="non-empty"):
        normalise_type("  ")


def test_partial_action_table_overrides_one_row_and_keeps_the_rest() -> None:
    cfg = AutonomyConfig.model_validate(
        {"action_classes": {"scale_to_zero": {"base_risk": 0.9}, "drain_node": {"base_risk": 0.6}}}
    )
    assert cfg.spec("scale_to_zero").base_risk == 0.9
    assert cfg.spec("drain_node") == ActionClassSpec(base_risk=0.6)
    assert cfg.spec("evict_pod") == AutonomyConfig().spec("evict_pod")
    assert score("scale_to_zero", BASE, cfg).score > score("scale_to_zero", BASE).score


def test_manifest_lines_ignores_what_the_api_server_adds() -> None:
    written = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "nb", "namespace": "a", "annotations": {"ghostgpu.io/artifacts": "s3://b/p"}},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }
    live = {
        **written,
        "metadata": {
            **written["metadata"],
            "uid": "u",
            "resourceVersion": "42",
            "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:replicas": {}}}}],
            "annotations": {
                **written["metadata"]["annotations"],
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
            },
        },
        "status": {"replicas": 1, "conditions": [{"type": "Available", "status": "True"}]},
    }
    assert manifest_lines(live) == manifest_lines(written) > 5
    bigger = {**written, "spec": {**written["spec"], "strategy": {"type": "Recreate"}}}
    assert manifest_lines(bigger) == manifest_lines(written) + 2
