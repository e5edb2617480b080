"""The stop of an idle session goes through the risk gate typed IDLE_HELD (planner.plan_idle_stop):
its own threshold, the same escalation as every type, and never in shadow mode."""

from __future__ import annotations

from test_controller_reconciler import IS_GPU, deployment, pod_for

from ghostgpu.autonomy import AutonomyConfig
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.inventory import workload_from
from ghostgpu.controller.judge.planner import plan_idle_stop

ENFORCE = ControllerConfig(mode="enforce")


def test_a_small_notebook_deployment_is_stopped_under_the_idle_held_threshold() -> None:
    wl = workload_from("Deployment", deployment("nb"), IS_GPU)
    p = plan_idle_stop(wl, ENFORCE, team="research")
    assert p.action == "scale-to-zero"
    assert p.decision is not None and p.decision.tau_source == "tau_by_type[idle_held]"
    assert p.decision.verdict == "IDLE_HELD"


def test_its_threshold_is_its_own_and_above_it_a_person_decides() -> None:
    wl = workload_from("Deployment", deployment("nb"), IS_GPU)
    strict = AutonomyConfig(tau=0.9, tau_by_type={"idle_held": 0.01})
    p = plan_idle_stop(wl, ENFORCE, team="research", autonomy=strict)
    assert p.action == "escalate"  # escalated like any other type (Event, annotation, webhook)
    assert p.decision is not None and p.decision.tau == 0.01


def test_a_bare_pod_is_escalated_by_the_default_threshold() -> None:
    pod = pod_for("kernel")
    pod["metadata"].pop("ownerReferences")
    wl = workload_from("Pod", pod, IS_GPU)
    p = plan_idle_stop(wl, ENFORCE, team="research")
    assert p.action == "escalate"  # nothing would recreate it: the calibrated idle_held tau says so


def test_shadow_mode_touches_nothing() -> None:
    wl = workload_from("Deployment", deployment("nb"), IS_GPU)
    assert plan_idle_stop(wl, ControllerConfig(), team="research").action == "would-reclaim"
